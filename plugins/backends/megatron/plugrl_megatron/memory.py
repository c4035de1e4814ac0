"""The megatron backend's memory terms (the ``estimate_memory`` hook), per rank of the worst
pipeline stage. docs/plan.md explains each term.

No megatron or torch here: the estimate runs before anything is imported or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from plugrl.api.plan import (
    MemoryTerm,
    ModelShape,
    PlanContext,
    activation_bytes_per_token_layer,
    computes_entropy,
    dtype_bytes,
    log_prob_chunk_tokens,
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
    logits = _logit_terms("actor", shape, recipe, tokens, response, e, "update", "actor backward")
    # the logits' backward instants all come before any layer's backward
    terms += [
        MemoryTerm(
            "activations",
            tokens * per_token * in_flight,
            ("update",),
            "actor",
            note=f"{tokens:,} tokens x {layers} layers, {how}, {in_flight} micro-batch(es) "
            "in flight",
            instant=instant,
        )
        for instant in dict.fromkeys(term.instant for term in logits)
    ]
    terms += logits
    terms += _forward_terms("actor", shape, recipe, context, tp, pp, cp, e)
    return terms


def _chunk_term(
    role: str, shape: ModelShape, recipe: Recipe, response: int, phase: str, instant: str
) -> MemoryTerm:
    """The log-probs' working set: one chunk of the float32 response logits copied out (the
    log-sum-exp and then the gradient are made in that buffer), a second float32 buffer when
    they compute the entropy. The logits they read are float32 already, so no rows in
    model.dtype are read before a cast (as fsdp2's are)."""
    tokens = min(response, log_prob_chunk_tokens(shape.vocab_size))
    buffers = 2 if computes_entropy(recipe, role, phase) else 1
    what = "with the entropy" if buffers == 2 else "no entropy"
    return MemoryTerm(
        "log-prob chunk",
        logits_bytes(shape, tokens, 4 * buffers),
        (phase,),
        role,
        note=f"{tokens:,} tokens at a time x V={shape.vocab_size:,}, {what}: "
        f"{4 * buffers} bytes a logit",
        instant=instant,
    )


def _logit_terms(
    role: str,
    shape: ModelShape,
    recipe: Recipe,
    tokens: int,
    response: int,
    e: int,
    phase: str,
    instant: str,
) -> list[MemoryTerm]:
    """The vocabulary-sized buffers of a micro-batch, as the backend's ``_log_probs`` makes
    them: the output layer gives every position's logits in model.dtype, gathered over TP
    (``parallel_output=False``); a ``gather`` copies out the response positions' rows and
    keeps that whole output for its own backward; the rows are cast to float32 and handed to
    ``plugrl.algorithms.token_log_probs`` with ``overwrite_logits``, which keeps them for its
    backward, reads them a chunk at a time (:func:`_chunk_term`) and writes the gradient over
    them.

    The update's backward goes through these in turn, every activation still held, and
    peaks at one of them: the log-probs' backward (``instant``: the output the gather keeps,
    the float32 rows and the chunk); the cast's backward in bfloat16 or float16 (``<role>
    cast backward``: the float32 gradient and its cast to model.dtype); the gather's backward
    (``<role> output gradient``: the response rows' gradient scattered into a fresh gradient
    over every position, beside the output). The log-prob pass keeps nothing for a backward:
    the output lives through the cast (``<role> output cast``: the gathered rows in
    model.dtype beside their float32 copy) and then beside the log-probs' chunk
    (``instant``)."""
    every = logits_bytes(shape, tokens, e)
    every_note = f"every one of {tokens:,} positions, full vocabulary, model.dtype"
    float_logits = logits_bytes(shape, response, 4)
    chunk = _chunk_term(role, shape, recipe, response, phase, instant)
    if phase == "update":
        response_gradient = MemoryTerm(
            "response logit gradient",
            logits_bytes(shape, response, e),
            (phase,),
            role,
            note=f"{response:,} response positions, cast to model.dtype",
        )
        kept = f"{every_note}, kept by the response rows' gather until its backward ends"
        terms = [
            MemoryTerm("logits (model.dtype)", every, (phase,), role, note=kept, instant=instant),
            MemoryTerm(
                "logits (float32)",
                float_logits,
                (phase,),
                role,
                note=f"{response:,} response positions, kept for the log-probs' backward, "
                "which writes the gradient over them",
                instant=instant,
            ),
            chunk,
        ]
        if e < 4:
            cast_back = f"{role} cast backward"
            terms += [
                MemoryTerm(
                    "logits (model.dtype)", every, (phase,), role, note=kept, instant=cast_back
                ),
                MemoryTerm(
                    "logit gradient (float32)",
                    float_logits,
                    (phase,),
                    role,
                    note="in the float32 logits' storage",
                    instant=cast_back,
                ),
                attrs.evolve(response_gradient, instant=cast_back),
            ]
        later = f"{role} output gradient"
        return [
            *terms,
            MemoryTerm("logits (model.dtype)", every, (phase,), role, note=kept, instant=later),
            MemoryTerm(
                "output gradient",
                every,
                (phase,),
                role,
                note=f"the gather's gradient over all {tokens:,} positions, model.dtype",
                instant=later,
            ),
            attrs.evolve(response_gradient, instant=later),
        ]
    cast = f"{role} output cast"
    return [
        MemoryTerm("logits (model.dtype)", every, (phase,), role, note=every_note, instant=cast),
        MemoryTerm(
            "response logits (model.dtype)",
            logits_bytes(shape, response, e),
            (phase,),
            role,
            note=f"{response:,} response positions gathered out, until their float32 cast",
            instant=cast,
        ),
        MemoryTerm(
            "logits (float32)",
            float_logits,
            (phase,),
            role,
            note=f"{response:,} response positions, the cast",
            instant=cast,
        ),
        MemoryTerm("logits (model.dtype)", every, (phase,), role, note=every_note, instant=instant),
        MemoryTerm(
            "logits (float32)",
            float_logits,
            (phase,),
            role,
            note=f"{response:,} response positions, read by the log-probs",
            instant=instant,
        ),
        chunk,
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
        # the layers' working set is gone by the time the output layer runs
        *_logit_terms(role, shape, recipe, tokens, response, e, "log_prob", f"{role} log-probs"),
    ]
