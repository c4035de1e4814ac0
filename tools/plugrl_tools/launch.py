"""``plugrl launch``: a recipe's job file for a scheduler that brings up a Ray cluster (Slurm,
KubeRay, SkyPilot, or a launcher a plugin registers), and its submission; and the wait of
``plugrl run --wait-for-nodes`` with which a launched job's run starts."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from plugrl.config.structuring import structure
from plugrl.errors import PlugrlError, RecipeError
from plugrl.parts.launcher import RECIPE_END, Launcher, LaunchJob
from plugrl.plugin.manager import PluginManager
from plugrl.plugin.registry import import_object
from plugrl.recipe import (
    Recipe,
    apply_overrides,
    build_recipe,
    compose_file,
    find_recipe,
    normalize_shorthand,
)

MAX_NAME = 52
"""Longest job name: Kubernetes names are at most 63 characters, and KubeRay adds suffixes
(``-raycluster-xxxxx``, ``-head-xxxxx``) to the RayJob's."""


@attrs.frozen
class PreparedLaunch:
    """A launcher with the job it writes."""

    launcher: Launcher
    job: LaunchJob
    recipe: Recipe

    @property
    def default_file(self) -> str:
        return f"{self.job.name}{self.launcher.file_suffix}"


def job_name(experiment_name: str) -> str:
    """``trainer.experiment_name`` as a name every scheduler takes: lowercase letters, digits
    and ``-``, starting with a letter."""
    name = re.sub(r"[^a-z0-9]+", "-", experiment_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"plugrl-{name}".rstrip("-")
    return name[:MAX_NAME].rstrip("-")


def prepare_launch(
    recipe: str, overrides: Sequence[str], launcher: str | None, plugins: PluginManager
) -> PreparedLaunch:
    """Read ``recipe`` with ``overrides`` (``launcher``, when given, sets ``launch.launcher``),
    check it as a run on Ray would be checked (its parts registered, not necessarily runnable
    on this machine), and build the chosen launcher and the job it writes."""
    raw = normalize_shorthand(compose_file(find_recipe(recipe)))
    if launcher is not None:
        overrides = [*overrides, f"launch.launcher={launcher}"]
    raw = apply_overrides(raw, overrides)
    checked = build_recipe(apply_overrides(raw, ["cluster.mode=ray"]), plugins, runnable_here=False)
    launch = checked.launch
    registry = plugins.registry("launchers")
    if launch.launcher is None:
        raise RecipeError(
            "plugrl launch needs a launcher: add --slurm, --kuberay, --skypilot or --launcher "
            f"NAME (registered: {', '.join(registry.names()) or 'none'})",
            key="launch.launcher",
        )
    entry = registry.get(launch.launcher)
    config_cls = entry.load_config()
    config = (
        structure(config_cls, dict(launch.launcher_args), "launch.launcher_args")
        if config_cls is not None
        else None
    )
    job = make_job(checked, raw, plugins)
    return PreparedLaunch(entry.load()(config), job, checked)


def make_job(recipe: Recipe, raw: dict[str, Any], plugins: PluginManager) -> LaunchJob:
    """The :class:`LaunchJob` of a checked ``recipe``; ``raw`` is the recipe as composed (with
    the overrides), which the job runs: its relative paths start at the job's working folder,
    not at this machine's."""
    launch = recipe.launch
    device_name = recipe.device.name
    if device_name == "auto":
        raise RecipeError(
            "'auto' is detected where the run starts, and plugrl launch writes the job for "
            "other machines: set the cluster's device kind (registered: "
            f"{', '.join(plugins.registry('devices').names())})",
            key="device.name",
        )
    entry = plugins.registry("devices").get(device_name)
    # the class only, read for its attributes: the machine that writes the job need not have
    # the device's libraries (torch_npu on a laptop), so its availability is not checked
    device = import_object(entry.target) if isinstance(entry.target, str) else entry.target
    trainer, rollout = recipe.trainer, recipe.rollout
    own_engines = not rollout.colocate
    nodes = launch.nodes or trainer.nnodes + (rollout.nnodes if own_engines else 0)
    devices = launch.devices_per_node or max(
        trainer.n_gpus_per_node, rollout.n_gpus_per_node if own_engines else 0
    )
    env = dict(device.network_env(launch.network_interface)) if launch.network_interface else {}
    env.update(launch.env)
    name = job_name(trainer.experiment_name)
    run_recipe = {key: value for key, value in raw.items() if key != "launch"}
    text = yaml.safe_dump(run_recipe, sort_keys=False, allow_unicode=True)
    if RECIPE_END in text.splitlines():
        raise RecipeError(f"the recipe holds a line {RECIPE_END!r}, which ends it in the job file")
    return LaunchJob(
        name=name,
        nodes=nodes,
        devices_per_node=devices,
        device=device_name,
        ray_resource=device.ray_resource,
        kubernetes_resource=device.kubernetes_resource,
        slurm_gres=device.slurm_gres,
        env=env,
        network_interface=launch.network_interface,
        workdir=launch.workdir,
        venv=launch.venv,
        image=launch.image,
        recipe_text=text,
        recipe_file=f"launch/{name}.yaml",
        ray_port=launch.ray_port,
        ray_args=tuple(launch.ray_args),
        node_timeout_s=launch.node_timeout_s,
    )


def write_job(prepared: PreparedLaunch, path: Path) -> None:
    text = prepared.launcher.render(prepared.job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if text.startswith("#!"):
        path.chmod(0o755)


def submit(prepared: PreparedLaunch, path: Path) -> str:
    """Run the launcher's submit command on ``path``; its output. A one-line error when the
    command is not installed here or fails."""
    command = prepared.launcher.submit_command(str(path))
    program = command[0]
    if shutil.which(program) is None:
        raise PlugrlError(
            f"{program} is not on PATH: run plugrl launch where {prepared.launcher.name}'s "
            f"commands are installed, or add --dry-run and submit {path} yourself "
            f"({' '.join(command)})"
        )
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise PlugrlError(
            f"{' '.join(command)} failed (exit {result.returncode}): "
            f"{lines[-1] if lines else 'no output'}"
        )
    return result.stdout


def wait_for_nodes(address: str, count: int, timeout_s: float) -> None:
    """Return once the Ray cluster at ``address`` has ``count`` live nodes; a one-line error
    after ``timeout_s`` seconds. The nodes of a launched job start at once, and the run must
    not place its ranks before they have joined."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = sum(1 for node in ray.nodes() if node.get("Alive"))
            if alive >= count:
                return
            if time.monotonic() >= deadline:
                raise PlugrlError(
                    f"--wait-for-nodes: {alive} of {count} nodes joined the Ray cluster at "
                    f"{address} in {timeout_s:g} s; see the other nodes' ray start output "
                    "(or give them longer: launch.node_timeout_s)"
                )
            time.sleep(1.0)
    finally:
        ray.shutdown()
