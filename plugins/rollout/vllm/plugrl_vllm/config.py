"""Recipe keys of the ``vllm`` rollout engine (beside the common ``rollout`` keys), and how
they become vLLM's engine arguments. Nothing here imports vLLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.api import RecipeError, option, positive
from plugrl.api.rollout import RolloutConfig, lora_sync_mode

if TYPE_CHECKING:
    from plugrl.api import EngineSpan, Recipe

WEIGHT_ROUTES = ("auto", "reload_weights", "load_weights")

# How new weights enter vLLM's model, per device, for weight_route: auto.
#  * reload_weights: the model runner's reload_weights(weights_iterator=...), which restores
#    the layers to their checkpoint layout, loads, and processes them again. The only route
#    that works on the CPU build: it repacks linear weights for oneDNN after loading, so the
#    model's own load_weights writes into tensors the kernels no longer read.
#  * load_weights: the model's load_weights(weights), what verl and OpenRLHF call on CUDA.
DEFAULT_WEIGHT_ROUTE = {"cpu": "reload_weights"}
FALLBACK_WEIGHT_ROUTE = "load_weights"
BROKEN_WEIGHT_ROUTES = {
    ("cpu", "load_weights"): (
        "vLLM's CPU build repacks linear weights for oneDNN after loading, so the model's "
        "load_weights leaves the kernels on the old weights"
    ),
}

# The values vLLM 0.32 accepts for max_lora_rank (its LoRAConfig refuses others): an adapter
# of rank r gets the smallest one >= r
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Engine arguments plugrl sets from the recipe: engine_kwargs may not set them again (the
# recipe key is the one place to set each).
OWNED_ENGINE_ARGS = {
    "model": "model.path",
    "tokenizer": "model.tokenizer_path",
    "dtype": "rollout.dtype",
    "seed": "trainer.seed",
    "trust_remote_code": "model.trust_remote_code",
    "tensor_parallel_size": "rollout.tensor_model_parallel_size",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "max_num_seqs": "rollout.max_num_seqs",
    "enable_chunked_prefill": "rollout.enable_chunked_prefill",
    "max_num_batched_tokens": "rollout.max_num_batched_tokens",
    "max_model_len": "rollout.max_model_len",
    "enforce_eager": "rollout.enforce_eager",
    "enable_sleep_mode": "rollout.free_cache_engine",
    "logprobs_mode": "(fixed: processed_logprobs, the log-probs the trainer computes)",
}


@attrs.define(kw_only=True)
class VLLMRolloutConfig(RolloutConfig):
    """``rollout`` with ``engine: vllm``: sampling with vLLM's ``AsyncLLM`` in the engine's
    process."""

    # vLLM applies LoRA adapters per request on top of the base weights it loaded
    supports_lora_adapters: ClassVar[bool] = True

    enable_chunked_prefill: bool = option(
        True,
        "Split long prompts into chunks scheduled beside running decodes.",
        verl="actor_rollout_ref.rollout.enable_chunked_prefill",
    )
    max_num_batched_tokens: int = option(
        8192,
        "Tokens (prompt chunks + decodes) the engine computes in one step.",
        verl="actor_rollout_ref.rollout.max_num_batched_tokens",
        validator=positive,
    )
    max_model_len: int | None = option(
        None,
        "Longest sequence (prompt + response) the engine holds; null is "
        "data.max_prompt_length + data.max_response_length.",
        verl="actor_rollout_ref.rollout.max_model_len",
    )
    enforce_eager: bool | None = option(
        None,
        "Run the model eagerly, without CUDA graphs or compilation; null is true on cpu "
        "(nothing to capture there) and false on accelerators.",
        verl="actor_rollout_ref.rollout.enforce_eager",
    )
    weight_route: str = option(
        "auto",
        "How pushed weights enter vLLM's model: reload_weights (the model runner reloads the "
        "layers in their checkpoint layout and processes them again; the only route that "
        "works on cpu), load_weights (the model's own load_weights, as verl and OpenRLHF do "
        "on CUDA), or auto: reload_weights on cpu, load_weights elsewhere.",
        choices=WEIGHT_ROUTES,
    )
    engine_kwargs: dict[str, Any] = option(
        factory=dict,
        help="More vLLM engine arguments (AsyncEngineArgs fields), passed as they are.",
        verl="actor_rollout_ref.rollout.engine_kwargs.vllm",
    )
    engine_log_level: str | None = option(
        None,
        "How much of vLLM's own logging to show: debug, info, warning or error; null is "
        "VLLM_LOGGING_LEVEL when set, else info under plugrl -v and warning otherwise "
        "(vLLM's start-up and per-step lines, and its model-loading bar, hidden).",
        choices=[None, "debug", "info", "warning", "error"],
    )


def resolve_weight_route(config: VLLMRolloutConfig, device_name: str) -> str:
    """The weight route the engine uses on ``device_name``; a route known not to work there
    is an error, never replaced by another."""
    route = config.weight_route
    if route == "auto":
        return DEFAULT_WEIGHT_ROUTE.get(device_name, FALLBACK_WEIGHT_ROUTE)
    why = BROKEN_WEIGHT_ROUTES.get((device_name, route))
    if why:
        raise RecipeError(
            f"{route} does not work on {device_name}: {why}; set it to auto or "
            f"{DEFAULT_WEIGHT_ROUTE[device_name]}",
            key="rollout.weight_route",
        )
    return route


def engine_args(
    config: VLLMRolloutConfig,
    recipe: Recipe,
    device_name: str,
    dtype: str,
    engine_span: EngineSpan | None = None,
) -> dict[str, Any]:
    """The keyword arguments of vLLM's ``AsyncEngineArgs`` for this run; ``dtype`` is
    ``rollout.dtype`` resolved for the engine's device, ``engine_span`` where the engine's
    devices are when they sit on several Ray nodes (see :func:`cross_node_environment`)."""
    model = recipe.model
    if not model.path:
        raise RecipeError(
            "the vllm rollout engine loads the model from a folder; set model.path",
            key="model.path",
        )
    clashes = sorted(set(config.engine_kwargs) & set(OWNED_ENGINE_ARGS))
    if clashes:
        name = clashes[0]
        raise RecipeError(
            f"rollout.engine_kwargs sets {name}, which plugrl sets from "
            f"{OWNED_ENGINE_ARGS[name]}; set it there and remove it from engine_kwargs",
            key="rollout.engine_kwargs",
        )
    max_model_len = config.max_model_len or (
        recipe.data.max_prompt_length + recipe.data.max_response_length
    )
    batched_tokens = config.max_num_batched_tokens
    if not config.enable_chunked_prefill:
        # without chunks a whole prompt must fit in one step
        batched_tokens = max(batched_tokens, max_model_len)
    enforce_eager = config.enforce_eager
    if enforce_eager is None:
        enforce_eager = device_name == "cpu"
    args: dict[str, Any] = {
        "model": str(model.path),
        "tokenizer": str(model.tokenizer_path or model.path),
        "dtype": dtype,
        "seed": recipe.trainer.seed,
        "trust_remote_code": model.trust_remote_code,
        "tensor_parallel_size": config.tensor_model_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_num_seqs": config.max_num_seqs,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "max_num_batched_tokens": batched_tokens,
        "max_model_len": max_model_len,
        "enforce_eager": enforce_eager,
        # sleep frees device memory between rollouts; the CPU build has no sleep mode
        "enable_sleep_mode": config.free_cache_engine and device_name != "cpu",
        "logprobs_mode": "processed_logprobs",
    }
    if model.override_config:
        args["hf_overrides"] = dict(model.override_config)
    if lora_sync_mode(recipe, device_name) == "adapters":
        # one adapter, the actor's latest, applied to every request
        args.update(enable_lora=True, max_loras=1, max_lora_rank=lora_rank_slot(recipe))
    if config.tensor_model_parallel_size > 1 and config.colocate and recipe.cluster.mode == "ray":
        # the engine's actor sees the devices of its trainer ranks (plugrl.cluster.engines);
        # inside a Ray placement group vLLM would otherwise ask Ray for devices of its own,
        # which the trainer's ranks hold
        args["distributed_executor_backend"] = "mp"
    if engine_span is not None:
        # processes of one machine cannot reach another's devices: vLLM's Ray executor starts
        # a worker per device as a Ray actor, on the bundles cross_node_environment names
        args["distributed_executor_backend"] = "ray"
    args.update(config.engine_kwargs)
    return args


def cross_node_environment(engine_span: EngineSpan) -> dict[str, str]:
    """What vLLM's Ray executor reads to place the workers of an engine whose devices are on
    several Ray nodes: one worker per bundle of the span, tensor-parallel rank ``i`` on the
    span's ``i``-th bundle (``VLLM_RAY_BUNDLE_INDICES``), each asking Ray for the engine's
    share of its bundle's device (``VLLM_RAY_PER_WORKER_GPUS``). vLLM takes the placement
    group from the engine's actor, which runs in it. Set before vLLM starts its executor."""
    return {
        "VLLM_RAY_BUNDLE_INDICES": ",".join(str(b) for b in engine_span.bundles),
        "VLLM_RAY_PER_WORKER_GPUS": repr(engine_span.device_share),
    }


def lora_rank_slot(recipe: Recipe) -> int:
    """The ``max_lora_rank`` for the actor's adapters: the smallest rank vLLM accepts that
    holds ``model.lora_rank``, or the rank of ``model.lora_adapter_path``'s adapter (and of
    its per-module ranks) when that is larger."""
    rank = recipe.model.lora_rank
    folder = recipe.model.lora_adapter_path
    if folder:
        config_file = Path(folder) / "adapter_config.json"
        if config_file.is_file():
            saved = json.loads(config_file.read_text())
            ranks = [saved.get("r", 0), *(saved.get("rank_pattern") or {}).values()]
            rank = max(rank, *(int(value) for value in ranks))
    for slot in VLLM_LORA_RANKS:
        if slot >= rank:
            return slot
    raise RecipeError(
        f"is {rank}, above the largest LoRA rank vLLM serves ({VLLM_LORA_RANKS[-1]}); lower "
        "it, or set rollout.lora_sync=merged to send merged weights",
        key="model.lora_rank",
    )
