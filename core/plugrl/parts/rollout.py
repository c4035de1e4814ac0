"""Rollout engines: sample responses (token ids + their log-probs) for prompts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from plugrl.config import fraction, non_negative, option, positive, section

if TYPE_CHECKING:
    import torch

    from plugrl.parts.device import Device
    from plugrl.recipe import Recipe

FinishReason = Literal["stop", "length", "aborted"]


@attrs.define(kw_only=True)
class ValKwargs:
    """``rollout.val_kwargs``: sampling for validation."""

    n: int = option(
        1,
        "Samples per validation prompt (metrics report mean@n).",
        verl="actor_rollout_ref.rollout.val_kwargs.n",
        validator=positive,
    )
    do_sample: bool = option(
        False, "Sample; false means greedy.", verl="actor_rollout_ref.rollout.val_kwargs.do_sample"
    )
    temperature: float = option(
        0.0,
        "Temperature when do_sample is true.",
        verl="actor_rollout_ref.rollout.val_kwargs.temperature",
        validator=non_negative,
    )
    top_p: float = option(
        1.0,
        "Nucleus sampling mass.",
        verl="actor_rollout_ref.rollout.val_kwargs.top_p",
        validator=fraction,
    )
    top_k: int = option(
        -1, "Top-k sampling; -1 disables.", verl="actor_rollout_ref.rollout.val_kwargs.top_k"
    )


@attrs.define(kw_only=True)
class RolloutConfig:
    """The ``rollout`` section. The chosen engine's config class extends this one."""

    engine: str = option(
        "hf", "Rollout engine.", verl="actor_rollout_ref.rollout.name", registry="rollout_engines"
    )
    n: int = option(
        1,
        "Responses sampled per prompt (the group size of GRPO).",
        verl="actor_rollout_ref.rollout.n",
        validator=positive,
    )
    temperature: float = option(
        1.0,
        "Sampling temperature.",
        verl="actor_rollout_ref.rollout.temperature",
        validator=non_negative,
    )
    top_p: float = option(
        1.0, "Nucleus sampling mass.", verl="actor_rollout_ref.rollout.top_p", validator=fraction
    )
    top_k: int = option(
        -1, "Top-k sampling; -1 (or 0) disables.", verl="actor_rollout_ref.rollout.top_k"
    )
    do_sample: bool = option(
        True, "Sample; false means greedy.", verl="actor_rollout_ref.rollout.do_sample"
    )
    stop: list[str] = option(factory=list, help="Strings that end a response.")
    colocate: bool = option(
        True,
        "Run in the trainer's process and share its weights (no copy, no sync); false "
        "runs a separate engine that receives weights with a version number.",
        verl="actor_rollout_ref.hybrid_engine",
    )
    tensor_model_parallel_size: int = option(
        1,
        "Tensor parallel size of the engine.",
        verl="actor_rollout_ref.rollout.tensor_model_parallel_size",
        validator=positive,
    )
    gpu_memory_utilization: float = option(
        0.5,
        "Fraction of device memory the engine may take (weights + KV cache).",
        verl="actor_rollout_ref.rollout.gpu_memory_utilization",
        validator=fraction,
    )
    max_num_seqs: int = option(
        1024,
        "Sequences the engine runs at once.",
        verl="actor_rollout_ref.rollout.max_num_seqs",
        validator=positive,
    )
    val_kwargs: ValKwargs = section(
        ValKwargs, "Sampling for validation.", verl="actor_rollout_ref.rollout.val_kwargs"
    )

    def sampling_params(self, max_tokens: int, *, validate: bool = False) -> SamplingParams:
        """The sampling parameters of training (or validation) generation."""
        if validate:
            v = self.val_kwargs
            return SamplingParams(
                n=v.n,
                temperature=v.temperature if v.do_sample else 0.0,
                top_p=v.top_p,
                top_k=v.top_k,
                max_tokens=max_tokens,
                stop=list(self.stop),
            )
        return SamplingParams(
            n=self.n,
            temperature=self.temperature if self.do_sample else 0.0,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=max_tokens,
            stop=list(self.stop),
        )


@attrs.define(kw_only=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] = attrs.field(factory=list)
    stop_token_ids: list[int] = attrs.field(factory=list)
    seed: int | None = None


@attrs.define(kw_only=True)
class Completion:
    """One sampled response.

    ``log_probs[i]`` is the log-probability of ``token_ids[i]`` under the sampling
    distribution of the weights that produced it. ``weight_version`` is the version of the
    weights when the response finished; ``min_weight_version`` the oldest version that
    produced any of its tokens (they differ after a partial rollout was continued).
    """

    prompt_index: int
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    weight_version: int = 0
    min_weight_version: int = 0


class RolloutEngine(ABC):
    """Generates responses. One instance per engine process (or per colocated rank)."""

    supports_interrupt: ClassVar[bool] = False
    """True when :meth:`interrupt` cuts in-flight generation short (needed by partial rollout)."""

    def __init__(self, recipe: Recipe, *, device: Device, tokenizer: Any) -> None:
        self.recipe = recipe
        self.config: RolloutConfig = recipe.rollout
        self.device = device
        self.tokenizer = tokenizer
        self.weight_version = 0

    @abstractmethod
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """Sample ``params.n`` responses for each prompt (token ids, no padding).

        Returns ``len(prompts) * params.n`` completions, grouped by prompt in prompt order.
        To continue a partial rollout, pass ``prompt + tokens so far`` with a smaller
        ``max_tokens``.
        """

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights (Hugging Face names) and set :attr:`weight_version` to ``version``.

        Completions started after this call use the new weights.
        """

    def bind_model(self, model: Any, version: int) -> None:
        """Colocated mode: generate with the trainer's live ``model`` (no copy).

        Engines that cannot share a model raise ``NotImplementedError``.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot share the trainer's model")

    def interrupt(self) -> None:
        """Ask in-flight :meth:`generate` calls to return now with what they have
        (``finish_reason="aborted"``). Safe to call from another thread."""
        raise NotImplementedError(f"{type(self).__name__} cannot interrupt generation")

    def sleep(self) -> None:
        """Free device memory between rollouts (colocated with training)."""

    def wake_up(self) -> None:
        """Take back the memory :meth:`sleep` freed."""

    def close(self) -> None:
        """Stop the engine and release its resources."""
