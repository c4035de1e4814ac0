"""Recipe keys of the ``sglang`` rollout engine, beside the common ``rollout`` keys.

Light on purpose: ``plugrl run --print-config`` and ``plugrl explain`` read this module on
machines without SGLang.
"""

from __future__ import annotations

from typing import Any

import attrs

from plugrl.api import ConfigValueError, option
from plugrl.api.rollout import RolloutConfig


def _positive_or_none(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ConfigValueError(attribute.name, f"must be a positive number or null, got {value}")


@attrs.define(kw_only=True)
class SGLangRolloutConfig(RolloutConfig):
    """``rollout`` with ``engine: sglang``: SGLang's offline ``Engine`` in the engine worker."""

    enforce_eager: bool = option(
        False,
        "Run without CUDA/NPU graphs (SGLang's disable_cuda_graph): slower decoding, faster "
        "start-up and less memory.",
        verl="actor_rollout_ref.rollout.enforce_eager",
    )
    enable_chunked_prefill: bool = option(
        True,
        "Split long prompts into chunks of max_num_batched_tokens during prefill; false "
        "prefills each prompt whole (SGLang's chunked_prefill_size=-1).",
        verl="actor_rollout_ref.rollout.enable_chunked_prefill",
    )
    max_num_batched_tokens: int | None = option(
        None,
        "Tokens of one prefill chunk (SGLang's chunked_prefill_size); null keeps SGLang's "
        "choice for the device.",
        verl="actor_rollout_ref.rollout.max_num_batched_tokens",
        validator=_positive_or_none,
    )
    attention_backend: str | None = option(
        None,
        "SGLang attention kernel (flashinfer, fa3, triton, ascend, ...); null lets SGLang "
        "choose for the device.",
    )
    engine_kwargs: dict[str, Any] = option(
        factory=dict,
        help="More arguments for sglang.Engine (its ServerArgs fields), passed as they are; "
        "they win over the ones this engine derives from the recipe.",
        verl="actor_rollout_ref.rollout.engine_kwargs.sglang",
    )
