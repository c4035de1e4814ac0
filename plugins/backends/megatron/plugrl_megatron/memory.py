"""The megatron backend's memory terms (the ``estimate_memory`` hook), per rank of the worst
pipeline stage. docs/plan.md explains each term.

No megatron or torch here: the estimate runs before anything is imported or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import (
    MemoryTerm,
    ModelShape,
    PlanContext,
    activation_bytes_per_token_layer,
    dtype_bytes,
    logits_bytes,
    sharded,
)

if TYPE_CHECKING:
    from plugrl.api import Recipe

ALL_PHASES = ("generate", "log_prob", "update")


def stage_parameters(shape: ModelShape, tp: int, pp: int) -> int:
    """Parameters on one rank of the largest pipeline stage: its layers (the first stage also
    holds the embedding, the last the output head; counted once, the larger case) over TP."""
    layers = -(-shape.num_layers // pp)
    table = shape.vocab_size * shape.hidden_size
    ends = table if (pp > 1 or shape.tie_word_embeddings) else 2 * table
    return -(-(layers * shape.layer_parameters() + ends) // tp)


def _activation_per_token(shape: ModelShape, e: int, tp: int) -> int:
    """One layer's activations per token on a TP rank: the norms and projection inputs are
    replicated (sequence parallelism is not built by this backend), the rest split by TP."""
    h = shape.hidden_size
    replicated = 2 * (4 + e) * h + 2 * e * h
    return replicated + (activation_bytes_per_token_layer(shape, e) - replicated) // tp


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """The megatron terms of ``role`` (actor, ref), or None for a role it does not own."""
    actor = recipe.actor
    if actor.backend != "megatron" or role not in ("actor", "ref"):
        return None
    tp, pp, cp = (
        actor.tensor_model_parallel_size,
        actor.pipeline_model_parallel_size,
        actor.context_parallel_size,
    )
    dp = max(context.trainer_ranks // (tp * pp * cp), 1)
    e = dtype_bytes(recipe.model.dtype)
    params = stage_parameters(shape, tp, pp)
    layout = f"TP={tp} PP={pp} CP={cp} DP={dp}"
    if role == "ref":
        phases = ("log_prob",) if actor.ref_param_offload else ALL_PHASES
        return [
            MemoryTerm(
                "parameters", params * e, phases, "ref", note=f"{recipe.model.dtype}, {layout}"
            ),
            *_forward_terms("ref", shape, recipe, context, tp, pp, cp, e),
        ]
    mixed = e != 4
    grad_bytes = 4  # megatron accumulates gradients in float32 buffers
    states = 12 if mixed else 8  # float32 main copy (mixed precision) + two AdamW moments
    optimizer = params * states
    if actor.use_distributed_optimizer:
        optimizer = sharded(optimizer, dp)
    offloaded = optimizer * actor.optimizer_offload_fraction if actor.optimizer_cpu_offload else 0
    optimizer_phases = ("update",) if actor.optimizer_offload else ALL_PHASES
    param_phases = ("log_prob", "update") if actor.param_offload else ALL_PHASES
    grad_phases = ("update",) if actor.grad_offload else ALL_PHASES
    terms = [
        MemoryTerm(
            "parameters",
            params * e,
            param_phases,
            "actor",
            note=f"{params:,} per rank x {e} B, {layout}",
        ),
        MemoryTerm(
            "gradient buffers",
            params * grad_bytes,
            grad_phases,
            "actor",
            note="float32, held between updates unless grad_offload",
        ),
        MemoryTerm(
            "optimizer states",
            int(optimizer - offloaded),
            optimizer_phases,
            "actor",
            note=f"{states} B per parameter"
            + (f", sharded over DP={dp}" if actor.use_distributed_optimizer else "")
            + (" (float32 main copy + 2 AdamW moments)" if mixed else " (2 AdamW moments)")
            + (f", {actor.optimizer_offload_fraction:.0%} in host memory" if offloaded else ""),
        ),
    ]
    tokens = -(-context.update.tokens // cp)
    response = -(-context.update.response_tokens // cp)
    granularity = actor.recompute_granularity or (
        "full" if recipe.model.enable_gradient_checkpointing else None
    )
    layers = -(-shape.num_layers // pp)
    per_layer = _activation_per_token(shape, e, tp)
    if granularity == "full":
        per_token = layers * e * shape.hidden_size + per_layer
        how = "full recompute"
    elif granularity == "selective":
        # the attention core's tensors are recomputed: q, k, v and the attention output
        core = e * (shape.attention_width + 2 * shape.kv_width + shape.attention_width) // tp
        per_token = layers * (per_layer - core)
        how = "selective recompute"
    else:
        per_token = layers * per_layer
        how = "no recompute"
    in_flight = pp  # 1F1B: the first stage holds up to PP micro-batches' activations
    terms.append(
        MemoryTerm(
            "activations",
            tokens * per_token * in_flight,
            ("update",),
            "actor",
            note=f"{tokens:,} tokens x {layers} layers, {how}, {in_flight} micro-batch(es) "
            "in flight",
            instant="actor backward",
        )
    )
    terms += _logit_terms("actor", shape, tokens, response, e, "update", "actor backward")
    terms += _forward_terms("actor", shape, recipe, context, tp, pp, cp, e)
    return terms


def _logit_terms(
    role: str, shape: ModelShape, tokens: int, response: int, e: int, phase: str, instant: str
) -> list[MemoryTerm]:
    """The output layer's logits for every position in model.dtype (gathered over TP), and
    the float32 response logits with their log-softmax buffers (as fsdp2's, docs/plan.md)."""
    if phase == "update":
        return [
            MemoryTerm(
                "logits (float32)",
                logits_bytes(shape, response, 4),
                (phase,),
                role,
                note=f"{response:,} response positions, kept for the log-softmax's backward",
                instant=instant,
            ),
            MemoryTerm(
                "log-softmax backward",
                logits_bytes(shape, response, 8),
                (phase,),
                role,
                note="exp(logits - logsumexp) and its product with the gradient, float32",
                instant=instant,
            ),
            MemoryTerm(
                "logit gradients",
                logits_bytes(shape, response, 4 + e) + logits_bytes(shape, tokens, e),
                (phase,),
                role,
                note=f"float32 and model.dtype, and the output layer's gradient over all "
                f"{tokens:,} positions",
                instant=instant,
            ),
        ]
    return [
        MemoryTerm(
            "logits (model.dtype)",
            logits_bytes(shape, tokens, e),
            (phase,),
            role,
            note=f"every one of {tokens:,} positions, full vocabulary",
            instant=instant,
        ),
        MemoryTerm(
            "logits (float32)",
            logits_bytes(shape, response, 4),
            (phase,),
            role,
            note=f"{response:,} response positions",
            instant=instant,
        ),
        MemoryTerm(
            "log-softmax workspace",
            logits_bytes(shape, response, 4),
            (phase,),
            role,
            note="logsumexp's exp(logits - max)",
            instant=instant,
        ),
    ]


def _forward_terms(
    role: str,
    shape: ModelShape,
    recipe: Recipe,
    context: PlanContext,
    tp: int,
    pp: int,
    cp: int,
    e: int,
) -> list[MemoryTerm]:
    tokens = -(-context.log_prob.tokens // cp)
    response = -(-context.log_prob.response_tokens // cp)
    instant = f"{role} forward"
    working = tokens * (e * shape.hidden_size + _activation_per_token(shape, e, tp))
    return [
        MemoryTerm(
            "forward working set",
            working,
            ("log_prob",),
            role,
            note=f"{tokens:,} tokens, no gradient",
            instant=instant,
        ),
        *_logit_terms(role, shape, tokens, response, e, "log_prob", instant),
    ]
