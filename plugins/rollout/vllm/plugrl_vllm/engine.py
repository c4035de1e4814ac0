"""The ``vllm`` rollout engine: vLLM's ``LLMEngine`` stepped on the engine's event loop.

vLLM's ``AsyncLLM`` always runs its engine core in a process of its own (0.32 refuses an
in-process one); the engine instead steps an ``LLMEngine`` itself, one scheduler step at a
time, on the event loop the requests arrive on, yielding to the loop between steps. So
``abort``, ``pause``, ``resume`` and the weight-update calls run between two steps, a paused
engine holds its requests in vLLM's scheduler simply by not stepping, and every token is
stamped with the version of the weights of the step that made it. On a CPU the engine core
runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); elsewhere vLLM's default (an
engine-core process) applies.

Each sample of a request is one vLLM request (id ``<request_id>/<sample index>``) with its own
seed, returning tokens as deltas, so an aborted sample keeps what it had.

A request with images (a vision-language model's) goes to vLLM as its prompt with each image's
run of image tokens shortened to one token, and the images decoded from the request's encoded
bytes as ``multi_modal_data``: vLLM runs the model's processor on the images and expands each
image token itself (given the expanded prompt, it would expand every image's first token
again).

New weights arrive in buckets and enter the model through the worker extension
(:mod:`plugrl_vllm.worker`) by the route ``rollout.weight_route`` names; weights that vLLM
fuses into one layer (q/k/v, gate/up) are held back until the whole layer has arrived. After
an update the prefix cache is reset and requests in flight are preempted, so their keys and
values are computed again with the new weights before their next token.

With ``rollout.lora_sync=adapters`` the engine starts with vLLM's LoRA support and keeps the
base weights it loaded from ``model.path``; an update whose weights are all adapter factors
(``...lora_A.weight``, ``...lora_B.weight``) replaces the adapter registered under
:data:`ADAPTER_ID` in the worker (:class:`plugrl_vllm.worker.AdapterReceiver`), and every
request from then on names that adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch

from plugrl.api import PluginError, RecipeError
from plugrl.api.rollout import (
    Capability,
    Completion,
    FinishReason,
    GenerationRequest,
    PauseMode,
    RolloutEngine,
    WeightFingerprint,
    WeightMeta,
    derive_seed,
    is_adapter_weight,
)
from plugrl_vllm.config import (
    VLLMRolloutConfig,
    cross_node_environment,
    engine_args,
    resolve_weight_route,
)
from plugrl_vllm.logs import apply_engine_log_level, engine_log_level
from plugrl_vllm.sampling import sampling_kwargs
from plugrl_vllm.worker import FusedGroups, WeightPlan

if TYPE_CHECKING:
    from plugrl.api import PartContext

logger = logging.getLogger("plugrl.rollout.vllm")

# On a CPU: the engine core in this process (an engine-core process costs 15-20 s more to
# start and competes for the same cores), and a KV cache of 1 GiB. Set only where the user
# has not set them.
CPU_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}

WORKER_EXTENSION = "plugrl_vllm.worker.WeightReceiver"

ADAPTER_ID = 1
"""vLLM's id of the actor's adapter: one id for every version, each replacing the last, so
requests in flight across an update continue with the new version under the id they carry."""
ADAPTER_NAME = "plugrl-actor"
ADAPTER_SOURCE = "plugrl://in-memory"
"""The ``lora_path`` a request's ``LoRARequest`` must carry; vLLM never reads it, the adapter
being registered from memory before any request names it."""

_FINISH_REASONS: dict[str | None, FinishReason] = {"stop": "stop", "length": "length"}


def set_cpu_environment() -> dict[str, str]:
    """Set :data:`CPU_ENVIRONMENT`'s variables the user did not set; return those set."""
    applied = {}
    for name, value in CPU_ENVIRONMENT.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


