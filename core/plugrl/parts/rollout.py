"""Rollout engines: sample responses (token ids + their log-probs) for prompts.

The interface is written against what vLLM's ``AsyncLLM``, SGLang's ``Engine`` and the ``hf``
engine can all do:

* **requests**: :meth:`RolloutEngine.generate_request` samples ``params.n`` responses for one
  prompt and returns when they end; many requests may be in flight at once. The batch form
  :meth:`RolloutEngine.generate` is built on it.
* **control**: :meth:`~RolloutEngine.abort` requests, :meth:`~RolloutEngine.pause` (keeping or
  ending the requests in flight) and :meth:`~RolloutEngine.resume`,
  :meth:`~RolloutEngine.sleep` / :meth:`~RolloutEngine.wake_up` around training when the
  engine shares devices with the trainer.
* **weights**: an update in three phases, :meth:`~RolloutEngine.begin_weight_update`,
  :meth:`~RolloutEngine.load_weights` (named tensors, one bucket at a time) and
  :meth:`~RolloutEngine.finish_weight_update`, which records the new weight version. Every
  token says which version produced it (:attr:`Completion.token_versions`).
* **capabilities**: an engine declares what it can do (:class:`Capability`); a scheduler
  asks for what it needs with :func:`check_capabilities` and a run that cannot work stops at
  start-up with one line.

Request and control methods are coroutines: an engine lives on one asyncio event loop (a Ray
actor's, or the loop thread of :class:`plugrl.cluster.engines.LocalEngineGroup`). Schedulers drive
engines through an engine group (:mod:`plugrl.cluster.engines`), never directly.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import attrs

from plugrl.config import fraction, non_negative, option, positive, section
from plugrl.errors import RecipeError
from plugrl.parts.agent import AgentConfig
from plugrl.state.seeds import (
    derive_seed,  # engines narrow request seeds with it, imported from here
)

if TYPE_CHECKING:
    import torch

    from plugrl.parts.context import PartContext
    from plugrl.parts.device import Device

FinishReason = Literal["stop", "length", "aborted"]
PauseMode = Literal["keep", "abort"]


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class SamplingParams:
    """How to sample one request. ``temperature == 0`` means greedy; ``top_k`` of -1 or 0
    disables top-k. ``seed`` makes a request sample the same tokens every time, whatever else
    the engine runs beside it."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] = attrs.field(factory=list)
    stop_token_ids: list[int] = attrs.field(factory=list)
    seed: int | None = None

    def check(self) -> None:
        """Raise a ``ValueError`` naming every bad field."""
        problems = []
        if self.n < 1:
            problems.append(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            problems.append(f"top_k must be -1 (off), 0 (off) or > 0, got {self.top_k}")
        if self.max_tokens < 0:
            problems.append(f"max_tokens must be >= 0, got {self.max_tokens}")
        if problems:
            raise ValueError("bad sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# --------------------------------------------------------------------------------------------
# Requests and their results
# --------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GenerationRequest:
    """``params.n`` responses to one prompt. ``request_id`` is unique among the requests in
    flight on an engine; :meth:`RolloutEngine.abort` names requests by it."""

    request_id: str
    prompt_ids: tuple[int, ...] = attrs.field(converter=tuple)
    params: SamplingParams
    multi_modal_inputs: Mapping[str, Any] | None = attrs.field(default=None, eq=False, repr=False)
    """A vision-language model's image inputs for the images of ``prompt_ids`` (the row's
    ``multi_modal_inputs``), ``None`` for a text prompt. An engine that cannot take images
    refuses a request that has them."""
    images: tuple[bytes, ...] = attrs.field(default=(), converter=tuple, eq=False, repr=False)
    """The same images as encoded bytes (PNG, JPEG, ...), in the order of their tokens in
    ``prompt_ids`` (the row's ``prompt_images``): for engines that run the model's processor
    themselves (vLLM, SGLang); :func:`plugrl.api.data.decode_image` decodes one."""
    videos: tuple[Mapping[str, Any], ...] = attrs.field(
        default=(), converter=tuple, eq=False, repr=False
    )
    """The prompt's videos, in the order of their tokens in ``prompt_ids`` (the row's
    ``prompt_videos``): each ``{"frames": (PNG bytes, ...), "fps": float}``, its sampled
    frames and their rate, for the same engines; :func:`plugrl.api.data.frames_of` decodes
    one to a ``[T, H, W, 3]`` array."""


@attrs.define(kw_only=True)
class Completion:
    """One sampled response.

    ``log_probs[i]`` is the log-probability of ``token_ids[i]`` under the distribution it was
    sampled from (temperature-scaled, after top-k/top-p). ``token_versions[i]`` is the weight
    version that produced ``token_ids[i]``; they differ within a response when a weight update
    happened while it was in flight and the engine continued it (partial rollout).
    ``weight_version`` is the engine's version when the response ended (the version of an
    empty response).
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    token_versions: list[int] = attrs.field(factory=list)
    weight_version: int = 0
    request_id: str = ""
    sample_index: int = 0
    """Which of the request's ``n`` samples this is."""
    prompt_index: int = 0
    """The prompt's position in a batch call (:meth:`RolloutEngine.generate`)."""

    def __attrs_post_init__(self) -> None:
        if not self.token_versions and self.token_ids:
            self.token_versions = [self.weight_version] * len(self.token_ids)

    @property
    def min_weight_version(self) -> int:
        """The oldest version that produced any token (``weight_version`` when empty)."""
        return min(self.token_versions, default=self.weight_version)

    @property
    def max_weight_version(self) -> int:
        return max(self.token_versions, default=self.weight_version)


def continuation_request(
    request: GenerationRequest, partial: Completion, request_id: str | None = None
) -> GenerationRequest:
    """The request that continues ``partial`` (an aborted sample of ``request``): the prompt
    followed by the tokens so far, one sample, the tokens left. For engines that can abort but
    not keep requests across a weight update (see :data:`Capability.PAUSE_KEEP`)."""
    params = attrs.evolve(
        request.params,
        n=1,
        max_tokens=max(request.params.max_tokens - len(partial.token_ids), 0),
        seed=(
            None
            if request.params.seed is None
            else derive_seed(request.params.seed, partial.sample_index, len(partial.token_ids))
        ),
    )
    return GenerationRequest(
        request_id=request_id or f"{request.request_id}/{partial.sample_index}+",
        prompt_ids=(*request.prompt_ids, *partial.token_ids),
        params=params,
        multi_modal_inputs=request.multi_modal_inputs,
        images=request.images,
        videos=request.videos,
    )


def join_completions(partial: Completion, continuation: Completion) -> Completion:
    """``partial`` followed by what :func:`continuation_request` generated."""
    return attrs.evolve(
        partial,
        token_ids=[*partial.token_ids, *continuation.token_ids],
        log_probs=[*partial.log_probs, *continuation.log_probs],
        token_versions=[*partial.token_versions, *continuation.token_versions],
        finish_reason=continuation.finish_reason,
        weight_version=continuation.weight_version,
    )


def batch_requests(
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    id_prefix: str = "batch",
    images: Sequence[Mapping[str, Any] | None] | None = None,
    encoded_images: Sequence[Sequence[bytes]] | None = None,
    encoded_videos: Sequence[Sequence[Mapping[str, Any]]] | None = None,
) -> list[GenerationRequest]:
    """One request per prompt, each with its own seed derived from ``params.seed``, so a
    batch samples the same however its requests are spread over engines; ``images`` gives
    each prompt's ``multi_modal_inputs``, ``encoded_images`` the same images encoded and
    ``encoded_videos`` its videos' sampled frames (a vision-language model's rows)."""
    if encoded_videos is not None and len(encoded_videos) != len(prompts):
        raise ValueError(f"{len(encoded_videos)} video lists for {len(prompts)} prompts")
    if images is not None and len(images) != len(prompts):
        raise ValueError(f"{len(images)} image inputs for {len(prompts)} prompts")
    if encoded_images is not None and len(encoded_images) != len(prompts):
        raise ValueError(f"{len(encoded_images)} image lists for {len(prompts)} prompts")
    return [
        GenerationRequest(
            request_id=f"{id_prefix}-{index}",
            prompt_ids=prompt,
            params=(
                params
                if params.seed is None
                else attrs.evolve(params, seed=derive_seed(params.seed, index))
            ),
            multi_modal_inputs=None if images is None else images[index],
            images=() if encoded_images is None else encoded_images[index],
            videos=() if encoded_videos is None else encoded_videos[index],
        )
        for index, prompt in enumerate(prompts)
    ]


def in_prompt_order(outputs: Sequence[Sequence[Completion]]) -> list[Completion]:
    """The completions of :func:`batch_requests`' requests, grouped by prompt in prompt order,
    each with its ``prompt_index`` set."""
    flat = []
    for prompt_index, completions in enumerate(outputs):
        for completion in sorted(completions, key=lambda c: c.sample_index):
            completion.prompt_index = prompt_index
            flat.append(completion)
    return flat


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


@attrs.frozen
class WeightMeta:
    """A weight as the trainer will send it: Hugging Face name, full (unsharded) shape, and
    dtype name (``"bfloat16"``, ``"float32"``)."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str

    @property
    def nbytes(self) -> int:
        import torch

        count = 1
        for size in self.shape:
            count *= size
        return count * getattr(torch, self.dtype).itemsize


FINGERPRINT_SAMPLE = 4096
"""Elements of a weight, evenly strided over it, whose bytes a fingerprint hashes."""


@attrs.frozen
class WeightFingerprint:
    """What a weight is, small enough to send back from an engine: its dtype and element
    count, the sum and the sum of squares of its values (in float64), and a hash of the bytes
    of a strided sample of its elements. Two copies of a weight in the same dtype agree on
    all of them; a stale copy, a skipped tensor or a wrong shard does not
    (:func:`weight_fingerprint`, :func:`fingerprint_difference`)."""

    dtype: str
    numel: int
    total: float
    sum_squares: float
    sample_digest: str
    rows: int | None = None
    """The fingerprint covers the first ``rows`` rows (along the first dimension) only, as an
    engine that reads back part of a weight says; ``None``: all of it."""


def weight_fingerprint(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> WeightFingerprint:
    """The :class:`WeightFingerprint` of ``tensor``, cast to ``dtype`` first when given (the
    trainer's weight in the engine's dtype: the cast rounds the same way the engine's did)."""
    import hashlib

    import torch

    values = tensor.detach()
    if dtype is not None and values.dtype != dtype:
        values = values.to(dtype)
    flat = values.reshape(-1)
    stride = max(1, flat.numel() // FINGERPRINT_SAMPLE)
    sample = flat[::stride][:FINGERPRINT_SAMPLE].contiguous().cpu()
    digest = hashlib.sha256(sample.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    wide = flat.to(torch.float64)
    return WeightFingerprint(
        dtype=str(values.dtype).removeprefix("torch."),
        numel=flat.numel(),
        total=float(wide.sum().item()),
        sum_squares=float((wide * wide).sum().item()),
        sample_digest=digest,
    )


def fingerprint_difference(expected: WeightFingerprint, actual: WeightFingerprint) -> str | None:
    """How ``actual`` (an engine's) differs from ``expected`` (the trainer's, in the engine's
    dtype), in a few words; ``None`` when they agree. The sums may differ by the order they
    were added in on another device, no more."""
    if expected.numel != actual.numel:
        return f"{actual.numel} elements, the trainer's {expected.numel}"
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype}, the trainer's cast to {expected.dtype}"
    scale = max(expected.sum_squares, actual.sum_squares, 1e-30)
    tolerance = 1e-6 * scale
    if abs(expected.sum_squares - actual.sum_squares) > tolerance:
        return f"sum of squares {actual.sum_squares:.6g}, the trainer's {expected.sum_squares:.6g}"
    if abs(expected.total - actual.total) > 1e-6 * (scale * expected.numel) ** 0.5:
        return f"sum {actual.total:.6g}, the trainer's {expected.total:.6g}"
    if expected.sample_digest != actual.sample_digest:
        return "the same sums but other values in a strided sample"
    return None


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------


class Capability(str, enum.Enum):
    """What an engine can do beyond sampling a request (which every engine does)."""

    STREAM = "stream"
    """Many requests in flight at once, each returned when it ends (continuous batching)."""
    ABORT = "abort"
    """:meth:`RolloutEngine.abort` and ``pause(mode="abort")`` end requests in flight with
    the tokens they have."""
    PAUSE_KEEP = "pause_keep"
    """``pause(mode="keep")`` holds requests in flight, a weight update may run, and after
    :meth:`RolloutEngine.resume` they continue with the new weights, keeping their tokens."""
    WEIGHT_UPDATE = "weight_update"
    """New weights arrive in buckets while the engine runs (the three update phases)."""
    SLEEP = "sleep"
    """:meth:`RolloutEngine.sleep` frees device memory for training; ``wake_up`` takes it
    back."""
    SHARE_MODEL = "share_model"
    """:meth:`RolloutEngine.bind_model`: generate with the trainer's live model in the same
    process, no copy and no weight transfer."""
    IMAGES = "images"
    """Requests with :attr:`GenerationRequest.multi_modal_inputs`: prompts with images, for a
    vision-language model."""
    SCORE = "score"
    """:meth:`RolloutEngine.score_tokens`: the log-probabilities of given tokens (a prefill,
    no sampling), as a distillation teacher gives them."""


CAPABILITY_TEXT: Mapping[Capability, str] = {
    Capability.STREAM: "keep many requests in flight",
    Capability.ABORT: "abort requests in flight",
    Capability.PAUSE_KEEP: "pause requests in flight and continue them after a weight update",
    Capability.WEIGHT_UPDATE: "receive new weights while running",
    Capability.SLEEP: "free its device memory between rollouts",
    Capability.SHARE_MODEL: "generate with the trainer's model in the same process",
    Capability.IMAGES: "generate from prompts with images",
    Capability.SCORE: "score given tokens (their log-probabilities without sampling)",
}


CAPABILITY_METHODS: Mapping[Capability, tuple[str, ...]] = {
    Capability.STREAM: (),
    Capability.ABORT: ("abort", "pause", "resume"),
    Capability.PAUSE_KEEP: ("pause", "resume"),
    Capability.WEIGHT_UPDATE: ("begin_weight_update", "load_weights", "finish_weight_update"),
    Capability.SLEEP: ("sleep", "wake_up"),
    Capability.SHARE_MODEL: ("bind_model",),
    Capability.IMAGES: (),
    Capability.SCORE: ("score_tokens",),
}
"""The :class:`RolloutEngine` methods an engine that declares a capability must override: the
core calls them once it sees the capability (``pause(mode="abort")`` comes with ``ABORT``)."""


def unimplemented_capabilities(engine_cls: type) -> list[tuple[Capability, list[str]]]:
    """Each capability ``engine_cls`` declares with the methods of
    :data:`CAPABILITY_METHODS` it leaves as :class:`RolloutEngine` has them, in declaration
    order of :class:`Capability`; empty when every declared capability is implemented."""
    declared = frozenset(getattr(engine_cls, "capabilities", frozenset()))
    missing = []
    for capability in Capability:
        if capability not in declared:
            continue
        methods = [
            method
            for method in CAPABILITY_METHODS[capability]
            if inspect.getattr_static(engine_cls, method, None)
            is inspect.getattr_static(RolloutEngine, method)
        ]
        if methods:
            missing.append((capability, methods))
    return missing


def check_capabilities(engine_name: str, engine_cls: type, needs: Mapping[Capability, str]) -> None:
    """Raise a one-line :class:`RecipeError` when the engine lacks a capability that ``needs``
    maps to the reason (``{Capability.PAUSE_KEEP: "scheduler.partial_rollout=true"}``)."""
    has = frozenset(getattr(engine_cls, "capabilities", frozenset()))
    for capability, reason in needs.items():
        if capability not in has:
            declare = f"Capability.{capability.name}"
            raise RecipeError(
                f"rollout engine {engine_name!r} cannot {CAPABILITY_TEXT[capability]}, which "
                f"{reason} needs: its class {getattr(engine_cls, '__qualname__', engine_cls)} "
                f"does not declare {declare} in its capabilities; set rollout.engine to an "
                f"engine that declares {declare}, or change what needs it",
                key="rollout.engine",
            )


# --------------------------------------------------------------------------------------------
# The recipe section
# --------------------------------------------------------------------------------------------


ROLLOUT_DTYPES = ("auto", "bfloat16", "float16", "float32")
"""The values of ``rollout.dtype``."""


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


LORA_SYNC_MODES = ("auto", "adapters", "merged")
"""Values of ``rollout.lora_sync``."""


@attrs.define(kw_only=True)
class RolloutConfig:
    """The ``rollout`` section. The chosen engine's config class extends this one."""

    supports_lora_adapters: ClassVar[bool] = False
    """Whether the engine takes LoRA adapters apart from its base weights
    (``rollout.lora_sync=adapters``): an update whose weights are all adapter factors
    (:func:`is_adapter_weight`) replaces the adapter it applies to every request, the base
    weights it loaded from ``model.path`` staying as they are."""

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
        "Engines share the trainer's devices (verl's hybrid engine): in one process an "
        "engine that can generates with the trainer's live model; on Ray engine workers sit "
        "on the trainer's devices and sleep during training. False gives the engines devices "
        "of their own (rollout.nnodes x rollout.n_gpus_per_node).",
        verl="actor_rollout_ref.hybrid_engine",
    )
    nnodes: int = option(
        1,
        "Nodes of the engines' own devices when rollout.colocate is false.",
        verl="rollout.nnodes",
        validator=positive,
    )
    n_gpus_per_node: int = option(
        1,
        "Devices per node of the engines (CPU processes on cpu) when rollout.colocate is "
        "false; each engine takes tensor_model_parallel_size of them.",
        verl="rollout.n_gpus_per_node",
        validator=positive,
    )
    tensor_model_parallel_size: int = option(
        1,
        "Devices one engine spans (tensor parallel).",
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
    dtype: str = option(
        "auto",
        "Dtype of the engine's weights and compute; the trainer keeps its own (model.dtype), "
        "weights are cast as they reach the engine. auto: bfloat16 (verl's default) on "
        "devices with fast bfloat16 (accelerators, CPUs with AMX), float32 on other CPUs; "
        "float32 samples exactly what the trainer's float32 forward computes.",
        verl="actor_rollout_ref.rollout.dtype",
        choices=ROLLOUT_DTYPES,
    )
    free_cache_engine: bool = option(
        True,
        "When engines share devices with training, put them to sleep (weights and cache "
        "freed) during training and wake them for the next rollout; no effect for engines "
        "that cannot sleep or on cpu.",
        verl="actor_rollout_ref.rollout.free_cache_engine",
    )
    weight_transport: str = option(
        "auto",
        "How new weights reach engine workers: auto (in-process when the engine lives with "
        "the trainer, else the device's collective when it has one, else Ray's object "
        "store), or a registered transport.",
        registry="weight_transports",
    )
    lora_sync: str = option(
        "auto",
        "What a LoRA actor (model.lora_rank > 0) sends the engines after each step: "
        "adapters (the LoRA factors alone; the engine keeps the base weights it loaded from "
        "model.path and applies the latest adapter to every request), merged (every weight "
        "with its adapter merged in), or auto: adapters when the engine and the training "
        "backend support them on accelerators, merged otherwise (on cpu vLLM's LoRA kernels "
        "slow generation more than merged weights cost to sync).",
        choices=LORA_SYNC_MODES,
    )
    update_weights_bucket_megabytes: int = option(
        512,
        "Weights travel to the engines in buckets of at most this many MiB (one weight larger "
        "than that travels alone).",
        verl="actor_rollout_ref.rollout.update_weights_bucket_megabytes",
        validator=positive,
    )
    update_weights_timeout_s: float = option(
        300.0,
        "Seconds a step of a weight transfer may wait (engines joining it, each bucket) before "
        "the transfer fails with the engines that did not answer named.",
        validator=positive,
    )
    max_engine_restarts: int = option(
        3,
        "Engine workers that die are restarted and their requests resubmitted, at most this "
        "many times in a run.",
        validator=non_negative,
    )
    agent: AgentConfig = section(
        AgentConfig,
        "Multi-turn sampling: the agent loop, its tools or environment, and their limits "
        "(docs/agents.md).",
    )
    val_kwargs: ValKwargs = section(
        ValKwargs, "Sampling for validation.", verl="actor_rollout_ref.rollout.val_kwargs"
    )

    def sampling_params(self, max_tokens: int, *, validate: bool = False) -> SamplingParams:
        """The sampling parameters of training (or validation) generation."""
        if validate:
            v = self.val_kwargs
            n, do_sample, temperature, top_p, top_k = (
                v.n,
                v.do_sample,
                v.temperature,
                v.top_p,
                v.top_k,
            )
        else:
            n, do_sample, temperature, top_p, top_k = (
                self.n,
                self.do_sample,
                self.temperature,
                self.top_p,
                self.top_k,
            )
        return SamplingParams(
            n=n,
            temperature=temperature if do_sample else 0.0,
            top_p=top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            stop=list(self.stop),
        )

    def greedy_params(self, max_tokens: int) -> SamplingParams:
        """One greedy response per prompt (ReMax's baseline)."""
        return SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, stop=list(self.stop))

    def resolved_dtype(self, device: Device | None) -> str:
        """The dtype name the engine runs in on ``device``: ``rollout.dtype``, with ``auto``
        bfloat16 where :meth:`Device.fast_bfloat16 <plugrl.parts.device.Device.fast_bfloat16>`
        says so and float32 elsewhere (and without a device)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if device is not None and device.fast_bfloat16() else "float32"


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


def run_blocking(coroutine: Any) -> Any:
    """Run a coroutine to its end from synchronous code (a script, a test). Inside a running
    event loop, await the coroutine instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise RuntimeError("an event loop is running in this thread: await the async method instead")


class RolloutEngine(ABC):
    """Generates responses. One instance per engine worker (a Ray actor, or the engine loop
    thread of a local run), driven through an engine group.

    Built as ``Engine(config, context)``: ``config`` is the ``rollout`` section read into the
    engine's config class; ``context.device`` is the worker's device, ``context.tokenizer``
    the run's tokenizer, ``context.recipe`` the whole run (``model.path``, ``trainer.seed``).
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    """What this engine can do beyond sampling (see :class:`Capability`)."""
    spans_nodes: ClassVar[bool] = False
    """An engine of several devices may have them on several Ray nodes: it is built on the
    first node with ``context.engine_span`` saying where the others are, and runs what it
    needs on them itself (its tensor-parallel workers) and gets its weights to them. An
    engine that cannot is refused such a span in one line."""
    _batch_numbers: ClassVar[itertools.count] = itertools.count()

    def __init__(self, config: RolloutConfig, context: PartContext) -> None:
        self.config = config
        self.context = context
        self.weight_version = 0
        """The version of the weights new tokens are sampled with."""
        self.rank_nodes: tuple[str, ...] | None = None
        """The Ray node of each tensor-parallel rank of an engine that starts its ranks
        itself (``context.engine_span``), rank 0 first; the run logs them. ``None``: not
        known, or one process."""

    # ------------------------------------------------------------------------------ requests

    @abstractmethod
    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        """Sample ``request.params.n`` responses to ``request.prompt_ids``; return them (with
        ``request_id`` and ``sample_index`` set) when all have ended.

        Aborted requests return what they have, with ``finish_reason="aborted"``.
        """

    async def generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """``params.n`` responses per prompt, grouped by prompt in prompt order: one request
        per prompt (:func:`batch_requests`), all in flight at once."""
        params.check()
        # request ids unique among the batches in flight at once on this engine
        prefix = f"batch{next(self._batch_numbers)}"
        requests = batch_requests(prompts, params, prefix)
        outputs = await asyncio.gather(*(self.generate_request(r) for r in requests))
        return in_prompt_order(outputs)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Completion]:
        """Blocking :meth:`generate_batch`, for scripts and tests (no event loop running)."""
        return run_blocking(self.generate_batch(prompts, params))

    async def score_tokens(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> list[float]:
        """The log-probability of each of ``response_ids`` after ``prompt_ids`` and the
        response tokens before it, under the model's own distribution (temperature 1, no top-k
        or top-p): one forward over the given tokens, nothing sampled. Engines with
        :data:`Capability.SCORE` implement it; a distillation teacher is asked this way."""
        raise NotImplementedError(f"{type(self).__name__} cannot score given tokens")

    async def abort(self, request_ids: Sequence[str]) -> None:
        """End the named requests now; they return what they have (``"aborted"``). Unknown
        or finished ids are ignored."""
        raise NotImplementedError(f"{type(self).__name__} cannot abort requests")

    async def pause(self, mode: PauseMode = "keep") -> None:
        """Stop generating until :meth:`resume`; requests sent meanwhile wait.

        ``"keep"`` holds requests in flight where they are (a weight update may run, and they
        continue with the new weights); ``"abort"`` ends them with what they have.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot pause")

    async def resume(self) -> None:
        """Continue after :meth:`pause`."""
        raise NotImplementedError(f"{type(self).__name__} cannot pause")

    # ------------------------------------------------------------------------------- weights

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        """Start receiving ``weights`` (all of them, in any order, over one or more
        :meth:`load_weights` calls). Generation is paused by the caller, or waits."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive weights")

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Load one bucket of named full tensors (Hugging Face names). The tensors are valid
        during the call only (a transport reuses their memory for the next bucket): copy what
        you keep."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive weights")

    async def finish_weight_update(self) -> None:
        """Check every announced weight arrived and make the new version current: tokens
        sampled from now on carry it."""
        raise NotImplementedError(f"{type(self).__name__} cannot receive weights")

    async def weight_fingerprints(self, names: Sequence[str]) -> dict[str, WeightFingerprint]:
        """Optional: the :func:`weight_fingerprint` of each named weight (Hugging Face names)
        as the engine holds it now, in the engine's dtype, after a weight update has finished;
        a name the engine does not hold is left out. ``trainer.verify_weight_sync`` compares
        them with the trainer's after every sync. An engine that holds LoRA adapters apart
        from its base weights fingerprints the weights it samples with (merged)."""
        raise NotImplementedError(f"{type(self).__name__} cannot read its weights back")

    def bind_model(self, model: Any, version: int) -> None:
        """Generate with the trainer's live ``model`` of this process (no copy), as
        ``version``. Engines with :data:`Capability.SHARE_MODEL` implement it. Call it while
        the engine is idle or paused (it runs outside the engine's event loop)."""
        raise NotImplementedError(f"{type(self).__name__} cannot share the trainer's model")

    # ------------------------------------------------------------------------------ lifecycle

    async def sleep(self, level: int = 1) -> None:
        """Free device memory for training: level 1 keeps the weights in host memory and
        drops the cache, level 2 drops both (after ``wake_up(tags=["weights"])`` new weights
        must be loaded before generating). Requests in flight or sent while asleep wait for
        :meth:`wake_up`."""

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Take back what :meth:`sleep` freed (``tags``: ``"weights"``, ``"kv_cache"``;
        ``None`` is both)."""

    def close(self) -> None:
        """Stop the engine and release its resources."""


# --------------------------------------------------------------------------------------------
# LoRA adapters as weights
# --------------------------------------------------------------------------------------------

ADAPTER_FACTORS = (".lora_A.weight", ".lora_B.weight")
"""How the name of an adapter factor ends. An adapter update names each factor as a PEFT
adapter file does (``base_model.model.<module>.lora_A.weight``), with the adapter's scaling
already in ``lora_B``: the engine adds ``lora_B @ lora_A`` to the module's output."""


def is_adapter_weight(name: str) -> bool:
    """Whether ``name`` is a factor of a LoRA adapter (:data:`ADAPTER_FACTORS`)."""
    return name.endswith(ADAPTER_FACTORS)


def lora_sync_mode(recipe: Any, device_type: str) -> Literal["adapters", "merged"]:
    """What weights a sync sends for ``recipe`` on devices of ``device_type`` (torch's:
    ``cuda``, ``cpu``): ``adapters`` (the LoRA factors alone) or ``merged`` (every weight;
    with LoRA, adapters merged in). ``rollout.lora_sync=auto`` is adapters when the actor
    trains LoRA adapters, its backend sends them (``ActorConfig.sends_lora_adapters``), the
    engine takes them (:attr:`RolloutConfig.supports_lora_adapters`) and the devices are not
    CPUs: vLLM's CPU build applies adapters with plain torch operations, and generation with
    one took several times longer than merged weights take to sync."""
    chosen = recipe.rollout.lora_sync
    if recipe.model.lora_rank <= 0 or chosen == "merged":
        return "merged"
    if chosen == "adapters":
        return "adapters"
    supported = type(recipe.rollout).supports_lora_adapters and getattr(
        type(recipe.actor), "sends_lora_adapters", False
    )
    return "adapters" if supported and device_type != "cpu" else "merged"
