"""Tiny models, batches and a real objective for the fsdp2 backend tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from plugrl.data.batch import Batch
from plugrl.parts.algorithm import LossScale
from plugrl.parts.backend import CriticConfig, OptimConfig
from plugrl.parts.context import DistInfo, PartContext
from plugrl.recipe import ClusterConfig, ModelConfig, Recipe, TrainerConfig
from plugrl.testing import save_tiny_model
from plugrl_cpu.device import CpuDevice
from plugrl_fsdp2.backend import FSDP2Backend
from plugrl_fsdp2.config import FSDP2ActorConfig
from tests.support import spawned_rank

VOCAB = 320
"""The tiny model's vocabulary (even, so tensor parallelism can cut it in two)."""


def save_tiny_qwen2(folder: Path, seed: int = 0) -> Path:
    """A Qwen2 model small enough for several backends per test: hidden 64, 2 layers, separate
    input and output embeddings (the case a backend must not tie), with its tokenizer."""
    return save_tiny_model(
        folder,
        seed=seed,
        tokenizer_vocab_size=VOCAB,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )


def make_recipe(
    model_dir: Path,
    *,
    dtype: str = "float32",
    lr: float = 1e-3,
    critic_lr: float = 1e-3,
    optim: dict[str, Any] | None = None,
    critic: dict[str, Any] | None = None,
    gradient_checkpointing: bool = False,
    cluster: str = "local",
    model: dict[str, Any] | None = None,
    **actor: Any,
) -> Recipe:
    actor.setdefault("ppo_mini_batch_size", 8)
    return Recipe(
        model=ModelConfig(
            path=str(model_dir),
            dtype=dtype,
            enable_gradient_checkpointing=gradient_checkpointing,
            **(model or {}),
        ),
        actor=FSDP2ActorConfig(optim=OptimConfig(lr=lr, **(optim or {})), **actor),
        critic=CriticConfig(optim=OptimConfig(lr=critic_lr), **(critic or {})),
        trainer=TrainerConfig(seed=7),
        cluster=ClusterConfig(mode=cluster, num_cpus=2),
    )


def make_backend(
    recipe: Recipe,
    role: str = "actor",
    total_steps: int = 10,
    dist: DistInfo | None = None,
    plugins: Any = None,
) -> FSDP2Backend:
    """The fsdp2 backend of ``recipe``'s actor on the CPU, set up; ``dist`` for a rank of
    several, ``plugins`` where the model needs a plugin (a vision-language model's family)."""
    context = PartContext(
        recipe=recipe, role=role, device=CpuDevice(), dist=dist or DistInfo(), plugins=plugins
    )
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(total_steps)
    return backend


def make_batch(rows: int, prompt: int = 8, response: int = 6, seed: int = 0) -> Batch:
    """Left-padded prompts and right-padded responses of random lengths, with verl columns."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, prompt + 1, (rows,), generator=generator)
    response_lens = torch.randint(1, response + 1, (rows,), generator=generator)
    ids = torch.zeros(rows, prompt + response, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        ids[i, prompt - p : prompt] = torch.randint(1, VOCAB, (p,), generator=generator)
        ids[i, prompt : prompt + r] = torch.randint(1, VOCAB, (r,), generator=generator)
        mask[i, prompt - p : prompt + r] = 1
    response_mask = mask[:, prompt:].clone()
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:].clone(),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response, generator=generator) * response_mask,
            "old_log_probs": torch.zeros(rows, response),
            "returns": torch.randn(rows, response, generator=generator) * response_mask,
            "values": torch.zeros(rows, response),
        }
    )


def plain_log_probs(model_dir: Path, batch: Batch, temperature: float = 1.0) -> tuple:
    """Log-probs and entropy of ``responses`` from the unsharded Hugging Face model."""
    log_probs, entropy, _ = plain_token_columns(model_dir, batch, temperature)
    return log_probs, entropy


def plain_token_columns(model_dir: Path, batch: Batch, temperature: float = 1.0) -> tuple:
    """Log-probs, entropy and the sum of squared probabilities (``sum_v p_v^2``, squared
    directly from the softmax) of ``responses`` from the unsharded Hugging Face model."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    response = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    logits = logits[:, -response - 1 : -1].float() / temperature
    log_softmax = torch.log_softmax(logits, dim=-1)
    log_probs = log_softmax.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    squares = torch.softmax(logits, dim=-1).square().sum(-1)
    mask = batch["attention_mask"][:, -response:]
    return log_probs * mask, entropy * mask, squares * mask


class TokenMeanReinforce:
    """Token-level REINFORCE, ``-A * log_prob`` averaged over every valid token of the global
    mini-batch, whatever the micro-batch split (the LossScale contract)."""

    needs_entropy = False
    needs_ref = False

    def __call__(
        self, micro_batch: Batch, log_prob: torch.Tensor, entropy: Any, scale: LossScale
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro_batch["response_mask"].to(log_prob.dtype)
        per_token = -micro_batch["advantages"] * log_prob * mask
        loss = per_token.sum() * scale.dp_size / scale.num_tokens
        return loss, {"actor/pg_loss": float(loss.detach())}


def objective_value(backend: FSDP2Backend, batch: Batch) -> float:
    """The REINFORCE loss of ``batch`` under the backend's current weights."""
    log_probs = backend.compute_log_prob(batch)["log_probs"]
    mask = batch["response_mask"]
    return float((-batch["advantages"] * log_probs * mask).sum() / mask.sum())


def full_weights(backend: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.float().clone() for name, tensor in backend.named_weights()}


def max_weight_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def rank_log_probs_worker(
    rank: int,
    world_size: int,
    port: int,
    model_dir: str,
    out: str,
    model_options: dict[str, Any] | None = None,
) -> None:
    """One of ``world_size`` spawned ranks: build the actor (only rank 0 may read the weights;
    elsewhere loading them fails) and save the log-probs of :func:`make_batch` ``(8)``, and
    rank 0 the weights ``named_weights`` gathers."""
    import plugrl_fsdp2.backend as backend_module
    from plugrl.cluster.distributed import init_process_group

    torch.set_num_threads(1)
    if rank != 0:

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"rank {rank} read the full weights")

        backend_module.load_model = refuse
    init_process_group(CpuDevice(), DistInfo(rank=rank, world_size=world_size), "127.0.0.1", port)
    with spawned_rank():
        options = dict(model_options or {})
        recipe = make_recipe(Path(model_dir), dtype=options.pop("dtype", "float32"), model=options)
        context = PartContext(
            recipe=recipe,
            role="actor",
            device=CpuDevice(),
            dist=DistInfo(rank=rank, world_size=world_size),
        )
        backend = FSDP2Backend(recipe.actor, context)
        backend.setup(10)
        log_probs = backend.compute_log_prob(make_batch(8))["log_probs"]
        torch.save(log_probs, Path(out) / f"rank{rank}.pt")
        weights = dict(backend.named_weights())
        if rank == 0:
            torch.save(weights, Path(out) / "weights.pt")
