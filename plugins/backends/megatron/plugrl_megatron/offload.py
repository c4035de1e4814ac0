"""Parking a model's parameters, gradient buffers and optimizer state in host memory between
the phases that need them, and bringing them back before they are used.

The unit is a tensor's storage, not the tensor: the device storage is emptied (resized to
zero bytes) after its bytes are copied to the host, and refilled in place on return. Every
tensor object, and every view into the storage, stays the one it was: megatron's parameters
are views into its contiguous parameter buffer, ``main_grad`` views into its gradient buffer,
and the optimizer holds the parameters and its state by identity, so nothing has to be
re-pointed afterwards. Storages that several tensors share are parked once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import attrs
import torch

PARTS = ("params", "grads", "optimizer")
"""What :class:`Offloader` can park, in the order it brings them back."""


@attrs.define
class Parked:
    """One emptied device storage; ``copy`` holds its bytes on the host, or is ``None`` when
    its contents were not worth keeping (they are zeros on return)."""

    storage: torch.UntypedStorage
    nbytes: int
    copy: torch.Tensor | None


def _on(where: torch.device, device: torch.device) -> bool:
    """Whether ``where`` is ``device`` (an index-less device means the current one)."""
    return where.type == device.type and (device.index is None or where.index == device.index)


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat ``uint8`` tensor over the whole storage (so copies can be made with tensors)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def park(
    tensors: Iterable[torch.Tensor],
    *,
    device: torch.device,
    host: torch.device,
    keep: bool = True,
    skip: set[int] | None = None,
) -> list[Parked]:
    """Empty the storages behind ``tensors`` that live on ``device``, keeping their bytes on
    ``host`` (when ``keep``). Storages already empty (parked before) and those whose data
    pointer is in ``skip`` are left alone."""
    groups: dict[int, list[torch.Tensor]] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if storage.nbytes() == 0 or pointer in (skip or ()) or not _on(storage.device, device):
            continue
        groups.setdefault(pointer, []).append(tensor)
    # pinned host memory makes the copies direct; only CUDA pins
    pin = host.type == "cpu" and device.type == "cuda"
    parked: list[Parked] = []
    for group in groups.values():
        storage = _resizable(group)
        copy = None
        if keep:
            copy = torch.empty(storage.nbytes(), dtype=torch.uint8, device=host, pin_memory=pin)
            copy.copy_(_bytes(storage))
        parked.append(Parked(storage, storage.nbytes(), copy))
        storage.resize_(0)
    return parked


@torch.no_grad()
def _resizable(tensors: list[torch.Tensor]) -> torch.UntypedStorage:
    """The storage the tensors share, made resizable first where it is not: tensors read
    from a file (a checkpoint's optimizer state) keep the file's fixed-size memory, so they
    move to a copy of it, together, which keeps them views of one another."""
    storage = tensors[0].untyped_storage()
    if storage.resizable():
        return storage
    fresh = storage.clone()
    for tensor in tensors:
        tensor.set_(fresh, tensor.storage_offset(), tensor.size(), tensor.stride())
    return fresh


def unpark(parked: list[Parked]) -> None:
    """Refill each storage :func:`park` emptied, with its bytes (or zeros)."""
    for item in parked:
        item.storage.resize_(item.nbytes)
        flat = _bytes(item.storage)
        if item.copy is None:
            flat.zero_()
        else:
            flat.copy_(item.copy)


def storage_pointers(tensors: Iterable[torch.Tensor]) -> set[int]:
    """The data pointers of the non-empty storages behind ``tensors``."""
    return {t.untyped_storage().data_ptr() for t in tensors if t.untyped_storage().nbytes()}


def optimizer_tensors(optimizer: object) -> Iterator[torch.Tensor]:
    """The tensors an optimizer holds: its state (moments, steps) and the parameters it steps.

    megatron's optimizers wrap a torch optimizer (``.optimizer``), and a chained one holds
    several (``.chained_optimizers``); under mixed precision the stepped parameters are its
    float32 main copies, otherwise the model's own (which the caller skips)."""
    for inner in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        stepped = getattr(inner, "optimizer", inner)
        if stepped is None:  # a pipeline stage that holds no parameters
            continue
        for group in stepped.param_groups:
            yield from group["params"]
        for state in stepped.state.values():
            yield from (value for value in state.values() if isinstance(value, torch.Tensor))


class Offloader:
    """What one backend parks, and the bookkeeping to bring it back exactly once.

    ``sources`` maps each part (:data:`PARTS`) that is to be offloaded to a function listing
    its tensors at the moment of parking (the optimizer creates its state at the first step,
    and a checkpoint load replaces it). Gradients are not kept: the buffers are zeroed before
    each update, so only their memory matters. ``model_params`` lists the model's parameters,
    which the optimizer part leaves alone (they are the parameters' part, offloaded or not).
    """

    def __init__(
        self,
        sources: dict[str, Callable[[], Iterable[torch.Tensor]]],
        *,
        model_params: Callable[[], Iterable[torch.Tensor]],
        device: torch.device,
        host: torch.device,
        empty_cache: Callable[[], None] = lambda: None,
    ) -> None:
        unknown = sorted(set(sources) - set(PARTS))
        if unknown:
            raise ValueError(f"cannot offload {unknown}; the parts are {list(PARTS)}")
        self.sources = sources
        self.model_params = model_params
        self.device = device
        self.host = host
        self.empty_cache = empty_cache
        self.parked: dict[str, list[Parked]] = {}

    @property
    def parts(self) -> list[str]:
        return [part for part in PARTS if part in self.sources]

    def offload(self, *parts: str) -> None:
        """Park each of ``parts`` (all offloaded parts when none are named) that is on the
        device; parts not offloaded are ignored."""
        self._offload(list(parts) or self.parts)

    def reload(self, *parts: str) -> None:
        """Bring back each of ``parts`` (all parked parts when none are named)."""
        self._reload(list(parts) or list(PARTS))

    @contextlib.contextmanager
    def resident(self, *parts: str) -> Iterator[None]:
        """``parts`` on the device for the block, parked again after it: only those this
        call brought back, so that blocks nest."""
        brought = [part for part in parts if part in self.parked]
        self._reload(brought)
        try:
            yield
        finally:
            self._offload(brought)

    def _offload(self, parts: list[str]) -> None:
        chosen = [p for p in parts if p in self.sources and p not in self.parked]
        if not chosen:
            return
        # the optimizer's parameters are the model's own without mixed precision: they go
        # with the parameters, or stay with them
        model = storage_pointers(self.model_params())
        for part in chosen:
            self.parked[part] = park(
                self.sources[part](),
                device=self.device,
                host=self.host,
                keep=part != "grads",
                skip=model if part == "optimizer" else None,
            )
        self.empty_cache()

    def _reload(self, parts: list[str]) -> None:
        for part in [p for p in PARTS if p in parts and p in self.parked]:
            unpark(self.parked.pop(part))
