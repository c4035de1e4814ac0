"""torch.distributed set-up for the ranks of one role."""

from __future__ import annotations

import datetime
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plugrl.parts.backend import DistInfo
    from plugrl.parts.device import Device

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def init_process_group(
    device: Device,
    dist_info: DistInfo,
    master_addr: str,
    master_port: int,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> None:
    """Join the process group of a role's ranks with the device's collective backend."""
    import torch.distributed as dist

    dist.init_process_group(
        backend=device.dist_backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=dist_info.rank,
        world_size=dist_info.world_size,
        timeout=timeout,
    )


def ensure_process_group(device: Device, dist_info: DistInfo) -> None:
    """Make sure a process group of ``dist_info.world_size`` ranks exists in this process.

    One rank in the driver process (``cluster: local``, or a backend built by hand) gets a
    single-rank group on an in-memory store, so the backend runs the same collective code path
    as with many ranks; more ranks must have been joined by the worker group.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != dist_info.world_size:
            raise RuntimeError(
                f"this process is in a group of {dist.get_world_size()} ranks, but the backend "
                f"was built for {dist_info.world_size}"
            )
        return
    if dist_info.world_size != 1:
        raise RuntimeError(
            f"a rank of {dist_info.world_size} needs its process group first; build backends "
            "through a plugrl.cluster worker group"
        )
    dist.init_process_group(
        backend=device.dist_backend, store=dist.HashStore(), rank=0, world_size=1
    )
