"""The fsdp2 backend's memory terms (the ``estimate_memory`` hook): what one rank of the actor,
the reference model and the critic holds, per phase. docs/plan.md explains each term.

No torch here: the estimate runs before anything is imported or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api.plan import (
    ADAM_STATES,
    MemoryTerm,
    MicroBatch,
    ModelShape,
    PlanContext,
    computes_entropy,
    dtype_bytes,
    forward_working_set,
    log_prob_chunk_tokens,
    logits_bytes,
    sharded,
    training_activations,
)

if TYPE_CHECKING:
    from plugrl.api import Recipe

ALL_PHASES = ("generate", "log_prob", "update")


def shard_count(recipe: Recipe, ranks: int) -> int:
    """Ranks one copy of the weights is sharded over: ``actor.fsdp_size`` (-1: all ranks)."""
    size = recipe.actor.fsdp_size
    return ranks if size == -1 else min(size, ranks)


def offloads(recipe: Recipe) -> bool:
    """Whether ``actor.param_offload`` moves the weights, gradients and optimizer state off
    the device: not on the cpu device, where the backend ignores it (the host memory is the
    device's, and the measured peak is the same with and without it)."""
    return recipe.actor.param_offload and recipe.device.name != "cpu"


def _dtypes(recipe: Recipe) -> tuple[int, int]:
    """(bytes of a trainable parameter, bytes of the compute dtype)."""
    compute = dtype_bytes(recipe.model.dtype)
    mixed = recipe.actor.mixed_precision and recipe.model.dtype != "float32"
    return (4 if mixed else compute), compute


def _state_terms(
    role: str,
    parameters: int,
    trainable: int,
    frozen: int,
    recipe: Recipe,
    shards: int,
) -> list[MemoryTerm]:
    """Parameters, gradients and AdamW states of a trained model, sharded over ``shards``."""
    param_bytes, compute = _dtypes(recipe)
    offload = offloads(recipe)
    where = "in host memory (param_offload)" if offload else f"sharded over {shards} ranks"
    held = 0 if offload else 1
    terms = [
        MemoryTerm(
            "parameters",
            held * sharded(trainable * param_bytes, shards),
            ALL_PHASES,
            role,
            note=f"{trainable:,} trainable x {param_bytes} B, {where}",
        ),
        MemoryTerm(
            "gradients",
            held * sharded(trainable * param_bytes, shards),
            ("update",),
            role,
            note=f"{trainable:,} x {param_bytes} B, {where}; freed after each step",
        ),
        MemoryTerm(
            "optimizer states",
            held * sharded(ADAM_STATES * trainable * param_bytes, shards),
            ALL_PHASES,
            role,
            note=f"AdamW: {ADAM_STATES} moments x {trainable:,} x {param_bytes} B, {where}",
        ),
    ]
    if frozen:
        terms.append(
            MemoryTerm(
                "frozen base weights",
                held * sharded(frozen * compute, shards),
                ALL_PHASES,
                role,
                note=f"{frozen:,} x {compute} B (model.dtype), {where}",
            )
        )
    return terms


def _gathered(
    role: str,
    shape: ModelShape,
    recipe: Recipe,
    shards: int,
    phases: tuple[str, ...],
    instant: str,
) -> MemoryTerm:
    """Weights gathered whole while a forward or backward runs, in model.dtype.

    The backend shards each decoder layer and then the root (the embeddings, the final norm
    and an untied head). The root's forward encloses the layers', so its weights stay gathered
    through the whole pass, beside the running layer's; over several ranks FSDP2 also gathers
    the next layer ahead (prefetch), on one rank it gathers nothing ahead (measured on the
    CPU: bench/bench_memory_plan.py). Gathering on one rank still copies: the sharded and the
    gathered weights are different storages."""
    compute = dtype_bytes(recipe.model.dtype)
    if recipe.actor.reshard_after_forward:
        root = shape.embedding_parameters() + shape.hidden_size
        ahead = 1 if shards > 1 else 0
        units = root + (1 + ahead) * shape.layer_parameters()
        note = "the root (embeddings, final norm) through the pass, and the running layer" + (
            " and the next one prefetched" if ahead else ""
        )
    else:
        units = shape.parameters()
        note = "reshard_after_forward=false: the whole model stays gathered until backward"
    return MemoryTerm("gathered weights", units * compute, phases, role, note=note, instant=instant)


def _scored_positions(recipe: Recipe, batch: MicroBatch) -> int:
    """Positions whose logits the log-probs read on one rank in ``batch``, by the layout the
    backend runs: the response tokens (the model keeps only the outputs that predict them),
    or under Ulysses every position of the rank's slice of the sequences, prompt included."""
    if recipe.actor.sequence_parallel_size() > 1:
        return batch.tokens
    return batch.response_tokens


def _positions_note(recipe: Recipe, positions: int) -> str:
    if recipe.actor.sequence_parallel_size() > 1:
        return f"{positions:,} positions (Ulysses scores its whole slice)"
    return f"{positions:,} response tokens"


def _chunk_term(
    role: str, shape: ModelShape, recipe: Recipe, positions: int, phase: str, instant: str
) -> MemoryTerm:
    """The log-probs' working set: a chunk of tokens' logits in float32 (the log-sum-exp and
    the gradient are made in that buffer), a second float32 buffer when they compute the
    entropy, and in bfloat16 the rows read before their cast (the gradient's cast back, in
    the backward)."""
    compute = dtype_bytes(recipe.model.dtype)
    tokens = min(positions, log_prob_chunk_tokens(shape.vocab_size))
    buffers = 2 if computes_entropy(recipe, role, phase) else 1
    per_logit = 4 * buffers + (compute if compute < 4 else 0)
    what = "with the entropy" if buffers == 2 else "no entropy"
    return MemoryTerm(
        "log-prob chunk",
        logits_bytes(shape, tokens, per_logit),
        (phase,),
        role,
        note=f"{tokens:,} tokens at a time x V={shape.vocab_size:,}, {what}: {per_logit} "
        "bytes a logit",
        instant=instant,
    )


def _vocab_terms(
    role: str, shape: ModelShape, recipe: Recipe, batch: MicroBatch, phase: str, instant: str
) -> list[MemoryTerm]:
    """The vocabulary-sized buffers over a micro-batch's scored positions
    (:func:`_scored_positions`).

    The log-probs (``plugrl.algorithms.token_log_probs``) read the lm_head's output where it
    lies, a chunk of tokens at a time in float32, and keep only that output and a logsumexp per
    token for the backward, which writes the gradient over the output chunk by chunk. So the
    update peaks as its backward starts, every activation still held, with the lm_head output
    in model.dtype (2 bytes a logit in bfloat16, 4 in float32) and one chunk's working set
    (:func:`_chunk_term`): counted on the CPU (bench/bench_memory_plan.py). A temperature
    divides each chunk in place, and an entropy with its gradient reuses the chunk's buffers.
    The log-prob pass keeps nothing for a backward: the lm_head output lives while the root's
    weights are gathered, and then beside the chunk."""
    compute = dtype_bytes(recipe.model.dtype)
    positions = _scored_positions(recipe, batch)
    lm_head_output = logits_bytes(shape, positions, compute)
    head_note = f"{_positions_note(recipe, positions)} x V={shape.vocab_size:,} in model.dtype"
    chunk = _chunk_term(role, shape, recipe, positions, phase, instant)
    if phase == "log_prob":
        lm_head = f"{role} lm_head"
        root = (shape.embedding_parameters() + shape.hidden_size) * compute
        return [
            MemoryTerm(
                "gathered weights",
                root,
                (phase,),
                role,
                note="the root (embeddings, final norm), gathered while lm_head runs",
                instant=lm_head,
            ),
            MemoryTerm(
                "lm_head output", lm_head_output, (phase,), role, note=head_note, instant=lm_head
            ),
            MemoryTerm(
                "lm_head output",
                lm_head_output,
                (phase,),
                role,
                note=head_note + ", read by the log-probs",
                instant=instant,
            ),
            chunk,
        ]
    return [
        MemoryTerm(
            "lm_head output",
            lm_head_output,
            (phase,),
            role,
            note=head_note + ", kept for the log-probs' backward, which writes the gradient "
            "over it",
            instant=instant,
        ),
        chunk,
    ]


def _trained_model_terms(
    role: str, shape: ModelShape, recipe: Recipe, context: PlanContext, *, lora: bool
) -> list[MemoryTerm]:
    ranks = context.trainer_ranks
    shards = shard_count(recipe, ranks)
    compute = dtype_bytes(recipe.model.dtype)
    total = shape.parameters()
    if lora:
        trainable = shape.lora_parameters(recipe.model.lora_rank, recipe.model.target_modules)
        frozen = total
    else:
        trainable, frozen = total, 0
    terms = _state_terms(role, total, trainable, frozen, recipe, shards)
    checkpointing = recipe.model.enable_gradient_checkpointing
    update, log_prob = context.update, context.log_prob
    backward = f"{role} backward"
    terms.append(
        MemoryTerm(
            "activations",
            training_activations(shape, update.tokens, compute, checkpointing),
            ("update",),
            role,
            note=f"{update.tokens:,} tokens per micro-batch, "
            + ("gradient checkpointing" if checkpointing else "no checkpointing"),
            instant=backward,
        )
    )
    terms.append(_gathered(role, shape, recipe, shards, ("update", "log_prob"), backward))
    if role == "critic":
        terms.append(
            MemoryTerm(
                "value head output",
                update.tokens * 4 * 3,
                ("update",),
                role,
                note="float32 values, returns and their gradient per token",
                instant=backward,
            )
        )
    else:
        terms += _vocab_terms(role, shape, recipe, update, "update", backward)
    forward = f"{role} forward"
    terms.append(
        MemoryTerm(
            "forward working set",
            forward_working_set(shape, log_prob.tokens, compute),
            ("log_prob",),
            role,
            note=f"{log_prob.tokens:,} tokens, no gradient: one layer at a time",
            instant=forward,
        )
    )
    terms.append(_gathered(role, shape, recipe, shards, ("log_prob",), forward))
    if role != "critic":
        # after the layers: their working set and gathered weights are gone by then
        head = f"{role} log-probs"
        terms += _vocab_terms(role, shape, recipe, log_prob, "log_prob", head)
    param_bytes, _ = _dtypes(recipe)
    if not offloads(recipe):
        terms.append(
            MemoryTerm(
                "optimizer step temporaries",
                sharded(trainable * param_bytes, shards),
                ("update",),
                role,
                note="AdamW's foreach step: one parameter-sized intermediate",
                instant=f"{role} optimizer step",
            )
        )
    return terms


def _reference_terms(shape: ModelShape, recipe: Recipe, context: PlanContext) -> list[MemoryTerm]:
    compute = dtype_bytes(recipe.model.dtype)
    shards = shard_count(recipe, context.trainer_ranks)
    offload = offloads(recipe)
    log_prob = context.log_prob
    forward = "ref forward"
    return [
        MemoryTerm(
            "parameters",
            0 if offload else sharded(shape.parameters() * compute, shards),
            ALL_PHASES,
            "ref",
            note=f"{shape.parameters():,} x {compute} B (model.dtype), frozen, "
            + ("in host memory (param_offload)" if offload else f"sharded over {shards} ranks"),
        ),
        MemoryTerm(
            "forward working set",
            forward_working_set(shape, log_prob.tokens, compute),
            ("log_prob",),
            "ref",
            note=f"{log_prob.tokens:,} tokens, no gradient",
            instant=forward,
        ),
        _gathered("ref", shape, recipe, shards, ("log_prob",), forward),
        *_vocab_terms("ref", shape, recipe, log_prob, "log_prob", "ref log-probs"),
    ]


def estimate_memory(
    recipe: Recipe, role: str, shape: ModelShape, context: PlanContext
) -> list[MemoryTerm] | None:
    """The fsdp2 terms of ``role`` (actor, ref, critic), or None for a role it does not own."""
    if recipe.actor.backend != "fsdp2" or role not in ("actor", "ref", "critic"):
        return None
    if role == "actor":
        return _trained_model_terms(
            "actor", shape, recipe, context, lora=recipe.model.lora_rank > 0
        )
    if role == "ref":
        return _reference_terms(shape, recipe, context)
    critic_shape = context.shape_of(recipe.critic.model_path) if recipe.critic.model_path else shape
    return _trained_model_terms("critic", critic_shape, recipe, context, lora=False)
