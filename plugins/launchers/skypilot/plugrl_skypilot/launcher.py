"""A SkyPilot task YAML from a :class:`LaunchJob`: ``num_nodes`` nodes with the node's
accelerators; ``run`` starts Ray on each (the node of rank 0 is the head) and runs the recipe
on the head. SkyPilot's own Ray uses port 6380, so the job's keeps ``launch.ray_port``."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, ClassVar

import attrs
import yaml

from plugrl.api import RecipeError, option, positive
from plugrl.api.launch import Launcher, LaunchJob, yaml_documents


@attrs.define(kw_only=True)
class SkyPilotConfig:
    """``launch.launcher_args`` of the ``skypilot`` launcher: the task's ``resources`` and
    storage."""

    accelerators: str | None = option(
        None,
        "Accelerator type of each node (H100, A100-80GB); the count is the node's devices. "
        "Needed for a device that is not the CPU.",
    )
    infra: str | None = option(
        None, "Where SkyPilot looks for nodes: aws, gcp/us-central1, k8s, ... Unset: anywhere."
    )
    cpus: str | None = option(None, "vCPUs of each node (32, or 32+ for at least 32).")
    memory: str | None = option(None, "Memory of each node in GiB (256, or 256+).")
    disk_size: int | None = option(None, "Disk of each node in GiB.", validator=positive)
    use_spot: bool = option(False, "Spot (preemptible) nodes.")
    storage: str | None = option(
        None,
        "A bucket (s3://..., gs://...) mounted at launch.workdir on every node, when the "
        "nodes have no shared file system there: the model, the data and the run folder.",
    )
    setup: str | None = option(
        None, "Commands each node runs once before the job (install plugrl, fetch a model)."
    )


class SkyPilotLauncher(Launcher):
    """A SkyPilot task; submitted with ``sky launch``."""

    name: ClassVar[str] = "skypilot"
    file_suffix: ClassVar[str] = ".sky.yaml"

    def __init__(self, config: SkyPilotConfig | None = None) -> None:
        super().__init__(config or SkyPilotConfig())

    def submit_command(self, path: str) -> list[str]:
        # the cluster takes the task's name (the job's), so `sky logs NAME` and `sky down NAME`
        # find it, and a second launch of the same job reuses its nodes
        name = yaml.safe_load(Path(path).read_text(encoding="utf-8"))["name"]
        return ["sky", "launch", "--yes", "--cluster", name, path]

    def render(self, job: LaunchJob) -> str:
        return yaml_documents(self.task(job))

    def task(self, job: LaunchJob) -> dict[str, Any]:
        config: SkyPilotConfig = self.config
        if not job.workdir:
            raise RecipeError(
                "SkyPilot's nodes share the run's files only through storage mounted at the "
                "same path on each: set that path (and launch.launcher_args.storage to mount "
                "a bucket there)",
                key="launch.workdir",
            )
        resources: dict[str, Any] = {}
        if config.infra:
            resources["infra"] = config.infra
        if job.ray_resource is not None:
            if not config.accelerators:
                raise RecipeError(
                    f"name the accelerator type of each node's {job.devices_per_node} "
                    f"{job.device} devices, as SkyPilot does (H100, A100-80GB)",
                    key="launch.launcher_args.accelerators",
                )
            resources["accelerators"] = f"{config.accelerators}:{job.devices_per_node}"
        for key, value in (
            ("cpus", config.cpus),
            ("memory", config.memory),
            ("disk_size", config.disk_size),
        ):
            if value is not None:
                resources[key] = value
        if config.use_spot:
            resources["use_spot"] = True
        if job.image:
            resources["image_id"] = f"docker:{job.image}"
        task: dict[str, Any] = {"name": job.name, "num_nodes": job.nodes, "resources": resources}
        if job.env:
            task["envs"] = dict(job.env)
        if config.storage:
            task["file_mounts"] = {job.workdir: {"source": config.storage, "mode": "MOUNT"}}
        if config.setup:
            task["setup"] = config.setup
        task["run"] = self.run_script(job)
        return task

    def run_script(self, job: LaunchJob) -> str:
        head_ip = '"$head_ip"'
        lines = ["set -euo pipefail", "export RAY_USAGE_STATS_ENABLED=0"]
        if job.venv:
            lines.append(f"source {shlex.quote(job.venv.rstrip('/') + '/bin/activate')}")
        token_file = shlex.quote(f"launch/{job.name}.ray-token")
        head = [job.head_start(head_ip, block=False)]
        worker = [job.worker_start(head_ip, block=False)]
        if job.ray_token:
            # one token for the job's nodes and its run: the head writes it to the shared
            # folder before its Ray starts, the workers read it once the head answers
            share = ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN=$(cat {token_file})"]
            head = [
                "mkdir -p launch",
                f"(umask 077 && {job.new_token()} > {token_file})",
                *share,
                *head,
            ]
            worker = [*share, *worker]
        lines += [
            f"cd {shlex.quote(job.workdir or '.')}",
            'head_ip=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then',
            *(f"  {line}" for line in head),
            # not indented: the here-document's last line must start the line
            job.write_recipe(),
            f"  {job.driver(f'{head_ip}:{job.ray_port}')}",
            "else",
            f"  {job.wait_for_head(head_ip)}",
            # a worker's run ends once its Ray has joined; its Ray lives on with the cluster
            *(f"  {line}" for line in worker),
            "fi",
        ]
        return "\n".join(lines) + "\n"
