"""What megatron-core needs patched to run on a machine without CUDA.

megatron-core allocates many tensors with ``device=torch.cuda.current_device()``, forks the
CUDA random generator around tensor-parallel initialisation and dropout, and saves and restores
the CUDA generator's state around recomputed activations. On the cpu device the first answers
the CPU, and the CPU generator stands in for the CUDA one in the other two. Nothing else is
changed:
paths with a hard-coded ``device="cuda"`` (megatron's optimizers, its pipeline schedules, its
default causal mask) stay unusable on CPU, and the backend avoids them there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _cpu_device() -> torch.device:
    return torch.device("cpu")


@contextlib.contextmanager
def _fork_cpu_generator(self: object, name: str = "model-parallel-rng") -> Iterator[None]:
    """Run the block with the CPU generator, restoring its state afterwards, as the CUDA
    tracker's fork does for its named CUDA state."""
    with torch.random.fork_rng(devices=[]):
        yield


def _cpu_generator_state(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_generator_state(new_state: torch.Tensor, *args: object, **kwargs: object) -> None:
    torch.set_rng_state(new_state)


def apply() -> list[str]:
    """Patch (once per process) and say what was patched."""
    from megatron.core.tensor_parallel import random as megatron_random

    patched = []
    if torch.cuda.current_device is not _cpu_device:
        if torch.cuda.is_available():
            raise RuntimeError(
                "the cpu shims for megatron-core were asked for in a process that sees CUDA; "
                "choose device.name: cuda"
            )
        torch.cuda.current_device = _cpu_device
        patched.append("torch.cuda.current_device -> cpu")
    tracker = megatron_random.CudaRNGStatesTracker
    if tracker.fork is not _fork_cpu_generator:
        tracker.fork = _fork_cpu_generator
        patched.append("megatron CudaRNGStatesTracker.fork -> forks the CPU generator")
    if megatron_random._get_cuda_rng_state is not _cpu_generator_state:
        # activation recompute replays a layer with the generator state of its first run
        megatron_random._get_cuda_rng_state = _cpu_generator_state
        megatron_random._set_cuda_rng_state = _set_cpu_generator_state
        patched.append("megatron _get/_set_cuda_rng_state -> the CPU generator's state")
    return patched
