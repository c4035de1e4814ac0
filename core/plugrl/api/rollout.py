"""The rollout-engine interface, the requests and completions it trades, and the weights it
receives."""

from plugrl.parts.rollout import (
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
    join_completions,
    run_blocking,
    weight_fingerprint,
)
from plugrl.parts.transport import WeightTransport, weight_sync_metrics
from plugrl.state.rng import Stream, round_seed, sampling_seed

__all__ = [
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
    "join_completions",
    "round_seed",
    "run_blocking",
    "sampling_seed",
    "weight_fingerprint",
    "weight_sync_metrics",
]
