"""An sbatch script from a :class:`LaunchJob`: one task per node, each node's Ray started by
an ``srun`` step that lasts the job, and the run on the first node."""

from __future__ import annotations

import shlex
from typing import ClassVar

import attrs

from plugrl.api import RecipeError, option, positive
from plugrl.api.launch import Launcher, LaunchJob


@attrs.define(kw_only=True)
class SlurmConfig:
    """``launch.launcher_args`` of the ``slurm`` launcher: the job's ``#SBATCH`` options."""

    partition: str | None = option(None, "Partition (sbatch --partition).")
    account: str | None = option(None, "Account charged (sbatch --account).")
    time: str | None = option(None, "Time limit (sbatch --time), as 04:00:00 or 2-00:00:00.")
    qos: str | None = option(None, "Quality of service (sbatch --qos).")
    cpus_per_node: int | None = option(
        None, "CPUs of each node's task (sbatch --cpus-per-task).", validator=positive
    )
    memory: str | None = option(None, "Memory of each node (sbatch --mem), as 200G.")
    exclusive: bool = option(True, "Nodes not shared with other jobs (sbatch --exclusive).")
    sbatch_options: list[str] = option(
        factory=list,
        help="More #SBATCH options, each as sbatch takes it (--constraint=h100).",
    )


class SlurmLauncher(Launcher):
    """An sbatch script; submitted with ``sbatch``."""

    name: ClassVar[str] = "slurm"
    file_suffix: ClassVar[str] = ".sbatch"

    def __init__(self, config: SlurmConfig | None = None) -> None:
        super().__init__(config or SlurmConfig())

    def submit_command(self, path: str) -> list[str]:
        return ["sbatch", path]

    def sbatch_options(self, job: LaunchJob) -> list[str]:
        config: SlurmConfig = self.config
        options = [
            f"--job-name={job.name}",
            f"--nodes={job.nodes}",
            "--ntasks-per-node=1",
        ]
        if job.ray_resource is not None:
            if job.slurm_gres is None:
                raise RecipeError(
                    f"device {job.device!r} names no Slurm generic resource (its plugin sets "
                    "none); ask for its devices with launch.launcher_args.sbatch_options "
                    "(--gres=NAME:COUNT)",
                    key="device.name",
                )
            options.append(f"--gres={job.slurm_gres}:{job.devices_per_node}")
        for flag, value in (
            ("--cpus-per-task", config.cpus_per_node),
            ("--mem", config.memory),
            ("--partition", config.partition),
            ("--account", config.account),
            ("--time", config.time),
            ("--qos", config.qos),
            ("--chdir", job.workdir),
        ):
            if value is not None:
                options.append(f"{flag}={value}")
        if config.exclusive:
            options.append("--exclusive")
        options.append(f"--output={job.name}-%j.out")
        for extra in config.sbatch_options:
            if not extra.startswith("-") or any(c in extra for c in "\n\r"):
                raise RecipeError(
                    f"{extra!r} is not an sbatch option: write it as sbatch takes it "
                    "(--constraint=h100)",
                    key="launch.launcher_args.sbatch_options",
                )
            options.append(extra)
        return options

    def render(self, job: LaunchJob) -> str:
        head_ip = '"$head_ip"'
        where = (
            f"check launch.network_interface ({job.network_interface})"
            if job.network_interface
            else "set launch.network_interface"
        )
        step = "srun --nodes=1 --ntasks=1 --overlap"
        if job.image:
            # pyxis (NVIDIA's container plugin of srun); the working folder is mounted in
            mount = job.workdir or "$PWD"
            step += f" --container-image={shlex.quote(job.image)}"
            step += f' --container-mounts="{mount}:{mount}" --container-workdir="{mount}"'
        lines = [
            "#!/bin/bash",
            f"# {job.name}: Ray on {job.nodes} node(s) of {job.devices_per_node} "
            f"{job.device} device(s), then plugrl run on the first; written by plugrl launch",
            *(f"#SBATCH {option}" for option in self.sbatch_options(job)),
            "set -euo pipefail",
            "",
        ]
        if job.venv:
            lines += [f"source {shlex.quote(job.venv.rstrip('/') + '/bin/activate')}"]
        if job.env:
            lines += ["# every srun step inherits these: each node's Ray, its workers, the run"]
            lines += [job.exports()]
        lines += ["export RAY_USAGE_STATS_ENABLED=0"]
        if job.ray_token:
            lines += [
                "# Ray's token authentication: one token for this job's nodes and its run",
                "export RAY_AUTH_MODE=token",
                f"RAY_AUTH_TOKEN=$({job.new_token()})",
                "export RAY_AUTH_TOKEN",
            ]
        lines += [
            "",
            "# the recipe the run reads, as plugrl launch read it",
            job.write_recipe(),
            "",
            'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            "head=${nodes[0]}",
            f'head_ip=$({step} -w "$head" bash -c {shlex.quote(job.node_ip())})',
            f'[ -n "$head_ip" ] || {{ echo "no IPv4 address on $head: {where}" >&2; exit 1; }}',
            'echo "Ray head: $head ($head_ip)"',
            "# the Ray steps end with the job; stop them when the run ends first",
            "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
            f'{step} -w "$head" {job.head_start(head_ip)} &',
            job.wait_for_head(head_ip),
            'for node in "${nodes[@]:1}"; do',
            f'    {step} -w "$node" {job.worker_start(head_ip)} &',
            "done",
            f'{step} -w "$head" {job.driver(f"{head_ip}:{job.ray_port}")}',
            "",
        ]
        return "\n".join(lines)
