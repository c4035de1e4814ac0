"""Launchers: the job file that brings up a Ray cluster on a scheduler's machines and runs a
recipe on it (an sbatch script, a KubeRay RayJob, a SkyPilot task), and the command that
submits it. ``plugrl launch`` builds a :class:`LaunchJob` from the recipe and hands it to the
chosen :class:`Launcher`."""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import attrs
import yaml

from plugrl.config import option, positive

RECIPE_END = "PLUGRL_RECIPE_END"
"""The line that ends the recipe in a here-document (``cat > FILE <<'PLUGRL_RECIPE_END'``)."""


class _BlockDumper(yaml.SafeDumper):
    """Writes strings of several lines as ``|`` blocks, readable as the script they are."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def yaml_documents(*documents: Any) -> str:
    """YAML of ``documents`` (``---`` between them), keys in their order, strings of several
    lines as ``|`` blocks: the job files of Kubernetes and SkyPilot."""
    return yaml.dump_all(
        documents, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=100
    )


@attrs.define(kw_only=True)
class LaunchConfig:
    """The ``launch`` section: how ``plugrl launch`` puts the run on a cluster. ``plugrl run``
    reads and ignores it."""

    launcher: str | None = option(
        None,
        "The launcher that writes and submits the job (slurm, kuberay, skypilot); "
        "plugrl launch --slurm / --kuberay / --skypilot / --launcher NAME sets it.",
        registry="launchers",
    )
    launcher_args: dict[str, Any] = option(
        factory=dict,
        help="The chosen launcher's options (partition, account, time for slurm; namespace, "
        "volume_claim for kuberay; accelerators, infra, storage for skypilot).",
    )
    workdir: str | None = option(
        None,
        "Folder on storage every node mounts at the same path: the job starts there, the "
        "recipe's relative paths and the run folder start there. Unset: the folder the job "
        "is submitted from (slurm); kuberay and skypilot need it.",
    )
    nodes: int | None = option(
        None,
        "Nodes the job asks for. Unset: trainer.nnodes, plus rollout.nnodes when the engines "
        "have devices of their own (rollout.colocate: false).",
        validator=positive,
    )
    devices_per_node: int | None = option(
        None,
        "Devices of each node. Unset: trainer.n_gpus_per_node, or rollout.n_gpus_per_node "
        "when the engines have devices of their own and it is more.",
        validator=positive,
    )
    image: str | None = option(
        None,
        "Container image every node runs (with plugrl and the run's plugins installed); "
        "kuberay needs one.",
    )
    venv: str | None = option(
        None,
        "A virtual environment at the same path on every node (with plugrl and the run's "
        "plugins), activated before Ray starts.",
    )
    network_interface: str | None = option(
        None,
        "Network interface the collectives use between nodes (eth0, ib0, bond0): sets the "
        "variables the device's libraries read (GLOO_SOCKET_IFNAME, and NCCL_SOCKET_IFNAME on "
        "cuda or HCCL_SOCKET_IFNAME on npu).",
    )
    env: dict[str, str] = option(
        factory=dict,
        help="Environment variables of every node's Ray and of the run (HF_HOME, NCCL_DEBUG).",
    )
    ray_port: int = option(6379, "Port of the head node's Ray.", validator=positive)
    ray_args: list[str] = option(
        factory=list,
        help="More options of every node's ray start (--num-cpus=32, --object-store-memory=...).",
    )
    node_timeout_s: float = option(
        600.0,
        "Seconds the run waits for all the job's nodes to join Ray before it stops.",
        validator=positive,
    )


@attrs.frozen(kw_only=True)
class LaunchJob:
    """What a launcher writes a job file from: the recipe's cluster, resolved by the kernel.

    Shell fragments (:meth:`head_start`, :meth:`worker_start`, :meth:`driver`) take the head's
    address as a shell word that the job file defines (``"$head_ip"``), so they can be
    placed in a script as they are."""

    name: str
    """Job name: lowercase letters, digits and ``-``, at most 52 characters (a Kubernetes
    name with room for the suffixes the operator adds)."""
    nodes: int
    """Nodes (machines or pods) of the Ray cluster."""
    devices_per_node: int
    """Accelerators of each node (CPU ranks per node when :attr:`ray_resource` is ``None``)."""
    device: str
    """The device kind the run uses (``device.name``)."""
    ray_resource: str | None
    """Ray's resource of one device (``"GPU"``, ``"NPU"``); ``None`` for CPU ranks."""
    kubernetes_resource: str | None
    """The device's Kubernetes resource name (``"nvidia.com/gpu"``), or ``None``."""
    slurm_gres: str | None
    """The device's Slurm generic resource (``"gpu"``), or ``None``."""
    env: dict[str, str]
    """Environment of every node's Ray and of the run: the network interface variables the
    device asked for, then ``launch.env``."""
    network_interface: str | None
    """``launch.network_interface``: the interface between nodes (the head's address is
    taken from it), or ``None``."""
    workdir: str | None
    """``launch.workdir``: the job's working folder on shared storage, or ``None``."""
    venv: str | None
    """``launch.venv``, or ``None``."""
    image: str | None
    """``launch.image``, or ``None``."""
    recipe_text: str
    """The recipe the run reads, as YAML (composed, overrides applied, no ``launch``)."""
    recipe_file: str
    """Where the job writes :attr:`recipe_text`, relative to the working folder."""
    ray_port: int
    """Port of the head node's Ray."""
    ray_args: tuple[str, ...] = ()
    """More options of every ``ray start``."""
    node_timeout_s: float = 600.0
    """Seconds the run waits for all :attr:`nodes` to join."""

    def ray_device_options(self) -> list[str]:
        """The ``ray start`` options that give a node its devices: ``--num-gpus=N`` for Ray's
        own ``GPU`` resource, ``--resources={"NPU": N}`` for another, none for CPU ranks."""
        if self.ray_resource is None:
            return []
        if self.ray_resource == "GPU":
            return [f"--num-gpus={self.devices_per_node}"]
        resources = json.dumps({self.ray_resource: self.devices_per_node})
        return [f"--resources={resources}"]

    def head_start(self, ip: str, *, block: bool = True) -> str:
        """``ray start --head`` on the head node, whose address is the shell word ``ip``."""
        options = [
            "--head",
            f"--port={self.ray_port}",
            *self.ray_device_options(),
            "--disable-usage-stats",
            *self.ray_args,
        ]
        block_option = " --block" if block else ""
        return f"ray start --node-ip-address={ip} {shlex.join(options)}{block_option}"

    def worker_start(self, head_ip: str, *, block: bool = True) -> str:
        """``ray start`` on another node, joining the head whose address is the shell word
        ``head_ip``."""
        options = [*self.ray_device_options(), "--disable-usage-stats", *self.ray_args]
        block_option = " --block" if block else ""
        return f"ray start --address={head_ip}:{self.ray_port} {shlex.join(options)}{block_option}"

    def wait_for_head(self, head_ip: str, timeout_s: int = 300) -> str:
        """A bash line that waits (at most ``timeout_s`` seconds) until the head's Ray port
        takes connections: workers started before it fail to join."""
        probe = f"(exec 3<>/dev/tcp/{head_ip}/{self.ray_port}) 2>/dev/null"
        return f"for _ in $(seq {timeout_s}); do {probe} && break; sleep 1; done"

    def driver(self, address: str, recipe_file: str | None = None) -> str:
        """``plugrl run`` of the recipe (at ``recipe_file``, default :attr:`recipe_file`) in
        the working folder, on the Ray cluster at ``address`` (a shell word: ``auto``,
        ``"$head_ip":6379``), once all :attr:`nodes` have joined."""
        chdir = f" --chdir={shlex.quote(self.workdir)}" if self.workdir else ""
        return (
            f"plugrl run{chdir} {shlex.quote(recipe_file or self.recipe_file)} cluster.mode=ray "
            f"cluster.address={address} --wait-for-nodes={self.nodes} "
            f"--wait-timeout={self.node_timeout_s:g}"
        )

    def node_ip(self) -> str:
        """A shell command that prints this node's IPv4 address: the address of
        :attr:`network_interface` when set, else the first one ``hostname -I`` lists."""
        if self.network_interface:
            interface = shlex.quote(self.network_interface)
            address = "awk '{print $4}' | cut -d/ -f1 | head -n1"
            return f"ip -4 -o addr show dev {interface} | {address}"
        return "hostname -I | awk '{print $1}'"

    def write_recipe(self) -> str:
        """Shell lines that write :attr:`recipe_text` to :attr:`recipe_file` (a quoted
        here-document: nothing in it is expanded)."""
        folder = shlex.quote(self.recipe_file.rpartition("/")[0] or ".")
        return (
            f"mkdir -p {folder}\n"
            f"cat > {shlex.quote(self.recipe_file)} <<'{RECIPE_END}'\n"
            f"{self.recipe_text.rstrip()}\n{RECIPE_END}"
        )

    @property
    def ray_token(self) -> bool:
        """Whether the job file sets up Ray's token authentication (one token for the job's
        nodes and its run): unless ``launch.env`` sets ``RAY_AUTH_MODE`` itself."""
        return "RAY_AUTH_MODE" not in self.env

    def new_token(self) -> str:
        """A shell command that prints a fresh random token."""
        return "od -An -N32 -tx1 /dev/urandom | tr -d ' \\n'"

    def exports(self) -> str:
        """``export NAME=VALUE`` lines of :attr:`env` (values quoted), one per variable."""
        return "\n".join(f"export {name}={shlex.quote(value)}" for name, value in self.env.items())


class Launcher(ABC):
    """A scheduler that brings up the job's Ray cluster: writes the job file and names the
    command that submits it. Built as ``Launcher(config)``, on the machine that runs
    ``plugrl launch``."""

    name: ClassVar[str]
    """Registered name (``"slurm"``)."""
    file_suffix: ClassVar[str]
    """Ending of the job file's name (``".sbatch"``, ``".rayjob.yaml"``)."""

    def __init__(self, config: Any = None) -> None:
        self.config = config

    @abstractmethod
    def render(self, job: LaunchJob) -> str:
        """The job file's text. Raise :class:`plugrl.errors.RecipeError` (keyed by the
        ``launch`` option to fix) for a job this scheduler cannot run."""

    @abstractmethod
    def submit_command(self, path: str) -> list[str]:
        """The command that submits the job file at ``path`` (``["sbatch", path]``); its first
        word is looked up on ``PATH`` before it runs."""
