"""The formulas the memory terms are built from, shared by the plugins that report them.

All sizes are bytes on one device. ``e`` below is the bytes of the compute dtype (2 for
bfloat16), ``h`` the hidden size, ``a`` the query width (heads x head size), ``k`` the key
width (kv heads x head size), ``i`` the MLP's intermediate size, ``V`` the vocabulary, ``L``
the layers, ``T`` the tokens of a micro-batch on one rank and ``R`` its response tokens.
docs/plan.md derives each one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.plan.shape import ModelShape
from plugrl.plan.terms import GIB, MemoryTerm, dtype_bytes

if TYPE_CHECKING:
    from plugrl.plan.context import PlanContext
    from plugrl.recipe import Recipe

ADAM_STATES = 2
"""AdamW keeps two moments per trainable parameter, in the parameters' dtype."""


def sharded(total: int, shards: int) -> int:
    """``total`` bytes split over ``shards`` devices (rounded up)."""
    return -(-total // max(shards, 1))


def activation_bytes_per_token_layer(shape: ModelShape, e: int) -> int:
    """Bytes one decoder layer keeps for its backward per token, without checkpointing.

    Counted tensor by tensor for a Llama/Qwen layer run with SDPA or FlashAttention (the
    ``s x s`` attention scores are never stored, unlike Korthikanti et al.'s ``5 a s^2 b``):

    * two RMSNorms, each its float32 input and its normalized output: ``2 (4 + e) h``;
    * the inputs of the q/k/v and gate/up projections (the norms' outputs): ``2 e h``;
    * q, k, v after the rotary embedding: ``e (a + 2k)``; the attention output, kept by the
      attention kernel and again (made contiguous) as o_proj's input: ``2 e a``; the kernel's
      float32 log-sum-exp per head, ``4 heads``;
    * the MLP: gate and up outputs, silu(gate), and their product (down_proj's input):
      ``4 e i``.
    """
    h, a, k, i = shape.hidden_size, shape.attention_width, shape.kv_width, shape.intermediate_size
    norms = 2 * (4 + e) * h
    projection_inputs = 2 * e * h
    attention = e * (a + 2 * k) + 2 * e * a + 4 * shape.num_heads
    mlp = 4 * e * i
    return norms + projection_inputs + attention + mlp


def training_activations(shape: ModelShape, tokens: int, e: int, checkpointing: bool) -> int:
    """Activations kept for the backward of a micro-batch of ``tokens`` tokens.

    Without checkpointing, every layer's (:func:`activation_bytes_per_token_layer`) plus the
    final norm's ``(4 + e) h`` per token. With checkpointing, each layer keeps only its input
    (``e h`` per token) and one layer at a time is recomputed during the backward, holding its
    full activations: ``T (L e h + layer + (4 + e) h)``.
    """
    layer = activation_bytes_per_token_layer(shape, e)
    final_norm = (4 + e) * shape.hidden_size
    if checkpointing:
        per_token = shape.num_layers * e * shape.hidden_size + layer + final_norm
    else:
        per_token = shape.num_layers * layer + final_norm
    return tokens * per_token


def forward_working_set(shape: ModelShape, tokens: int, e: int) -> int:
    """A forward without gradient holds about one layer's tensors at a time: the residual
    stream and the largest intermediate tensors of the layer it runs
    (:func:`activation_bytes_per_token_layer` per token, an upper bound)."""
    return tokens * (e * shape.hidden_size + activation_bytes_per_token_layer(shape, e))


def logits_bytes(shape: ModelShape, response_tokens: int, element_bytes: int) -> int:
    """One vocabulary-sized buffer over the response tokens: ``R V`` elements."""
    return response_tokens * shape.vocab_size * element_bytes


def computes_entropy(recipe: Recipe, role: str, phase: str) -> bool:
    """Whether ``role``'s log-probs of ``phase`` compute the entropy too: the actor's log-prob
    pass does (the ``actor/entropy`` metric), its update with an entropy bonus, or when it
    may take the old log-probs from its own forward (``actor.reuse_on_policy_log_prob`` with
    one optimizer step a batch), which reports the metric instead."""
    if role != "actor":
        return False
    if phase == "log_prob":
        return True
    actor = recipe.actor
    derives = (
        actor.reuse_on_policy_log_prob
        and actor.ppo_epochs == 1
        and actor.ppo_mini_batch_size == recipe.data.train_batch_size
    )
    return bool(actor.entropy_coeff) or derives


def kv_cache_bytes(shape: ModelShape, tokens: int, e: int, tensor_parallel: int = 1) -> int:
    """The KV cache of ``tokens`` tokens: ``2 L k e`` per token (a key and a value per
    layer), the kv heads split over ``tensor_parallel`` devices (at least one head each)."""
    heads = max(-(-shape.num_kv_heads // tensor_parallel), 1)
    return 2 * shape.num_layers * heads * shape.head_dim * e * tokens


def rollout_dtype(recipe: Recipe) -> str:
    """The engines' dtype: ``rollout.dtype``, ``auto`` counted as bfloat16 (what it picks on
    accelerators)."""
    return "bfloat16" if recipe.rollout.dtype == "auto" else recipe.rollout.dtype


def engine_rows(recipe: Recipe, context: PlanContext) -> int:
    """Sequences one engine holds at once: its share of a step's rows, at most
    ``rollout.max_num_seqs``."""
    engines = max(context.rollout_devices // recipe.rollout.tensor_model_parallel_size, 1)
    return min(-(-context.rollout_rows // engines), recipe.rollout.max_num_seqs)


def engine_phases(recipe: Recipe, context: PlanContext) -> tuple[str, ...]:
    """The phases an engine occupies its devices in: only ``generate`` when it shares them
    with the trainer on Ray and sleeps while the trainer runs (``rollout.free_cache_engine``),
    else all of them (an engine in the trainer's own process, ``cluster.mode=local``, keeps
    its weights and cache)."""
    if context.colocated and recipe.rollout.free_cache_engine and recipe.cluster.mode == "ray":
        return ("generate",)
    return ("generate", "log_prob", "update")


def reserved_engine_terms(
    recipe: Recipe,
    shape: ModelShape,
    context: PlanContext,
    role: str,
    graphs: int,
    activations_tokens: int,
) -> list[MemoryTerm]:
    """The terms of an engine that reserves ``rollout.gpu_memory_utilization`` of the device
    (vLLM, SGLang): its weights in the rollout dtype split over tensor parallelism, the CUDA
    graphs allowance ``graphs``, a forward of ``activations_tokens`` tokens, and the KV cache:
    the rest of the reservation when the device memory is known, else the batch's tokens."""
    tp = recipe.rollout.tensor_model_parallel_size
    e = dtype_bytes(rollout_dtype(recipe))
    phases = engine_phases(recipe, context)
    weights = sharded(shape.parameters() * e, tp)
    working = forward_working_set(shape, -(-activations_tokens // tp), e)
    terms = [
        MemoryTerm(
            "engine weights",
            weights,
            phases,
            role,
            note=f"{shape.parameters():,} x {e} B ({rollout_dtype(recipe)}) over TP={tp}",
        ),
        MemoryTerm(
            "engine forward",
            working,
            phases,
            role,
            note=f"a forward of {activations_tokens:,} batched tokens",
        ),
    ]
    if graphs:
        terms.append(MemoryTerm("CUDA graphs", graphs, phases, role, note="captured decode graphs"))
    rows = engine_rows(recipe, context)
    needed = kv_cache_bytes(shape, rows * context.sequence_length, e, tp)
    gmu = recipe.rollout.gpu_memory_utilization
    if context.device_memory is None:
        terms.append(
            MemoryTerm(
                "KV cache",
                needed,
                phases,
                role,
                note=f"{rows} sequences x {context.sequence_length:,} tokens (device memory "
                "unknown: the batch's own need, not the gpu_memory_utilization reservation)",
            )
        )
        return terms
    reserved = int(gmu * context.device_memory)
    pool = reserved - weights - working - graphs
    terms.append(
        MemoryTerm(
            "KV cache",
            max(pool, 0),
            phases,
            role,
            note=f"gpu_memory_utilization={gmu} reserves {reserved / GIB:.1f} GiB; the rest after "
            f"weights is the cache (the batch needs {needed / GIB:.2f} GiB: "
            + ("room enough" if pool >= needed else "it runs in waves")
            + ")",
        )
    )
    return terms
