"""The ``slurm`` launcher: an sbatch script that starts Ray on the job's nodes and runs the
recipe on the first (docs/cluster.md, "Launching a job")."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_launchers(register):
    register(
        "slurm",
        "plugrl_slurm.launcher:SlurmLauncher",
        config="plugrl_slurm.launcher:SlurmConfig",
    )
