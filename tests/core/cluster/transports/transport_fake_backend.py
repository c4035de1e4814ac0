"""A plugin with a backend whose weights are whatever the test asks for, to test transports.

``set_weights(spec, seed)`` (through ``WorkerGroup.execute_all``) says which weights the next
pushes carry: ``spec`` is a list of ``(name, shape, dtype)``, the values come from ``seed``, so
a test makes the same tensors with :func:`make_weights`. Rank 0 yields them, as fsdp2 does;
``senders`` makes other ranks yield too, and ``misannounce`` announces one weight with a wrong
shape. Registered in-process by the tests; Ray workers import it by name.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

import torch

import plugrl
from plugrl.parts.backend import TrainingBackend
from plugrl.parts.rollout import WeightMeta

Spec = Sequence[tuple[str, Sequence[int], str]]


@plugrl.hookimpl
def register_training_backends(register):
    register("fake_weights", "tests.core.cluster.transports.transport_fake_backend:WeightsBackend")


def make_weights(spec: Spec, seed: int) -> list[tuple[str, torch.Tensor]]:
    """The tensors of ``spec`` for ``seed``: random normal values in each weight's dtype."""
    weights = []
    for name, shape, dtype in spec:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        values = torch.randn(tuple(shape), generator=generator)
        kind = getattr(torch, dtype)
        weights.append(
            (name, values.to(kind) if kind.is_floating_point else (values * 1e3).to(kind))
        )
    return weights


class WeightsBackend(TrainingBackend):
    def __init__(self, config, context):
        super().__init__(config, context)
        self.spec: list = [("weight", (4,), "float32")]
        self.seed = 0
        self.senders = (0,)
        self.misannounce = False

    def setup(self, total_training_steps: int) -> None:
        pass

    def set_weights(self, spec: Spec, seed: int, senders=(0,), misannounce=False) -> None:
        self.spec, self.seed = list(spec), seed
        self.senders, self.misannounce = tuple(senders), misannounce

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.dist.rank in self.senders:
            yield from make_weights(self.spec, self.seed)

    def weight_metadata(self) -> list[WeightMeta]:
        metas = [WeightMeta(name, tuple(shape), dtype) for name, shape, dtype in self.spec]
        if self.misannounce:
            first = metas[0]
            metas[0] = WeightMeta(first.name, (*first.shape, 1), first.dtype)
        return metas

    def compute_log_prob(self, batch, *, calculate_entropy=False):
        raise NotImplementedError

    def update_policy(self, batch, objective):
        raise NotImplementedError

    def save_checkpoint(self, path):
        pass

    def load_checkpoint(self, path):
        pass

    def export_hf(self, path):
        pass
