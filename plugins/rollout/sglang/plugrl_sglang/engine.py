"""The ``sglang`` rollout engine: SGLang's offline ``Engine`` inside an engine worker.

Every control call goes through the engine's ``TokenizerManager`` coroutines
(``update_weights_from_tensor``, ``release_memory_occupation``, ``pause_generation``, ...),
the way SGLang's own HTTP server calls them: the synchronous ``Engine`` methods run
``loop.run_until_complete`` and cannot be called from the engine worker's running event loop.

Pausing with ``mode="keep"`` aborts the requests in flight inside SGLang and sends each sample
again as prompt + tokens so far after :meth:`SGLangRolloutEngine.resume`, so every token is
stamped with the weight version that produced it (SGLang's ``retract`` mode would keep the
requests too, but a finished request would not say which of its tokens came before the update).

A request with images (a vision-language model's) gives SGLang its image inputs as the
processor computed them for the trainer, as SGLang's ``processor_output`` image data beside
the prompt's token ids (each image already expanded to its tokens): SGLang then neither decodes
the ids nor runs the processor again, and its vision tower sees the trainer's pixel values.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.api import PluginError
from plugrl.api.rollout import (
    Capability,
    Completion,
    FinishReason,
    GenerationRequest,
    PauseMode,
    RolloutEngine,
    SamplingParams,
    WeightFingerprint,
    WeightMeta,
    derive_seed,
    weight_fingerprint,
)
from plugrl_sglang import INSTALL
from plugrl_sglang.config import SGLangRolloutConfig

if TYPE_CHECKING:
    import torch

    from plugrl.api import PartContext

logger = logging.getLogger("plugrl.sglang")

READBACK_ROWS = 64
"""Rows of each weight ``weight_fingerprints`` reads back (SGLang sends them as Python
floats): enough to see a stale or skipped weight, few enough to read every weight."""

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "aborted"}


@attrs.frozen
class SGLangAPI:
    """The SGLang names this engine uses, imported once (tests swap in a fake module)."""

    version: str
    Engine: Any
    UpdateWeightsFromTensorReqInput: Any
    ReleaseMemoryOccupationReqInput: Any
    ResumeMemoryOccupationReqInput: Any
    PauseGenerationReqInput: Any
    ContinueGenerationReqInput: Any
    MultiprocessingSerializer: Any
    GetWeightsByNameReqInput: Any = None
    """``None`` in an SGLang that cannot read weights back."""


def load_sglang_api() -> SGLangAPI:
    """Import SGLang; a missing or too old one is a one-line error naming the fix."""
    try:
        sglang = importlib.import_module("sglang")
        io_struct = importlib.import_module("sglang.srt.managers.io_struct")
        utils = importlib.import_module("sglang.srt.utils")
        return SGLangAPI(
            version=getattr(sglang, "__version__", "unknown"),
            Engine=sglang.Engine,
            UpdateWeightsFromTensorReqInput=io_struct.UpdateWeightsFromTensorReqInput,
            ReleaseMemoryOccupationReqInput=io_struct.ReleaseMemoryOccupationReqInput,
            ResumeMemoryOccupationReqInput=io_struct.ResumeMemoryOccupationReqInput,
            PauseGenerationReqInput=io_struct.PauseGenerationReqInput,
            ContinueGenerationReqInput=io_struct.ContinueGenerationReqInput,
            MultiprocessingSerializer=utils.MultiprocessingSerializer,
            GetWeightsByNameReqInput=getattr(io_struct, "GetWeightsByNameReqInput", None),
        )
    except (ImportError, AttributeError) as exc:
        raise PluginError(
            f"the sglang rollout engine needs SGLang 0.5.5 or newer ({exc}); install it with "
            f"{INSTALL}"
        ) from exc


def engine_arguments(config: SGLangRolloutConfig, context: PartContext) -> dict[str, Any]:
    """The ``sglang.Engine(**arguments)`` (its ``ServerArgs``) a recipe asks for."""
    recipe = context.recipe
    arguments: dict[str, Any] = {
        "model_path": str(recipe.model.path),
        "dtype": config.resolved_dtype(context.device),
        "tp_size": config.tensor_model_parallel_size,
        "mem_fraction_static": config.gpu_memory_utilization,
        "max_running_requests": config.max_num_seqs,
        "random_seed": recipe.trainer.seed,
        # token ids in and out; only stop strings need SGLang's own tokenizer
        "skip_tokenizer_init": not config.stop,
        "disable_cuda_graph": config.enforce_eager,
    }
    if context.device is not None and context.device.torch_device_type != "cpu":
        arguments["device"] = context.device.torch_device_type
    if sleeps(config):
        arguments["enable_memory_saver"] = True
        # sleep(level=1) keeps the weights in host memory, as the interface promises
        arguments["enable_weights_cpu_backup"] = True
    if not config.enable_chunked_prefill:
        arguments["chunked_prefill_size"] = -1
    elif config.max_num_batched_tokens is not None:
        arguments["chunked_prefill_size"] = config.max_num_batched_tokens
    if config.attention_backend is not None:
        arguments["attention_backend"] = config.attention_backend
    arguments.update(config.engine_kwargs)
    return arguments


def sleeps(config: SGLangRolloutConfig) -> bool:
    """Whether the engine frees its memory during training (needs SGLang's memory saver)."""
    return config.colocate and config.free_cache_engine


def sampling_arguments(
    params: SamplingParams, max_new_tokens: int, seed: int | None, eos_token_ids: Sequence[int]
) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one sample of a request."""
    arguments: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_new_tokens": max_new_tokens,
        "stop_token_ids": sorted({*params.stop_token_ids, *eos_token_ids}),
        # the trainer scores the exact tokens: keep special tokens and stop strings
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if params.stop:
        arguments["stop"] = list(params.stop)
    if seed is not None:
        arguments["sampling_seed"] = seed
    return arguments


def read_output(output: dict[str, Any], rid: str) -> tuple[list[int], list[float], str]:
    """Token ids, their log-probs and SGLang's finish type from one ``async_generate`` result."""
    meta = output.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    if pairs is None or kind not in _FINISH_REASONS:
        raise PluginError(
            f"SGLang's answer to request {rid} has no output_token_logprobs or no finish_reason "
            f"(meta_info keys: {sorted(meta)}); this engine needs return_logprob results of "
            "SGLang 0.5.5 or newer"
        )
    token_ids = [int(pair[1]) for pair in pairs]
    log_probs = [float(pair[0]) for pair in pairs]
    output_ids = output.get("output_ids")
    if output_ids is not None and list(output_ids) != token_ids:
        raise PluginError(
            f"SGLang's answer to request {rid}: output_ids ({len(output_ids)} tokens) and "
            f"output_token_logprobs ({len(token_ids)}) disagree; is incremental streaming "
            "output on (engine_kwargs)? turn it off"
        )
    return token_ids, log_probs, kind


@attrs.define
class _WeightUpdate:
    version: int
    announced: dict[str, WeightMeta]
    received: set[str] = attrs.field(factory=set)


class SGLangRolloutEngine(RolloutEngine):
    """Samples with SGLang's ``Engine``: continuous batching, per-token log-probs, weight
    updates in buckets from tensors, memory release between rollouts, pause and abort."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.STREAM,
            Capability.ABORT,
            Capability.PAUSE_KEEP,
            Capability.WEIGHT_UPDATE,
            Capability.SLEEP,
            Capability.IMAGES,
        }
    )

    def __init__(self, config: SGLangRolloutConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: SGLangRolloutConfig = config
        if context.model_from_trainer:
            raise PluginError(
                "the sglang rollout engine cannot generate with the trainer's model in the same "
                "process; it loads its own and receives weights (rollout.engine: hf can share)"
            )
        self.api = load_sglang_api()
        self.arguments = engine_arguments(config, context)
        logger.info("starting SGLang %s Engine(%s)", self.api.version, self.arguments)
        self.engine = self.api.Engine(**self.arguments)
        self.tokenizer_manager = self.engine.tokenizer_manager
        tokenizer = context.tokenizer
        eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        self.eos_token_ids: tuple[int, ...] = () if eos is None else (int(eos),)
        self.torch_device = context.device.torch_device() if context.device is not None else None
        self._generating = asyncio.Event()
        self._generating.set()
        self._awake = asyncio.Event()
        self._awake.set()
        self._keep_pauses = 0
        """How many times ``pause(mode="keep")`` ran: a sample aborted inside SGLang after one
        started continues instead of ending."""
        self._requests: dict[str, set[str]] = {}
        """Request id -> the SGLang rids of its samples now inside SGLang."""
        self._aborted: set[str] = set()
        self._segments = 0
        self._update: _WeightUpdate | None = None
        self._asleep: set[str] = set()

    # ------------------------------------------------------------------------------- requests

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        request.params.check()
        image_data = self._image_data(request)
        self._requests[request.request_id] = set()
        try:
            return list(
                await asyncio.gather(
                    *(self._sample(request, index, image_data) for index in range(request.params.n))
                )
            )
        finally:
            del self._requests[request.request_id]
            self._aborted.discard(request.request_id)

    def _image_data(self, request: GenerationRequest) -> dict[str, Any] | None:
        """SGLang's ``image_data`` and ``video_data`` for ``request``: its image inputs as one
        ``processor_output`` item (the processor's outputs for all the prompt's images, whose
        tokens ``prompt_ids`` already holds), its video inputs as another; None for a text
        prompt."""
        if request.multi_modal_inputs is None:
            return None
        model_config = getattr(self.tokenizer_manager, "model_config", None)
        if not getattr(model_config, "is_multimodal", False):
            raise ValueError(
                f"request {request.request_id!r} has images but the sglang engine's model "
                f"({self.context.recipe.model.path}) is a text model; train a vision-language "
                "model on data with images"
            )
        images: dict[str, Any] = {}
        videos: dict[str, Any] = {}
        for key, value in request.multi_modal_inputs.items():
            # the processor's names: pixel_values_videos, video_grid_thw, and Qwen2.5-VL's
            # second_per_grid_ts, which spaces the videos' positions
            (videos if "video" in key or key == "second_per_grid_ts" else images)[key] = value
        data: dict[str, Any] = {}
        if images:
            data["image_data"] = [{"format": "processor_output", **images}]
        if videos:
            data["video_data"] = [{"format": "processor_output", **videos}]
        return data

    async def _sample(
        self, request: GenerationRequest, index: int, image_data: dict[str, Any] | None
    ) -> Completion:
        params = request.params
        tokens: list[int] = []
        log_probs: list[float] = []
        versions: list[int] = []
        finish: FinishReason = "aborted"
        while True:
            await self._generating.wait()
            await self._awake.wait()
            if request.request_id in self._aborted:
                break
            budget = params.max_tokens - len(tokens)
            if budget <= 0:
                finish = "length"
                break
            # a continuation samples with its own seed, derived like continuation_request's
            seed = None
            if params.seed is not None:
                seed = derive_seed(params.seed, index)
                if tokens:
                    seed = derive_seed(params.seed, index, len(tokens))
            self._segments += 1
            rid = f"{request.request_id}/{index}#{self._segments}"
            pauses_before = self._keep_pauses
            self._requests[request.request_id].add(rid)
            images = image_data or {}
            try:
                output = await self.engine.async_generate(
                    input_ids=[*request.prompt_ids, *tokens],
                    sampling_params=sampling_arguments(params, budget, seed, self.eos_token_ids),
                    return_logprob=True,
                    rid=rid,
                    **images,
                )
            finally:
                self._requests[request.request_id].discard(rid)
            new_tokens, new_log_probs, kind = read_output(output, rid)
            # weights change only while SGLang holds no request (paused or idle), so the
            # version now is the one these tokens were sampled with
            tokens += new_tokens
            log_probs += new_log_probs
            versions += [self.weight_version] * len(new_tokens)
            kept = self._keep_pauses > pauses_before
            if kind == "abort" and kept and request.request_id not in self._aborted:
                continue
            finish = _FINISH_REASONS[kind]
            break
        return Completion(
            token_ids=tokens,
            log_probs=log_probs,
            finish_reason=finish,
            token_versions=versions,
            weight_version=self.weight_version,
            request_id=request.request_id,
            sample_index=index,
        )

    async def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            rids = self._requests.get(request_id)
            if rids is None:
                continue
            self._aborted.add(request_id)
            for rid in sorted(rids):
                self.tokenizer_manager.abort_request(rid=rid)

    async def pause(self, mode: PauseMode = "keep") -> None:
        if mode not in ("keep", "abort"):
            raise ValueError(f"pause mode must be 'keep' or 'abort', got {mode!r}")
        self._generating.clear()
        if mode == "keep":
            self._keep_pauses += 1
        else:
            self._aborted.update(self._requests)
        # SGLang's abort mode returns every request in flight with its tokens and holds new
        # ones until continue_generation
        await self.tokenizer_manager.pause_generation(
            self.api.PauseGenerationReqInput(mode="abort")
        )

    async def resume(self) -> None:
        await self.tokenizer_manager.continue_generation(self.api.ContinueGenerationReqInput())
        self._generating.set()

    # -------------------------------------------------------------------------------- weights

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        if "weights" in self._asleep:
            raise RuntimeError(
                "the sglang rollout engine released its weights in sleep(); call "
                "wake_up(tags=['weights']) before begin_weight_update"
            )
        if self._update is not None:
            logger.warning(
                "begin_weight_update(%d) while the update to version %d was not finished; "
                "starting over",
                version,
                self._update.version,
            )
        self._update = _WeightUpdate(version, {meta.name: meta for meta in weights})

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        update = self._update
        if update is None:
            raise RuntimeError(
                "load_weights without begin_weight_update; announce the weights of the new "
                "version first"
            )
        named = []
        for name, tensor in bucket:
            meta = update.announced.get(name)
            if meta is None:
                raise PluginError(
                    f"load_weights got {name!r}, which begin_weight_update did not announce; "
                    "announce every weight of the version"
                )
            if tuple(tensor.shape) != tuple(meta.shape):
                raise PluginError(
                    f"load_weights got {name!r} of shape {tuple(tensor.shape)}, announced as "
                    f"{tuple(meta.shape)}; push full (unsharded) weights"
                )
            named.append((name, self._on_engine_device(tensor)))
        if not named:
            return
        serializer = self.api.MultiprocessingSerializer
        # one payload per tensor-parallel rank: each rank takes its own copy and shards it
        payloads = [
            serializer.serialize(named) for _ in range(self.config.tensor_model_parallel_size)
        ]
        request = self.api.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=payloads, load_format=None, flush_cache=False
        )
        success, message = await self.tokenizer_manager.update_weights_from_tensor(request, None)
        if not success:
            raise PluginError(
                f"SGLang did not load a bucket of {len(named)} weights ({named[0][0]}, ...): "
                f"{message}"
            )
        update.received.update(name for name, _ in named)

    async def finish_weight_update(self) -> None:
        update = self._update
        if update is None:
            raise RuntimeError("finish_weight_update without begin_weight_update")
        self._update = None
        missing = sorted(set(update.announced) - update.received)
        if missing:
            raise PluginError(
                f"finish_weight_update: {len(update.announced) - len(missing)} of "
                f"{len(update.announced)} announced weights arrived; missing "
                f"{', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + "; push the version again from begin_weight_update"
            )
        # the prefix cache holds keys and values of the old weights
        flushed = await self.tokenizer_manager.flush_cache()
        if not getattr(flushed, "success", True):
            raise PluginError(
                "SGLang could not flush its prefix cache after a weight update (requests still "
                "running?); pause the engine around weight updates"
            )
        self.weight_version = update.version

    async def weight_fingerprints(self, names: Sequence[str]) -> dict[str, WeightFingerprint]:
        """Read back through SGLang's ``get_weights_by_name``, which returns the first rows
        of a weight (Hugging Face names; SGLang finds a shard of its fused layers), as float32
        values: fingerprinted in the engine's dtype, covering :data:`READBACK_ROWS` rows."""
        import torch

        request_type = self.api.GetWeightsByNameReqInput
        if request_type is None:
            raise NotImplementedError(
                f"SGLang {self.api.version} has no get_weights_by_name to read weights back"
            )
        dtype = getattr(torch, self.config.resolved_dtype(self.context.device))
        fingerprints = {}
        for name in names:
            request = request_type(name=name, truncate_size=READBACK_ROWS)
            values = await self.tokenizer_manager.get_weights_by_name(request, None)
            if values is None:
                continue
            if self.arguments.get("dp_size", 1) > 1:  # one answer per data-parallel replica
                values = values[0]
            held = torch.tensor(values, dtype=torch.float32).to(dtype)
            fingerprint = weight_fingerprint(held)
            rows = int(held.shape[0]) if held.dim() else None
            fingerprints[name] = attrs.evolve(fingerprint, rows=rows)
        return fingerprints

    def _on_engine_device(self, tensor: torch.Tensor) -> torch.Tensor:
        # SGLang sends tensors to its scheduler processes by handle; device tensors stay put
        if self.torch_device is None or tensor.device.type == self.torch_device.type:
            return tensor.detach()
        return tensor.detach().to(self.torch_device)

    # ------------------------------------------------------------------------------ lifecycle

    async def sleep(self, level: int = 1) -> None:
        if not sleeps(self.config):
            return
        tags = ["kv_cache", "weights"]
        self._awake.clear()
        await self.tokenizer_manager.release_memory_occupation(
            self.api.ReleaseMemoryOccupationReqInput(tags=tags), None
        )
        self._asleep.update(tags)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if not self._asleep:
            return
        wanted = sorted(self._asleep if tags is None else set(tags) & self._asleep)
        if wanted:
            await self.tokenizer_manager.resume_memory_occupation(
                self.api.ResumeMemoryOccupationReqInput(tags=wanted), None
            )
            self._asleep.difference_update(wanted)
        if not self._asleep:
            self._awake.set()

    def close(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            engine.shutdown()
