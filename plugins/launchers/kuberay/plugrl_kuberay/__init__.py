"""The ``kuberay`` launcher: a KubeRay RayJob (with the recipe in a ConfigMap) whose Ray
cluster has a pod per node and whose entrypoint runs the recipe (docs/cluster.md,
"Launching a job")."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_launchers(register):
    register(
        "kuberay",
        "plugrl_kuberay.launcher:KubeRayLauncher",
        config="plugrl_kuberay.launcher:KubeRayConfig",
    )
