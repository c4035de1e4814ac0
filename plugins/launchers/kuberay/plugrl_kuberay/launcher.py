"""A KubeRay ``RayJob`` (``ray.io/v1``) from a :class:`LaunchJob`, after a ``ConfigMap`` that
holds the recipe: the head pod and ``nodes - 1`` worker pods, each with the node's devices,
the shared volume at the working folder, and the job's environment."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

import attrs

from plugrl.api import RecipeError, option, positive
from plugrl.api.launch import Launcher, LaunchJob, yaml_documents

RECIPE_MOUNT = "/etc/plugrl"
"""Where the head pod sees the ConfigMap: the run reads ``/etc/plugrl/recipe.yaml``."""

# the entrypoint passes through two shells (the submitter's, then Ray's job supervisor)
# joined by spaces: words with nothing a shell reads survive both unchanged
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:=+-]+$")
# what a plain PATH holds in the usual images, after the venv's bin
_IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@attrs.define(kw_only=True)
class KubeRayConfig:
    """``launch.launcher_args`` of the ``kuberay`` launcher."""

    namespace: str | None = option(None, "Namespace of the RayJob; unset: kubectl's current one.")
    volume_claim: str | None = option(
        None,
        "PersistentVolumeClaim (ReadWriteMany) mounted at launch.workdir in every pod: the "
        "shared storage of the model, the data and the run folder.",
    )
    cpus_per_node: str | None = option(None, "CPU request and limit of each pod (32).")
    memory_per_node: str | None = option(None, "Memory request and limit of each pod (256Gi).")
    service_account: str | None = option(None, "Service account of the pods.")
    image_pull_policy: str = option(
        "IfNotPresent", "When pods pull launch.image.", choices=["Always", "IfNotPresent", "Never"]
    )
    ttl_seconds_after_finished: int = option(
        600,
        "Seconds the Ray cluster stays after the job ends (its logs can be read), before it "
        "is deleted.",
        validator=positive,
    )


class KubeRayLauncher(Launcher):
    """A RayJob manifest; submitted with ``kubectl create -f``."""

    name: ClassVar[str] = "kuberay"
    file_suffix: ClassVar[str] = ".rayjob.yaml"

    def __init__(self, config: KubeRayConfig | None = None) -> None:
        super().__init__(config or KubeRayConfig())

    def submit_command(self, path: str) -> list[str]:
        return ["kubectl", "create", "-f", path]

    def render(self, job: LaunchJob) -> str:
        return yaml_documents(*self.documents(job))

    def documents(self, job: LaunchJob) -> list[dict[str, Any]]:
        """The ConfigMap of the recipe, then the RayJob."""
        config: KubeRayConfig = self.config
        if not job.image:
            raise RecipeError(
                "a KubeRay pod runs a container image: name one with plugrl, Ray and the run's "
                "plugins installed",
                key="launch.image",
            )
        if not job.workdir:
            raise RecipeError(
                "KubeRay pods share the run's files through a volume: set the folder it is "
                "mounted at (and launch.launcher_args.volume_claim)",
                key="launch.workdir",
            )
        if not config.volume_claim:
            raise RecipeError(
                f"name the PersistentVolumeClaim mounted at launch.workdir ({job.workdir}) in "
                "every pod: the model, the data and the run folder must be on it",
                key="launch.launcher_args.volume_claim",
            )
        entrypoint = job.driver("auto", f"{RECIPE_MOUNT}/recipe.yaml")
        if not all(_PLAIN_WORD.match(word) for word in entrypoint.split()):
            raise RecipeError(
                f"{job.workdir!r} holds characters the RayJob's entrypoint cannot pass on "
                "(it goes through two shells); use letters, digits and ./_-",
                key="launch.workdir",
            )
        metadata: dict[str, Any] = {"name": job.name}
        if config.namespace:
            metadata["namespace"] = config.namespace
        recipe_map = {**metadata, "name": f"{job.name}-recipe"}
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": recipe_map,
            "data": {"recipe.yaml": job.recipe_text},
        }
        cluster: dict[str, Any] = {}
        if "RAY_AUTH_MODE" not in job.env:
            # the operator makes the token and gives it to every pod and the submitter
            cluster["authOptions"] = {"mode": "token"}
        cluster["headGroupSpec"] = {
            "rayStartParams": self.ray_start_params(job),
            "template": self.pod(job, "ray-head", recipe=True),
        }
        if job.nodes > 1:
            cluster["workerGroupSpecs"] = [
                {
                    "groupName": "workers",
                    "replicas": job.nodes - 1,
                    "minReplicas": job.nodes - 1,
                    "maxReplicas": job.nodes - 1,
                    "rayStartParams": self.ray_start_params(job),
                    "template": self.pod(job, "ray-worker", recipe=False),
                }
            ]
        ray_job = {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "metadata": metadata,
            "spec": {
                "entrypoint": entrypoint,
                "shutdownAfterJobFinishes": True,
                "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
                "rayClusterSpec": cluster,
            },
        }
        return [config_map, ray_job]

    def ray_start_params(self, job: LaunchJob) -> dict[str, str]:
        """KubeRay's ``rayStartParams``: ``launch.ray_args`` (``--name=value``) and, for a
        device Ray does not find in a pod's limits as it finds GPUs, its resource."""
        params = {"disable-usage-stats": "true"}
        for arg in job.ray_args:
            name, sep, value = arg.removeprefix("--").partition("=")
            if not arg.startswith("--") or not sep:
                raise RecipeError(
                    f"{arg!r}: KubeRay takes ray start options as --name=value",
                    key="launch.ray_args",
                )
            params[name] = value
        if job.ray_resource is not None and job.ray_resource != "GPU":
            # a JSON mapping inside the quotes KubeRay's rayStartParams want for it
            resources = json.dumps({job.ray_resource: job.devices_per_node})
            params.setdefault("resources", '"' + resources.replace('"', '\\"') + '"')
        return params

    def pod(self, job: LaunchJob, container: str, *, recipe: bool) -> dict[str, Any]:
        config: KubeRayConfig = self.config
        limits: dict[str, Any] = {}
        if job.ray_resource is not None:
            if job.kubernetes_resource is None:
                raise RecipeError(
                    f"device {job.device!r} names no Kubernetes resource (its plugin sets "
                    "none), so its pods cannot ask for devices",
                    key="device.name",
                )
            limits[job.kubernetes_resource] = job.devices_per_node
        if config.cpus_per_node:
            limits["cpu"] = config.cpus_per_node
        if config.memory_per_node:
            limits["memory"] = config.memory_per_node
        env = dict(job.env)
        if job.venv:
            venv = job.venv.rstrip("/")
            env = {"VIRTUAL_ENV": venv, "PATH": f"{venv}/bin:{_IMAGE_PATH}", **env}
        mounts = [{"name": "shared", "mountPath": job.workdir}]
        volumes: list[dict[str, Any]] = [
            {"name": "shared", "persistentVolumeClaim": {"claimName": config.volume_claim}}
        ]
        if recipe:
            mounts.append({"name": "recipe", "mountPath": RECIPE_MOUNT, "readOnly": True})
            volumes.append({"name": "recipe", "configMap": {"name": f"{job.name}-recipe"}})
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": container,
                    "image": job.image,
                    "imagePullPolicy": config.image_pull_policy,
                    "workingDir": job.workdir,
                    "env": [{"name": name, "value": value} for name, value in env.items()],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        if config.service_account:
            spec["serviceAccountName"] = config.service_account
        return {"spec": spec}
