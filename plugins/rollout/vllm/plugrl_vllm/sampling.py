"""plugrl's sampling parameters as vLLM's, one sample per vLLM request. Nothing here imports
vLLM: :func:`sampling_kwargs` gives the keyword arguments of ``vllm.SamplingParams``."""

from __future__ import annotations

from typing import Any

from plugrl.api.rollout import SamplingParams


def sampling_kwargs(params: SamplingParams, seed: int) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments of one sample of a request.

    Each sample is its own vLLM request with its own ``seed`` (see
    :func:`plugrl.parts.rollout.derive_seed`), so a sample draws the same tokens whatever runs
    beside it. ``logprobs=0`` asks for the sampled token's log-probability only; with the
    engine's ``logprobs_mode="processed_logprobs"`` it is taken after temperature, top-k and
    top-p, as the trainer computes it. Tokens arrive as deltas, so a request ended early keeps
    what it had.
    """
    kwargs: dict[str, Any] = {
        "n": 1,
        # vLLM treats temperature 0 as greedy, as plugrl does
        "temperature": params.temperature,
        "top_p": params.top_p,
        # plugrl takes 0 or -1 for "off"; vLLM's "off" is 0 in new versions, -1 in old ones
        "top_k": params.top_k if params.top_k > 0 else 0,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "seed": seed,
        "logprobs": 0,
        # stop strings are matched on text; without them no detokenizing is needed
        "detokenize": bool(params.stop),
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    return kwargs
