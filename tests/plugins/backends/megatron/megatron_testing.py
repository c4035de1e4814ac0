"""Builders for the megatron backend tests: recipes, backends, and spawned ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from plugrl.parts.backend import OptimConfig
from plugrl.parts.context import DistInfo, PartContext
from plugrl.recipe import ClusterConfig, ModelConfig, Recipe, TrainerConfig
from plugrl.testing import save_tiny_model
from plugrl_cpu.device import CpuDevice
from tests.plugins.backends.fsdp2.fsdp2_testing import VOCAB
from tests.support import spawned_rank


def save_tiny_qwen3(folder: Path, seed: int = 0, tie: bool = False) -> Path:
    """The fsdp2 tests' tiny model as a Qwen3 (per-head query/key norms, a head size other than
    hidden / heads), its embeddings tied or not."""
    return save_tiny_model(
        folder,
        seed=seed,
        model_type="qwen3",
        head_dim=32,
        tokenizer_vocab_size=VOCAB,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


def megatron_recipe(model_dir: Path, *, lr: float = 1e-3, **actor: Any) -> Recipe:
    from plugrl_megatron.config import MegatronActorConfig

    actor.setdefault("ppo_mini_batch_size", 8)
    return Recipe(
        model=ModelConfig(path=str(model_dir), dtype="float32"),
        actor=MegatronActorConfig(optim=OptimConfig(lr=lr), **actor),
        trainer=TrainerConfig(seed=7),
        cluster=ClusterConfig(mode="local", num_cpus=2),
    )


def make_megatron_backend(
    recipe: Recipe, role: str = "actor", dist: DistInfo | None = None, total_steps: int = 10
) -> Any:
    """A set-up backend; the cpu shims must have been applied in this process."""
    from plugrl_megatron.backend import MegatronBackend

    context = PartContext(recipe=recipe, role=role, device=CpuDevice(), dist=dist or DistInfo())
    backend = MegatronBackend(recipe.actor, context)
    backend.setup(total_steps)
    return backend


def rank_update_worker(rank: int, world_size: int, port: int, model_dir: str, out: str) -> None:
    """One of ``world_size`` spawned ranks, run twice: at tensor parallelism 1 (data-parallel
    copies) and 2 (one copy cut in two). Each time: log-probs of its data-parallel share of
    ``make_batch(8)``, one update on that share, the whole weights (rank 0 only), saved
    under ``out`` as ``tp<size>_rank<rank>.pt``."""
    from plugrl.cluster.distributed import init_process_group
    from plugrl_megatron import cpu_shims
    from tests.plugins.backends.fsdp2.fsdp2_testing import TokenMeanReinforce, make_batch

    torch.set_num_threads(1)
    cpu_shims.apply()
    info = DistInfo(rank=rank, world_size=world_size)
    init_process_group(CpuDevice(), info, "127.0.0.1", port)
    with spawned_rank():
        for tp in (1, 2):
            recipe = megatron_recipe(Path(model_dir), tensor_model_parallel_size=tp)
            backend = make_megatron_backend(recipe, dist=info)
            batch = make_batch(8)
            share = 8 // backend.dp_size
            rows = list(range(backend.dp_rank * share, (backend.dp_rank + 1) * share))
            part = batch.select(rows)
            log_probs = backend.compute_log_prob(part)["log_probs"]
            metrics = backend.update_policy(part, TokenMeanReinforce())
            weights = {name: tensor.clone() for name, tensor in backend.named_weights()}
            torch.save(
                {
                    "rows": rows,
                    "log_probs": log_probs,
                    "metrics": metrics,
                    "weights": weights,
                    "dp": (backend.dp_rank, backend.dp_size, backend.is_output_rank),
                },
                Path(out) / f"tp{tp}_rank{rank}.pt",
            )
            backend.close()