class _Sample:
    """One sample of a request in flight: the tokens so far and the future of its request."""

    __slots__ = ("index", "log_probs", "request", "state", "token_ids", "versions", "vllm_id")

    def __init__(self, request: GenerationRequest, index: int, state: _Request) -> None:
        self.request = request
        self.index = index
        self.state = state
        self.vllm_id = f"{request.request_id}/{index}"
        self.token_ids: list[int] = []
        self.log_probs: list[float] = []
        self.versions: list[int] = []


class _Request:
    __slots__ = ("completions", "future", "unfinished")

    def __init__(self, n: int, future: asyncio.Future) -> None:
        self.future = future
        self.unfinished = n
        self.completions: list[Completion | None] = [None] * n


@attrs.define
class _WeightUpdate:
    version: int
    announced: dict[str, WeightMeta]
    groups: FusedGroups | None
    """How full weights are grouped into vLLM's fused layers; ``None`` for an adapter."""
    received: set[str] = attrs.field(factory=set)
    adapter: dict[str, torch.Tensor] = attrs.field(factory=dict)
    """The adapter factors that arrived (copies), registered together at the end."""


class VLLMRolloutEngine(RolloutEngine):
    """Samples with vLLM: continuous batching, abort, pause keeping requests, weight updates
    in buckets, sleep between rollouts on accelerators."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.STREAM,
            Capability.ABORT,
            Capability.PAUSE_KEEP,
            Capability.WEIGHT_UPDATE,
            Capability.SLEEP,
            Capability.SCORE,
            Capability.IMAGES,
        }
    )
    # across nodes vLLM's Ray executor runs the tensor-parallel workers, and its
    # collective_rpc takes every weight bucket to each of them
    spans_nodes: ClassVar[bool] = True

    def __init__(self, config: VLLMRolloutConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: VLLMRolloutConfig = config
        recipe = context.recipe
        # vLLM's platforms and the weight routes below go by torch's device type
        self.device_name = context.device.torch_device_type if context.device is not None else "cpu"
        self.weight_route = resolve_weight_route(config, self.device_name)
        self.dtype_name = config.resolved_dtype(context.device)
        """What the engine's weights are in (``rollout.dtype`` resolved)."""
        self._weight_shapes: dict[str, tuple[int, ...]] = {}
        """The full shape of each weight of the last update (names ``weight_fingerprints``
        can read back)."""
        args = engine_args(config, recipe, self.device_name, self.dtype_name, context.engine_span)
        args.setdefault("worker_extension_cls", WORKER_EXTENSION)
        if context.engine_span is not None:
            os.environ.update(cross_node_environment(context.engine_span))
        if self.device_name == "cpu":
            applied = set_cpu_environment()
            if applied:
                logger.info("vllm rollout engine on cpu: set %s", applied)
        # before vLLM is imported: its engine-core processes read the level at their start
        log_level = engine_log_level(config.engine_log_level)
        apply_engine_log_level(log_level)
        args.setdefault("use_tqdm_on_load", log_level in ("debug", "info"))
        # imported here: only a run that chooses this engine pays for importing vLLM
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        known = {field.name for field in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(config.engine_kwargs) - known)
        if unknown:
            raise RecipeError(
                f"{', '.join(unknown)} is not an argument of vLLM's engine (EngineArgs of "
                f"vLLM {_vllm_version()}); remove it or fix its name",
                key="rollout.engine_kwargs",
            )
        self.llm: Any = LLMEngine.from_engine_args(EngineArgs(**args))
        self._image_token_id = image_token_id(self.llm.model_config.hf_config)
        """The token that stands for an image in the model's prompts; None for a text model."""
        self._video_token_id = video_token_id(self.llm.model_config.hf_config)
        """The token that stands for a video in the model's prompts; None for a model without
        videos."""
        self._seeds = torch.Generator().manual_seed(recipe.trainer.seed)
        self._samples: dict[str, _Sample] = {}
        """vLLM request id -> the sample in flight."""
        self._by_request: dict[str, list[_Sample]] = {}
        self._paused = False
        self._asleep = False
        self._update: _WeightUpdate | None = None
        self._no_weights: str | None = None
        """Why the model's weights cannot be used until a weight update (None: they can)."""
        self.takes_adapters = bool(args.get("enable_lora"))
        """Started with vLLM's LoRA support: weight updates may be adapters alone."""
        self._lora_request: Any = None
        """The ``LoRARequest`` every request names once an adapter arrived, else ``None``."""
        self._base_dropped = False
        """``sleep(level=2)`` dropped the base weights, which only a full update restores."""
        self._sleeps = self.device_name != "cpu" and config.free_cache_engine
        """Whether sleep frees anything (vLLM's CPU build has no sleep mode)."""
        self._task: asyncio.Task | None = None
        self._scores: dict[str, tuple[int, asyncio.Future]] = {}
        """vLLM request id of a scoring request -> (its prompt's length, its future)."""
        self._score_ids = itertools.count()

    # ------------------------------------------------------------------------------ requests

    async def score_tokens(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> list[float]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if not prompt_ids:
            raise ValueError("cannot score tokens after an empty prompt; give at least one token")
        if self.llm is None:
            raise RuntimeError("the vllm rollout engine is closed")
        if not response_ids:
            return []
        # one token is generated and thrown away: vLLM scores a prompt on the way to it, and
        # prompt_logprobs=0 returns the log-probability of each given token under the raw
        # distribution (temperature 1, nothing filtered)
        sampling = VLLMSamplingParams(
            max_tokens=1,
            temperature=1.0,
            prompt_logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        tokens = [*prompt_ids, *response_ids]
        vllm_id = f"score/{next(self._score_ids)}"
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._scores[vllm_id] = (len(prompt_ids), future)
        self.llm.add_request(
            vllm_id,
            TokensPrompt(prompt_token_ids=tokens),
            sampling,
            lora_request=self._lora_request,
        )
        self._kick(loop)
        try:
            return await future
        except asyncio.CancelledError:
            self._scores.pop(vllm_id, None)
            if self.llm is not None:
                self.llm.abort_request([vllm_id])
            raise

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = request.params
        params.check()
        if not request.prompt_ids:
            raise ValueError(
                f"the prompt of request {request.request_id!r} is empty; every prompt needs at "
                "least one token"
            )
        if self.llm is None:
            raise RuntimeError("the vllm rollout engine is closed")
        if self._no_weights is not None and self._update is None:
            raise RuntimeError(
                f"{self._no_weights}; load new weights (begin_weight_update, load_weights, "
                "finish_weight_update) before generating"
            )
        prompt = self._prompt(request)
        seed = params.seed if params.seed is not None else self._draw_seed()
        if params.max_tokens == 0:
            return [self._empty(request, index, "length") for index in range(params.n)]
        loop = asyncio.get_running_loop()
        state = _Request(params.n, loop.create_future())
        samples = [_Sample(request, index, state) for index in range(params.n)]
        for sample in samples:
            if sample.vllm_id in self._samples:
                raise ValueError(
                    f"request {request.request_id!r} is already in flight on this engine; "
                    "give every request in flight its own id"
                )
        for sample in samples:
            sampling = VLLMSamplingParams(
                **sampling_kwargs(params, derive_seed(seed, sample.index)),
                output_kind=RequestOutputKind.DELTA,
            )
            self.llm.add_request(sample.vllm_id, prompt, sampling, lora_request=self._lora_request)
            self._samples[sample.vllm_id] = sample
        self._by_request.setdefault(request.request_id, []).extend(samples)
        self._kick(loop)
        try:
            return await state.future
        except asyncio.CancelledError:
            # the caller gave up: the request leaves the engine
            self._end_samples(samples, deliver=False)
            raise

    def _prompt(self, request: GenerationRequest) -> Any:
        """vLLM's prompt of ``request``: its token ids, and with images or videos, the ids
        with each image's and each video's tokens shortened to one, and the decoded images
        and videos (each its frames ``[T, H, W, 3]`` with their rate, as vLLM's video
        metadata) as ``multi_modal_data``."""
        from vllm.inputs import TokensPrompt

        if request.multi_modal_inputs is None and not request.images and not request.videos:
            return TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        if self._image_token_id is None:
            raise ValueError(
                f"request {request.request_id!r} has images or videos but the vllm engine's "
                f"model ({self.context.recipe.model.path}) is a text model; train a "
                "vision-language model on data with images or videos"
            )
        if not request.images and not request.videos:
            raise ValueError(
                f"request {request.request_id!r} has image inputs but not its images' encoded "
                "bytes (GenerationRequest.images), which vLLM needs to process the images "
                "itself; build the request from the batch's prompt_images column"
            )
        from plugrl.api.data import decode_image, frames_of

        prompt_ids = one_token_per_image(request.prompt_ids, self._image_token_id)
        data: dict[str, Any] = {}
        for kind, token, given in (
            ("images", self._image_token_id, request.images),
            ("videos", self._video_token_id, request.videos),
        ):
            if token is None:
                runs = 0
            else:
                prompt_ids = one_token_per_image(prompt_ids, token)
                runs = prompt_ids.count(token)
            if runs != len(given):
                raise ValueError(
                    f"request {request.request_id!r} has {runs} {kind} in its prompt ids but "
                    f"{len(given)} encoded {kind}; give the {kind} of the prompt, in order"
                )
        if request.images:
            data["image"] = [
                decode_image(image, where=f"image {index} of request {request.request_id!r}")
                for index, image in enumerate(request.images)
            ]
        if request.videos:
            data["video"] = [
                video_with_metadata(frames_of(video), video["fps"]) for video in request.videos
            ]
        return TokensPrompt(prompt_token_ids=prompt_ids, multi_modal_data=data)

    async def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._end_samples(list(self._by_request.get(request_id, ())), deliver=True)

    async def pause(self, mode: PauseMode = "keep") -> None:
        if mode not in ("keep", "abort"):
            raise ValueError(f"pause mode must be 'keep' or 'abort', got {mode!r}")
        # steps run on this event loop, so none is under way now: the loop sees the flag
        # before its next step, and vLLM's scheduler holds the requests meanwhile
        self._paused = True
        if mode == "abort":
            self._end_samples(list(self._samples.values()), deliver=True)

    async def resume(self) -> None:
        self._paused = False
        self._kick()

    # ------------------------------------------------------------------------------- weights

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        if self._update is not None:
            logger.warning(
                "begin_weight_update(%d) while the update to version %d was not finished; "
                "starting over",
                version,
                self._update.version,
            )
        if "weights" in self._asleep_tags():
            raise RuntimeError(
                "the vllm rollout engine is asleep; call wake_up(tags=['weights']) before "
                "begin_weight_update"
            )
        names = [meta.name for meta in weights]
        announced = {meta.name: meta for meta in weights}
        adapter_factors = [name for name in names if is_adapter_weight(name)]
        if adapter_factors:
            self._check_adapter(names, adapter_factors)
            groups = None
        else:
            (plan, *_) = self.llm.collective_rpc("plugrl_weight_plan", args=(names,))
            groups = FusedGroups.from_plan(WeightPlan(**plan))
        self._weight_shapes = {meta.name: tuple(meta.shape) for meta in weights}
        # generation waits until finish_weight_update: no token comes from a mix of versions
        self._update = _WeightUpdate(version, announced, groups)

    def _check_adapter(self, names: list[str], factors: list[str]) -> None:
        """Refuse an adapter update this engine cannot take, before any tensor arrives."""
        from plugrl_vllm.worker import unknown_adapter_modules

        if len(factors) != len(names):
            other = [name for name in names if not is_adapter_weight(name)]
            raise PluginError(
                f"begin_weight_update announced adapter factors and other weights "
                f"({', '.join(other[:2])}); push an adapter alone or every weight merged"
            )
        if self._base_dropped:
            raise PluginError(
                "begin_weight_update announced LoRA adapter factors, but the vllm rollout "
                "engine dropped its base weights in sleep(level=2) and an adapter cannot "
                "restore them; push every weight (rollout.lora_sync=merged) or sleep at level 1"
            )
        if not self.takes_adapters:
            raise PluginError(
                "begin_weight_update announced LoRA adapter factors, but the vllm rollout "
                "engine started without LoRA; set rollout.lora_sync=adapters (or auto) with "
                "model.lora_rank > 0, or push merged weights"
            )
        (supported, *_) = self.llm.collective_rpc("plugrl_adapter_modules")
        unknown = unknown_adapter_modules(factors, supported)
        if unknown:
            raise PluginError(
                f"begin_weight_update announced {', '.join(unknown[:2])}"
                + (f" and {len(unknown) - 2} more" if len(unknown) > 2 else "")
                + ", adapters on modules vLLM puts no LoRA on (it takes "
                + ", ".join(supported)
                + "); set model.target_modules to those, or rollout.lora_sync=merged"
            )

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        update = self._update
        if update is None:
            raise RuntimeError(
                "load_weights without begin_weight_update; announce the weights of the new "
                "version first"
            )
        for name, _ in bucket:
            if name not in update.announced:
                raise PluginError(
                    f"load_weights got {name!r}, which begin_weight_update did not announce; "
                    "announce every weight of the version"
                )
        update.received.update(name for name, _ in bucket)
        if update.groups is None:
            # the bucket's memory is reused once this returns; an adapter is small
            update.adapter.update((name, tensor.detach().clone()) for name, tensor in bucket)
            return
        ready = update.groups.add(bucket)
        if ready:
            # the model holds a mix of versions until every weight has arrived
            self._no_weights = "the last weight update did not finish"
            self.llm.collective_rpc("plugrl_load_weights", args=(self.weight_route, ready))

    async def finish_weight_update(self) -> None:
        update = self._update
        if update is None:
            raise RuntimeError("finish_weight_update without begin_weight_update")
        self._update = None
        missing = sorted(set(update.announced) - update.received)
        if missing:
            self._no_weights = "the last weight update did not finish"
            raise PluginError(
                f"finish_weight_update: {len(update.received)} of {len(update.announced)} "
                f"announced weights arrived; missing {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + "; push the version again from begin_weight_update, every announced weight "
                "through load_weights"
            )
        if update.groups is None:
            self._register_adapter(update.adapter)
        else:
            self._base_dropped = False
        # cached prefixes hold keys and values of the old weights, and so do the requests in
        # flight: preempted, they compute theirs again with the new weights
        self.llm.reset_prefix_cache(reset_running_requests=True)
        self._no_weights = None
        self.weight_version = update.version
        self._kick()

    def _register_adapter(self, factors: dict[str, torch.Tensor]) -> None:
        from vllm.lora.request import LoRARequest

        self._no_weights = "the last adapter update did not finish"
        self.llm.collective_rpc("plugrl_load_adapter", args=(ADAPTER_ID, factors))
        if self._lora_request is None:
            self._lora_request = LoRARequest(ADAPTER_NAME, ADAPTER_ID, ADAPTER_SOURCE)

    async def weight_fingerprints(self, names: Sequence[str]) -> dict[str, WeightFingerprint]:
        """Read back from vLLM's worker, through the worker extension: each Hugging Face
        weight's rows of the layer vLLM loaded it into (its shard of a fused layer), in the
        engine's dtype. One device per engine only: a tensor-parallel engine holds slices
        of a weight on each device."""
        if self.config.tensor_model_parallel_size > 1:
            raise NotImplementedError(
                "the vllm rollout engine reads its weights back only with "
                "rollout.tensor_model_parallel_size 1"
            )
        wanted = [name for name in names if name in self._weight_shapes]
        if self._lora_request is not None and all(is_adapter_weight(n) for n in wanted):
            (held, *_) = self.llm.collective_rpc(
                "plugrl_adapter_fingerprints", args=(ADAPTER_ID, wanted, self.dtype_name)
            )
            return {name: WeightFingerprint(**values) for name, values in held.items()}
        shapes = {name: list(shape) for name, shape in self._weight_shapes.items()}
        (answer, *_) = self.llm.collective_rpc(
            "plugrl_weight_fingerprints", args=(wanted, shapes, self.dtype_name)
        )
        return {name: WeightFingerprint(**values) for name, values in answer.items()}

    # ------------------------------------------------------------------------------ lifecycle

    async def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if not self._sleeps:
            return
        # "keep": requests in flight stay in the scheduler and continue after wake_up
        self.llm.sleep(level, mode="keep")
        self._asleep = True
        if level == 2:
            self._no_weights = "the vllm rollout engine dropped its weights in sleep(level=2)"
            self._base_dropped = True

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if not self._sleeps:
            return
        tags = list(tags or ("weights", "kv_cache"))
        unknown = set(tags) - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"wake_up tags are 'weights' and 'kv_cache', got {sorted(unknown)}")
        self._asleep = not self.llm.wake_up(tags)
        self._kick()

    def close(self) -> None:
        self._end_samples(list(self._samples.values()), deliver=True)
        for _, future in self._scores.values():
            if _waited_on(future):
                future.set_exception(RuntimeError("the vllm rollout engine was closed"))
        self._scores.clear()
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.engine_core.shutdown()

    # ---------------------------------------------------------------------------- checkpoints

    def rng_state(self) -> torch.Tensor:
        """The state of the generator unseeded requests take their seeds from."""
        return self._seeds.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore :meth:`rng_state`, so a resumed run samples what the original would have."""
        self._seeds.set_state(state)

    # -------------------------------------------------------------------------- the step loop

    def _can_step(self) -> bool:
        return (
            self.llm is not None
            and bool(self._samples or self._scores)
            and not self._paused
            and not self._asleep
            and self._update is None
            and self._no_weights is None
        )

    def _kick(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the step loop on this event loop when there is work and it is not running."""
        if not self._can_step():
            return
        if self._task is not None and not self._task.done():
            return
        loop = loop or asyncio.get_running_loop()
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._can_step():
                version = self.weight_version
                for output in self.llm.step():
                    if output.request_id in self._scores:
                        self._take_score(output)
                    else:
                        self._take(output, version)
                # let abort, pause and weight calls in between two steps
                await asyncio.sleep(0)
        except Exception as error:
            logger.error("the vllm rollout engine failed while generating: %s", error)
            for sample in list(self._samples.values()):
                self._forget(sample)
                if _waited_on(sample.state.future):
                    sample.state.future.set_exception(error)
            for _, future in self._scores.values():
                if _waited_on(future):
                    future.set_exception(error)
            self._scores.clear()

    def _take_score(self, output: Any) -> None:
        if not output.finished:
            return
        prompt_length, future = self._scores.pop(output.request_id)
        if not _waited_on(future):
            return
        given = list(output.prompt_token_ids)
        logprobs = output.prompt_logprobs
        if logprobs is None or len(logprobs) != len(given):
            future.set_exception(
                PluginError(
                    "vLLM returned no prompt log-probs for a scoring request; remove what turns "
                    "them off from the teacher's rollout.engine_kwargs"
                )
            )
            return
        future.set_result(
            [
                float(position[token].logprob)
                for position, token in zip(
                    logprobs[prompt_length:], given[prompt_length:], strict=True
                )
            ]
        )

    def _take(self, output: Any, version: int) -> None:
        sample = self._samples.get(output.request_id)
        if sample is None:  # aborted meanwhile
            return
        produced = output.outputs[0]
        new_tokens = list(produced.token_ids)
        sample.token_ids.extend(new_tokens)
        sample.log_probs.extend(_sampled_log_probs(produced.logprobs, new_tokens))
        sample.versions.extend([version] * len(new_tokens))
        if output.finished:
            self._finish(sample, _FINISH_REASONS.get(produced.finish_reason, "aborted"))

    def _end_samples(self, samples: list[_Sample], *, deliver: bool) -> None:
        """End samples now: they leave vLLM and, with ``deliver``, return what they have."""
        live = [sample for sample in samples if sample.vllm_id in self._samples]
        if not live:
            return
        if self.llm is not None:
            self.llm.abort_request([sample.vllm_id for sample in live])
        for sample in live:
            if deliver:
                self._finish(sample, "aborted")
            else:
                self._forget(sample)

    def _finish(self, sample: _Sample, finish: FinishReason) -> None:
        self._forget(sample)
        state = sample.state
        state.completions[sample.index] = Completion(
            token_ids=sample.token_ids,
            log_probs=sample.log_probs,
            finish_reason=finish,
            token_versions=sample.versions,
            weight_version=self.weight_version,
            request_id=sample.request.request_id,
            sample_index=sample.index,
        )
        state.unfinished -= 1
        if state.unfinished == 0 and _waited_on(state.future):
            state.future.set_result(list(state.completions))

    def _forget(self, sample: _Sample) -> None:
        self._samples.pop(sample.vllm_id, None)
        siblings = self._by_request.get(sample.request.request_id)
        if siblings is not None and sample in siblings:
            siblings.remove(sample)
            if not siblings:
                del self._by_request[sample.request.request_id]

    # -------------------------------------------------------------------------------- helpers

    def _asleep_tags(self) -> set[str]:
        return {"weights", "kv_cache"} if self._asleep else set()

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self._seeds))

    def _empty(self, request: GenerationRequest, index: int, finish: FinishReason) -> Completion:
        return Completion(
            token_ids=[],
            log_probs=[],
            finish_reason=finish,
            weight_version=self.weight_version,
            request_id=request.request_id,
            sample_index=index,
        )


