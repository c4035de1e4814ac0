"""A plugin with a backend that only reports what reached it, to test worker groups.

Registered in-process by the tests; Ray workers import it by name (see the Ray tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.distributed as dist

import plugrl
from plugrl.errors import CheckpointError
from plugrl.parts.backend import TrainingBackend
from plugrl.parts.rollout import WeightMeta
from plugrl_cpu.device import CpuDevice

PREPARED: list[tuple[str, str]] = []


@plugrl.hookimpl
def register_training_backends(register):
    register("fake_dp", "tests.core.cluster.cluster_fake_backend:FakeBackend")
    register("fake_tp", "tests.core.cluster.cluster_fake_backend:FakeTensorParallelBackend")
    register("fake_pp", "tests.core.cluster.cluster_fake_backend:FakePipelineBackend")
    register("fake_no_output", "tests.core.cluster.cluster_fake_backend:NoOutputBackend")
    register(
        "fake_guarded",
        "tests.core.cluster.cluster_fake_backend:FakeBackend",
        framework_modules=["json"],
    )


@plugrl.hookimpl
def register_devices(register):
    register("envcpu", "tests.core.cluster.cluster_fake_backend:EnvCpuDevice")


@plugrl.hookimpl
def prepare_backend(device, backend, recipe):
    PREPARED.append((device, backend))
    return [f"fake patch of {backend}"] if backend == "fake_dp" else None


class EnvCpuDevice(CpuDevice):
    """The CPU, with settings its workers need in their environment."""

    name = "envcpu"

    @classmethod
    def worker_env(cls, kind):
        return {"FAKE_ALLOC_CONF": f"{kind}-setting", "FAKE_USER_WINS": "device"}


class FakeBackend(TrainingBackend):
    """Returns row ids and rank numbers instead of log-probs, so dispatch can be checked."""

    def __init__(self, config, context):
        super().__init__(config, context)
        self.prepared_before_init = list(PREPARED)
        self.steps = 0

    def setup(self, total_training_steps: int) -> None:
        self.total_training_steps = total_training_steps

    def report(self) -> dict:
        """What this rank saw; the all-reduce proves the process group joins all ranks."""
        ranks = torch.tensor([self.dist.rank + 1])
        dist.all_reduce(ranks)
        return {
            "pid": os.getpid(),
            "rank": self.dist.rank,
            "world_size": dist.get_world_size(),
            "rank_sum": int(ranks),
            "prepared_before_init": self.prepared_before_init,
            "total_training_steps": self.total_training_steps,
            "ray": _ray_placement(),
        }

    def compute_log_prob(self, batch, *, calculate_entropy=False):
        rows = len(batch)
        out = {
            "log_probs": batch["row_id"].float().unsqueeze(-1),
            "rank": torch.full((rows, 1), float(self.dist.rank)),
        }
        if calculate_entropy:
            out["entropys"] = torch.zeros(rows, 1)
        return out

    def compute_values(self, batch):
        return batch["row_id"].float().unsqueeze(-1) * 10

    def update_policy(self, batch, objective):
        self.steps += 1
        return {
            "fake/rows": float(len(batch)),
            "fake/rank": float(self.dist.rank),
            "fake/first_row": float(batch["row_id"][0]),
            "fake/objective": float(objective(batch)),
        }

    def update_critic(self, batch):
        return {"fake/critic_rows": float(len(batch))}

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.dist.rank == 0:
            yield "weight", torch.tensor([float(self.steps)])

    def env(self, name):
        return os.environ.get(name)

    def weight_metadata(self):
        return [WeightMeta("weight", (1,), "float32")]

    def save_checkpoint(self, path):
        (path / f"rank{self.dist.rank}").write_text(str(self.steps))

    def load_checkpoint(self, path):
        file = path / f"rank{self.dist.rank}"
        if not file.exists():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing; start fresh")
        self.steps = int(file.read_text())

    def export_hf(self, path):
        if self.dist.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
            (path / "weights.txt").write_text(str(self.steps))


def _ray_placement() -> dict:
    """The Ray resources this process holds and its placement group, or nothing outside Ray."""
    try:
        import ray
    except ImportError:
        return {}
    if not ray.is_initialized():
        return {}
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        # a driver that has started Ray (another test module's) is not one of Ray's workers
        return {}
    return {
        "resources": dict(context.get_assigned_resources()),
        "placement_group": context.get_placement_group_id(),
    }


class FakeTensorParallelBackend(FakeBackend):
    """All ranks form one tensor-parallel group: one data-parallel rank holding everything."""

    @property
    def dp_rank(self) -> int:
        return 0

    @property
    def dp_size(self) -> int:
        return 1

    @property
    def is_output_rank(self) -> bool:
        return self.dist.rank == 0


class FakePipelineBackend(FakeTensorParallelBackend):
    """Two pipeline stages of one data-parallel rank: the last stage holds the outputs."""

    @property
    def is_output_rank(self) -> bool:
        return self.dist.rank == self.dist.world_size - 1


class NoOutputBackend(FakeTensorParallelBackend):
    @property
    def is_output_rank(self) -> bool:
        return False


class SumRowIds:
    """A picklable stand-in for an actor objective."""

    def __call__(self, batch) -> float:
        return float(batch["row_id"].sum())
