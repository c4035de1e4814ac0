"""Helpers for test folders."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def pip_install_into(target: Path, *sources: Path) -> Path:
    """``pip install`` (not editable, as users install them) the distributions at ``sources``
    into ``target``, without dependencies or the network: plugrl is already here."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            *map(str, sources),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return target


# The Ray instance this test process shares between the modules that need only a plain
# local cluster (SHARED_RAY_CPUS logical CPUs, no accelerators): starting Ray costs several
# seconds, once per process instead of once per module. Modules that need a cluster of another
# shape, or that join one of their own, take local_ray, which stops the shared one first.
SHARED_RAY_CPUS = 4
_shared_ray_up = False


def stop_shared_ray() -> None:
    """Shut this process's shared Ray down, if it is up (before a module starts its own)."""
    global _shared_ray_up
    if _shared_ray_up:
        import ray

        ray.shutdown()
        _shared_ray_up = False


def _init_ray(**kwargs: Any) -> Any:
    import ray

    if ray.is_initialized():
        raise AssertionError(
            "a Ray instance that tests.support did not start is still up: a test that starts "
            "Ray must stop it (use local_ray or shared_ray_for_module)"
        )
    ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
    return ray


@contextlib.contextmanager
def local_ray(num_cpus: int, **options: Any) -> Iterator[Any]:
    """A Ray instance of ``num_cpus`` logical CPUs (and ``options`` for ``ray.init``) of a
    module's own, for a module that needs a cluster shaped otherwise than the shared one. Its
    workers import the test helpers as ``tests.*`` modules: Ray puts the driver's working
    folder, the repository root, on their import path."""
    import ray

    stop_shared_ray()
    _init_ray(num_cpus=num_cpus, **options)
    try:
        yield ray
    finally:
        ray.shutdown()


def _left_on_ray(ray: Any) -> list[str]:
    from ray._private import state

    alive = [
        f"actor {info.get('Name') or info.get('ActorClassName')} ({actor_id})"
        for actor_id, info in state.actors().items()
        if info.get("State") != "DEAD"
    ]
    free = ray.available_resources()
    held = {
        name: total - free.get(name, 0.0)
        for name, total in ray.cluster_resources().items()
        if name in ("CPU", "GPU")
    }
    return alive + [f"{amount:g} {name} held" for name, amount in held.items() if amount > 1e-9]


@contextlib.contextmanager
def shared_ray_for_module() -> Iterator[Any]:
    """The process's shared Ray (started here on first use), for one test module, which must
    leave it as it found it: at the module's end no actor of it is alive and no CPU is held
    (killed actors take a moment to be released, hence the wait, whose deadline only catches
    what stays). A module that leaves something behind fails, and the shared Ray is stopped
    so that the next module starts on a clean one."""
    global _shared_ray_up
    if not _shared_ray_up:
        _init_ray(num_cpus=SHARED_RAY_CPUS)
        _shared_ray_up = True
    import ray

    try:
        yield ray
    except BaseException:
        stop_shared_ray()  # what the failure left running must not reach the next module
        raise
    try:
        wait_until(lambda: not _left_on_ray(ray), "the module's Ray actors to go", every=0.1)
    except AssertionError:
        left = _left_on_ray(ray)
        stop_shared_ray()
        raise AssertionError(f"the module left on the shared Ray: {', '.join(left)}") from None


def wait_until(
    condition: Callable[[], Any], what: str, timeout: float = 300.0, every: float = 0.002
) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` was awaited if it is not
    within ``timeout`` seconds. The deadline is generous on purpose: a test waits for an
    event, never for an amount of time, so a loaded machine is slower but not failing."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        time.sleep(every)


@contextlib.contextmanager
def spawned_rank() -> Iterator[None]:
    """The body of a rank that ``torch.multiprocessing.spawn`` started, ended so that a
    passing rank exits 0: every rank waits at a barrier before the group goes, and a rank
    that got through leaves with ``os._exit(0)``. Gloo's threads can otherwise abort the
    process at interpreter exit ("terminate called without an active exception"), which
    spawn reports as a failure of a rank that did all its work. A rank that raised goes the
    normal way, so spawn shows its traceback."""
    import os

    import torch.distributed as dist

    try:
        yield
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