def image_token_id(hf_config: Any) -> int | None:
    """The id of the token a vision-language model's processor repeats for each image
    (``image_token_id``, in older configs ``image_token_index``); None for a text model."""
    if getattr(hf_config, "vision_config", None) is None:
        return None
    for name in ("image_token_id", "image_token_index"):
        value = getattr(hf_config, name, None)
        if value is not None:
            return int(value)
    return None


def video_token_id(hf_config: Any) -> int | None:
    """The id of the token a vision-language model's processor repeats for each video;
    None for a text model or one without videos."""
    if getattr(hf_config, "vision_config", None) is None:
        return None
    value = getattr(hf_config, "video_token_id", None)
    return None if value is None else int(value)


def video_with_metadata(frames: Any, fps: float) -> tuple[Any, dict[str, Any]]:
    """A video for vLLM's ``multi_modal_data``: its sampled frames ``[T, H, W, 3]`` and the
    metadata vLLM passes to the model's processor, which tells it the frames are sampled
    already (all kept) at ``fps`` a second, the rate Qwen2.5-VL spaces their positions by."""
    count = len(frames)
    return frames, {
        "fps": fps,
        "total_num_frames": count,
        "frames_indices": list(range(count)),
        "duration": count / fps,
        "video_backend": "plugrl",
        "do_sample_frames": False,
    }


def one_token_per_image(prompt_ids: Sequence[int], image_token: int) -> list[int]:
    """``prompt_ids`` with each run of ``image_token`` (one image, expanded by the processor
    to its patches) shortened to one: the prompt as the chat template wrote it, before the
    processor, which is what vLLM expands with the images it is given."""
    shortened: list[int] = []
    for token in prompt_ids:
        if token == image_token and shortened and shortened[-1] == image_token:
            continue
        shortened.append(token)
    return shortened


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _waited_on(future: asyncio.Future) -> bool:
    """Whether someone can still receive the future's result (its loop may have ended)."""
    return not future.done() and not future.get_loop().is_closed()


def _sampled_log_probs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The log-probability of each sampled token, from vLLM's per-position mappings."""
    if logprobs is None:
        raise PluginError(
            "vLLM returned no log-probs although the engine asks for them (logprobs=0); "
            "remove what turns them off from rollout.engine_kwargs"
        )
    return [
        float(position[token].logprob) for position, token in zip(logprobs, token_ids, strict=True)
    ]
