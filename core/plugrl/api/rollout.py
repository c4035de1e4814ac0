"""The rollout-engine interface, the requests and completions it trades, and the weights it
receives."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.parts.rollout import (
        ADAPTER_FACTORS,
        LORA_SYNC_MODES,
        ROLLOUT_DTYPES,
        Capability,
        Completion,
        FinishReason,
        GenerationRequest,
        PauseMode,
        RolloutConfig,
        RolloutEngine,
        SamplingParams,
        ValKwargs,
        WeightFingerprint,
        WeightMeta,
        batch_requests,
        continuation_request,
        derive_seed,
        in_prompt_order,
        is_adapter_weight,
        join_completions,
        lora_sync_mode,
        run_blocking,
        weight_fingerprint,
    )
    from plugrl.parts.transport import WeightTransport, weight_sync_metrics
    from plugrl.state.seeds import Stream, round_seed, sampling_seed

__all__ = [
    "ADAPTER_FACTORS",
    "LORA_SYNC_MODES",
    "ROLLOUT_DTYPES",
    "Capability",
    "Completion",
    "FinishReason",
    "GenerationRequest",
    "PauseMode",
    "RolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "Stream",
    "ValKwargs",
    "WeightFingerprint",
    "WeightMeta",
    "WeightTransport",
    "batch_requests",
    "continuation_request",
    "derive_seed",
    "in_prompt_order",
    "is_adapter_weight",
    "join_completions",
    "lora_sync_mode",
    "round_seed",
    "run_blocking",
    "sampling_seed",
    "weight_fingerprint",
    "weight_sync_metrics",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "ADAPTER_FACTORS": ("plugrl.parts.rollout", "ADAPTER_FACTORS"),
        "LORA_SYNC_MODES": ("plugrl.parts.rollout", "LORA_SYNC_MODES"),
        "ROLLOUT_DTYPES": ("plugrl.parts.rollout", "ROLLOUT_DTYPES"),
        "Capability": ("plugrl.parts.rollout", "Capability"),
        "Completion": ("plugrl.parts.rollout", "Completion"),
        "FinishReason": ("plugrl.parts.rollout", "FinishReason"),
        "GenerationRequest": ("plugrl.parts.rollout", "GenerationRequest"),
        "PauseMode": ("plugrl.parts.rollout", "PauseMode"),
        "RolloutConfig": ("plugrl.parts.rollout", "RolloutConfig"),
        "RolloutEngine": ("plugrl.parts.rollout", "RolloutEngine"),
        "SamplingParams": ("plugrl.parts.rollout", "SamplingParams"),
        "Stream": ("plugrl.state.seeds", "Stream"),
        "ValKwargs": ("plugrl.parts.rollout", "ValKwargs"),
        "WeightFingerprint": ("plugrl.parts.rollout", "WeightFingerprint"),
        "WeightMeta": ("plugrl.parts.rollout", "WeightMeta"),
        "WeightTransport": ("plugrl.parts.transport", "WeightTransport"),
        "batch_requests": ("plugrl.parts.rollout", "batch_requests"),
        "continuation_request": ("plugrl.parts.rollout", "continuation_request"),
        "derive_seed": ("plugrl.parts.rollout", "derive_seed"),
        "in_prompt_order": ("plugrl.parts.rollout", "in_prompt_order"),
        "is_adapter_weight": ("plugrl.parts.rollout", "is_adapter_weight"),
        "join_completions": ("plugrl.parts.rollout", "join_completions"),
        "lora_sync_mode": ("plugrl.parts.rollout", "lora_sync_mode"),
        "round_seed": ("plugrl.state.seeds", "round_seed"),
        "run_blocking": ("plugrl.parts.rollout", "run_blocking"),
        "sampling_seed": ("plugrl.state.seeds", "sampling_seed"),
        "weight_fingerprint": ("plugrl.parts.rollout", "weight_fingerprint"),
        "weight_sync_metrics": ("plugrl.parts.transport", "weight_sync_metrics"),
    },
)
