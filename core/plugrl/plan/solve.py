"""What to change when a recipe does not fit: the largest value of a key that fits
(bisection over the estimate), and the smallest of the usual changes that makes every phase
fit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from plugrl.errors import RecipeError
from plugrl.plan.terms import Plan, Suggestion

PlanOf = Callable[[Sequence[str]], Plan]
"""A plan of the recipe with some ``KEY=VALUE`` overrides added."""

FRACTION_STEP = 0.01
"""The resolution of a fraction key (``rollout.gpu_memory_utilization``) when solving."""
INT_CEILING = 1 << 24
"""The largest integer :func:`solve_key` tries when the current value fits already."""


def _fits(plan_of: PlanOf, key: str, value: Any) -> tuple[bool, Plan | None]:
    try:
        plan = plan_of([f"{key}={value}"])
    except RecipeError:  # a value the recipe refuses (a divisor that does not divide)
        return False, None
    return bool(plan.fits), plan


def solve_key(plan_of: PlanOf, key: str, current: Any) -> tuple[Any, Plan] | None:
    """The largest value of the numeric ``key`` that makes every phase fit, with its plan;
    None when even the smallest does not. The peak is taken to grow with the value
    (micro-batch sizes, token budgets, lengths, ``rollout.n``), so a bisection finds it;
    a fraction (``gpu_memory_utilization``) is searched on a grid of :data:`FRACTION_STEP`
    from 0 to 1."""
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        raise RecipeError(
            f"--solve needs a numeric key, and {key} is {current!r}; solve a micro-batch size, "
            "a token budget, a length, rollout.n or gpu_memory_utilization",
            key=key,
        )
    if isinstance(current, float):
        scale = round(1 / FRACTION_STEP)
        low, high = 1, scale
        to_value: Callable[[int], Any] = lambda step: step / scale  # noqa: E731
        fits, plan = _fits(plan_of, key, 1.0)
        if fits and plan is not None:
            return 1.0, plan
    else:
        low, high = 1, max(current, 1)
        fits, _ = _fits(plan_of, key, high)
        while fits and high < INT_CEILING:
            low, high = high, high * 2
            fits, _ = _fits(plan_of, key, high)
        if fits:
            high += 1
        to_value = int
    fits, plan = _fits(plan_of, key, to_value(low))
    if plan is None:
        # the smallest values may be refused (a token budget under the longest row): find the
        # first value the recipe takes, doubling, then bisecting back
        refused = low
        while plan is None and low * 2 < high:
            refused, low = low, low * 2
            fits, plan = _fits(plan_of, key, to_value(low))
        if plan is None:
            return None
        while low - refused > 1:
            middle = (low + refused) // 2
            middle_fits, middle_plan = _fits(plan_of, key, to_value(middle))
            if middle_plan is None:
                refused = middle
            else:
                low, fits, plan = middle, middle_fits, middle_plan
    if not fits or plan is None:
        return None
    best: tuple[Any, Plan] = (to_value(low), plan)
    # invariant: low fits, high does not (or is past the ceiling)
    while high - low > 1:
        middle = (low + high) // 2
        fits, plan = _fits(plan_of, key, to_value(middle))
        if fits and plan is not None:
            low, best = middle, (to_value(middle), plan)
        else:
            high = middle
    return best


def _numeric_candidates(recipe: Any) -> list[tuple[str, Any, str]]:
    """(key, current value, why) for the numeric keys worth lowering."""
    actor, rollout, data = recipe.actor, recipe.rollout, recipe.data
    keys: list[tuple[str, Any, str]] = []
    if actor.use_dynamic_bsz:
        keys.append(
            (
                "actor.ppo_max_token_len_per_gpu",
                actor.ppo_max_token_len_per_gpu,
                "fewer tokens per micro-batch: smaller activations and logits",
            )
        )
    elif actor.ppo_micro_batch_size_per_gpu:
        keys.append(
            (
                "actor.ppo_micro_batch_size_per_gpu",
                actor.ppo_micro_batch_size_per_gpu,
                "fewer sequences per micro-batch: smaller activations and logits",
            )
        )
    keys.append(
        (
            "data.max_response_length",
            data.max_response_length,
            "shorter responses: less KV cache, activations and logits",
        )
    )
    keys.append(("rollout.n", rollout.n, "fewer responses per prompt: a smaller KV cache"))
    return keys


def _switch_candidates(recipe: Any, ranks: int) -> list[tuple[str, str]]:
    """(override, why) for the on/off and parallelism changes the recipe can take."""
    actor, model = recipe.actor, recipe.model
    changes: list[tuple[str, str]] = []
    if not model.enable_gradient_checkpointing:
        changes.append(
            (
                "model.enable_gradient_checkpointing=true",
                "keep only each layer's input, recompute the rest in backward",
            )
        )
    if hasattr(actor, "param_offload") and not actor.param_offload:
        changes.append(
            ("actor.param_offload=true", "parameters and optimizer states in host memory")
        )
    if hasattr(actor, "optimizer_offload") and not actor.optimizer_offload:
        changes.append(
            ("actor.optimizer_offload=true", "optimizer states in host memory outside updates")
        )
    if getattr(type(actor), "supports_lora", False) and model.lora_rank == 0:
        changes.append(("model.lora_rank=32", "train LoRA adapters; the base weights stay frozen"))
    sp = getattr(actor, "ulysses_sequence_parallel_size", None)
    if sp is not None and ranks % (sp * 2) == 0:
        changes.append(
            (
                f"actor.ulysses_sequence_parallel_size={sp * 2}",
                "split each sequence over more ranks",
            )
        )
    tp = getattr(actor, "tensor_model_parallel_size", None)
    if tp is not None and ranks % (tp * 2) == 0:
        changes.append(
            (f"actor.tensor_model_parallel_size={tp * 2}", "split each layer over more ranks")
        )
    rollout_tp = recipe.rollout.tensor_model_parallel_size
    if ranks % (rollout_tp * 2) == 0:
        changes.append(
            (
                f"rollout.tensor_model_parallel_size={rollout_tp * 2}",
                "split the engine's weights and KV cache over more devices",
            )
        )
    return changes


def suggest(plan_of: PlanOf, recipe: Any, ranks: int) -> list[Suggestion]:
    """Single changes that make every phase fit, each the smallest of its kind: the largest
    value of a numeric key that fits, or one switch. Empty when the recipe fits or nothing
    tried fits alone."""
    suggestions: list[Suggestion] = []
    for key, current, why in _numeric_candidates(recipe):
        found = solve_key(plan_of, key, current)
        if found is not None and found[0] < current:
            value, plan = found
            worst = plan.worst()
            suggestions.append(Suggestion(f"{key}={value}", worst.peak if worst else 0, why))
    gmu = recipe.rollout.gpu_memory_utilization
    if recipe.rollout.engine in ("vllm", "sglang"):
        found = solve_key(plan_of, "rollout.gpu_memory_utilization", gmu)
        if found is not None and found[0] < gmu:
            value, plan = found
            worst = plan.worst()
            suggestions.append(
                Suggestion(
                    f"rollout.gpu_memory_utilization={value}",
                    worst.peak if worst else 0,
                    "a smaller engine reservation (less KV cache)",
                )
            )
    for override, why in _switch_candidates(recipe, ranks):
        try:
            plan = plan_of([override])
        except RecipeError:
            continue
        if plan.fits:
            worst = plan.worst()
            suggestions.append(Suggestion(override, worst.peak if worst else 0, why))
    return suggestions
