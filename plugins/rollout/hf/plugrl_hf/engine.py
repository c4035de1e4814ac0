"""The ``hf`` rollout engine: continuous batching over a Hugging Face causal LM's forward.

Its weights and compute are in ``rollout.dtype`` (``auto``: bfloat16 where the device says
bfloat16 is fast, else float32), whatever the trainer's dtype: weights are cast as they arrive.

In the trainer's process (``context.model_from_trainer``) the trainer's live module is handed
over with :meth:`HFRolloutEngine.bind_model` at each weight sync. A plain module in
``rollout.dtype`` is used as it is (no copy). A module its backend manages (FSDP: forward hooks
and DTensor weights, which keep the lean decode path of :mod:`~plugrl_hf.lean` away) or one in
another dtype is copied into a plain module of the engine's own, refreshed at each
``bind_model`` (``rollout.copy_trainer_weights``). Otherwise the engine builds its own model
from ``model.path`` and receives new weights in the three update phases.

Requests join and leave the running batch at any step (:mod:`~plugrl_hf.batch`,
:mod:`~plugrl_hf.kv`). The decode loop is an asyncio task on the loop the
requests arrive on; it yields to the loop between steps, so ``abort``, ``pause``, ``resume``
and the weight-update calls run between two tokens, and it ends when there is nothing to do.

An engine on Ray with ``rollout.tensor_model_parallel_size`` > 1 splits its model over its
devices: this process is rank 0 and drives ranks of its own, on the other bundles of its span
when it crosses nodes (``context.engine_span``), else processes on the other devices it sees
(:mod:`~plugrl_hf.tensor_parallel`).

Sampling is seeded per sample (:mod:`~plugrl_hf.sampler`): a request with
``params.seed`` samples the same tokens whatever runs beside it; a request without one takes a
seed from the engine's generator, seeded from ``trainer.seed``, so a run repeats exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch
import torch.distributed as dist

from plugrl.api import PluginError, RecipeError
from plugrl.api.data import multimodal_family, quiet_hf_loading
from plugrl.api.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    PauseMode,
    RolloutEngine,
    WeightFingerprint,
    WeightMeta,
    derive_seed,
    weight_fingerprint,
)
from plugrl_hf.batch import DecodeBatch, Row
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.sampler import StopStringMatcher, default_stop_token_ids
from plugrl_hf.tensor_parallel import (
    Channel,
    LockstepBatch,
    ShardedModel,
    join_group,
    ray_node_id,
    tensor_parallel_unsupported,
)

if TYPE_CHECKING:
    from plugrl.api import EngineSpan, PartContext, Recipe

logger = logging.getLogger("plugrl.rollout.hf")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    recipe: Recipe,
    device: torch.device,
    attn_implementation: str = "sdpa",
    dtype: torch.dtype | None = None,
) -> Any:
    """The model of ``model.path`` in ``dtype`` (default ``model.dtype``) on ``device``, in
    eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    path = recipe.model.path
    if not path:
        raise RecipeError(
            "the hf rollout engine needs a model folder to load its own model; set model.path",
            key="model.path",
        )
    if not Path(path).is_dir():
        raise RecipeError(
            f"{path} is not a folder; set a local Hugging Face model folder", "model.path"
        )
    trust = recipe.model.trust_remote_code
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    for name, value in recipe.model.override_config.items():
        setattr(config, name, value)
    # a vision-language model: its language-model head over text and image tokens
    vision = getattr(config, "vision_config", None) is not None
    model_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    with quiet_hf_loading():
        model = model_class.from_pretrained(
            path,
            config=config,
            dtype=dtype or DTYPES[recipe.model.dtype],
            attn_implementation=attn_implementation,
            trust_remote_code=trust,
        )
    return model.to(device).eval()


class _Request:
    """A request in flight: its samples, those admitted so far, and its future."""

    __slots__ = (
        "admitted",
        "completions",
        "future",
        "matcher",
        "request",
        "rows",
        "seed",
        "stop_ids",
        "unfinished",
    )

    def __init__(
        self,
        request: GenerationRequest,
        future: asyncio.Future,
        seed: int,
        stop_ids: frozenset[int],
        matcher: StopStringMatcher | None,
    ) -> None:
        self.request = request
        self.future = future
        self.seed = seed
        self.stop_ids = stop_ids
        self.matcher = matcher
        self.admitted = 0
        self.unfinished = request.params.n
        self.rows: list[Row] = []
        self.completions: list[Completion | None] = [None] * request.params.n


@attrs.define
class _WeightUpdate:
    version: int
    announced: dict[str, WeightMeta]
    storages: dict[str, int]
    """Announced name -> storage of its target (tied weights share one)."""
    received: set[int] = attrs.field(factory=set)


class HFRolloutEngine(RolloutEngine):
    """Samples with a Hugging Face causal LM's forward and a KV cache; requests join and leave
    the running batch at any step."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.STREAM,
            Capability.ABORT,
            Capability.PAUSE_KEEP,
            Capability.WEIGHT_UPDATE,
            Capability.SLEEP,
            Capability.SHARE_MODEL,
            Capability.IMAGES,
            Capability.SCORE,
        }
    )
    # an engine whose span crosses nodes splits the model over its span's bundles (see
    # plugrl_hf.tensor_parallel)
    spans_nodes: ClassVar[bool] = True

    def __init__(self, config: HFRolloutConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: HFRolloutConfig = config
        self.recipe = context.recipe
        self.tokenizer = context.tokenizer
        self.torch_device = (
            context.device.torch_device() if context.device is not None else torch.device("cpu")
        )
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id: int = pad if pad is not None else self.tokenizer.eos_token_id
        self._seeds = torch.Generator().manual_seed(self.recipe.trainer.seed)
        self.dtype_name = config.resolved_dtype(context.device)
        self.dtype: torch.dtype = DTYPES[self.dtype_name]
        """What the engine's weights and compute are in (``rollout.dtype`` resolved)."""
        self.model: Any = None
        self.owns_model = False
        self._source: Any = None
        """The trainer's module :attr:`model` is a copy of (``None``: no copy)."""
        self._batch: DecodeBatch | None = None
        self._default_stop_ids: frozenset[int] = frozenset()
        self._waiting: deque[_Request] = deque()
        self._in_flight: dict[str, list[_Request]] = {}
        self._paused = False
        self._update: _WeightUpdate | None = None
        self._no_weights: str | None = None
        """Why the model's weights cannot be used until a weight update (None: they can)."""
        self._asleep: set[str] = set()
        self._sleep_level = 0
        self._sleeps = self.torch_device.type != "cpu"
        """Whether sleep moves anything (on the CPU it is a no-op)."""
        self._param_shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self._task: asyncio.Task | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        self._restore_training = False
        self._shards: ShardedModel | None = None
        """This rank's shard of a model split over the span (``None``: the whole model)."""
        self._channel: Channel | None = None
        self._workers: list[Any] = []
        self._processes: list[Any] = []
        if not context.model_from_trainer:
            # an engine on Ray has its actor's process to itself; in the driver's
            # (cluster: local) the trainer's group is the process's torch.distributed group
            split = config.tensor_model_parallel_size > 1 and self.recipe.cluster.mode == "ray"
            if config.tensor_model_parallel_size > 1 and not split:
                logger.info(
                    "hf rollout engine: the whole model runs in this process, which it shares "
                    "with the trainer (cluster.mode=local); rollout.tensor_model_parallel_size "
                    "splits it on Ray (cluster.mode=ray)"
                )
            # a model to split is loaded on the CPU: only this rank's share goes to the device
            model = load_model(
                self.recipe,
                torch.device("cpu") if split else self.torch_device,
                config.attn_implementation,
                self.dtype,
            )
            if not split:
                self._use_model(model, owns=True)
            elif context.engine_span is not None:
                self.model = model
                self._start_span_workers(context.engine_span)
            else:
                self.model = model
                self._start_local_workers()

    # ---------------------------------------------------------------------- tensor parallel

    def _start_local_workers(self) -> None:
        """Start the other ranks of an engine of one node's devices as processes of this
        one (it sees the devices of the whole span: rank ``r`` takes its ``r``-th), and split
        the model with them."""
        from plugrl_hf.tensor_parallel import free_port, run_local_rank

        world = self.config.tensor_model_parallel_size
        self._check_splits(world)
        port = free_port()
        backend = self.context.device.dist_backend if self.context.device else "gloo"
        device_type = self.torch_device.type
        spawn = torch.multiprocessing.get_context("spawn")
        for rank in range(1, world):
            process = spawn.Process(
                target=run_local_rank,
                args=(
                    self.recipe,
                    rank,
                    world,
                    "cpu" if device_type == "cpu" else f"{device_type}:{rank}",
                    backend,
                    self.config,
                    self.dtype,
                    self.pad_token_id,
                    "127.0.0.1",
                    port,
                ),
                daemon=True,
                name=f"plugrl-hf-rank{rank}",
            )
            process.start()
            self._processes.append(process)
        try:
            self.join_tensor_parallel("127.0.0.1", port, world, backend)
        except BaseException:
            self._stop_workers()
            raise

    def _check_splits(self, world: int) -> None:
        reason = tensor_parallel_unsupported(self.model, world)
        if reason is not None:
            raise RecipeError(
                f"the hf rollout engine cannot split {type(self.model).__name__} over "
                f"{world} ranks: {reason}; set a rollout.tensor_model_parallel_size that "
                "divides them, or use the vllm engine",
                key="rollout.tensor_model_parallel_size",
            )

    def _start_span_workers(self, span: EngineSpan) -> None:
        """Start a worker on each bundle of the span but the first (this actor's), each
        pinned to its bundle, and split the model with them."""
        from plugrl.api.cluster import import_ray
        from plugrl_hf.tensor_parallel import TensorParallelWorker, free_port

        ray = import_ray("the hf engine's tensor-parallel workers")
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world = len(span.bundles)
        if world != self.config.tensor_model_parallel_size:
            raise PluginError(
                f"the hf rollout engine's span has {world} bundles, but "
                f"rollout.tensor_model_parallel_size is {self.config.tensor_model_parallel_size}"
            )
        self._check_splits(world)
        places = [
            (node, bundle, local)
            for node in span.nodes
            for local, bundle in enumerate(node.bundles)
        ]
        address = ray.util.get_node_ip_address()
        port = free_port()
        remote = ray.remote(TensorParallelWorker)
        device_type = self.torch_device.type
        for rank, (node, bundle, local) in enumerate(places[1:], start=1):
            options = {
                **node.actor_options,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=span.placement_group,
                    placement_group_bundle_index=bundle,
                ),
            }
            device = "cpu" if device_type == "cpu" else f"{device_type}:{local}"
            worker = remote.options(**options).remote(
                self.recipe,
                rank,
                world,
                device,
                self.context.device.dist_backend if self.context.device else "gloo",
                self.config,
                self.dtype,
                self.pad_token_id,
            )
            self._workers.append((worker, worker.run.remote(address, port)))
        try:
            self.join_tensor_parallel(
                address,
                port,
                world,
                self.context.device.dist_backend if self.context.device else "gloo",
                expected_nodes=[node.node_id for node, _, _ in places],
            )
        except BaseException:
            self._stop_workers()
            raise

    def join_tensor_parallel(
        self,
        address: str,
        port: int,
        world: int,
        backend: str = "gloo",
        expected_nodes: Sequence[str] | None = None,
    ) -> None:
        """Become rank 0 of a group of ``world`` ranks at ``address:port`` whose other
        ranks run :meth:`plugrl_hf.tensor_parallel.TensorParallelWorker.run`, and split
        the model with them; from now on every forward pass runs on all ranks.
        ``expected_nodes``: the Ray node each rank must be on."""
        group, channel = join_group(address, port, 0, world, backend)
        failure = None
        try:
            shards = ShardedModel(self.model, 0, world, group)
        except Exception as error:
            failure = f"rank 0: {error}"
        ready: list[Any] = [None] * world
        dist.all_gather_object(ready, (failure, ray_node_id()), group=channel.group)
        failures = [f for f, _ in ready if f is not None]
        nodes = tuple(node for _, node in ready)
        if not failures and expected_nodes is not None and list(nodes) != list(expected_nodes):
            failures = [
                f"its ranks run on nodes {', '.join(map(str, nodes))}, not on their bundles' "
                f"{', '.join(expected_nodes)}"
            ]
        if failures:
            # the other ranks leave the group after the handshake too
            dist.destroy_process_group()
            raise PluginError(
                "the hf rollout engine could not split its model over its span: "
                + "; ".join(failures)
            )
        self._shards = shards
        self._channel = channel
        self.rank_nodes = nodes if all(nodes) else None
        # the batch follows on every rank from now on
        self._use_model(self.model.to(self.torch_device), owns=True)
        logger.info(
            "hf rollout engine: tensor-parallel over %d ranks%s",
            world,
            ": " + ", ".join(f"rank {r} on node {n[:12]}" for r, n in enumerate(nodes))
            if self.rank_nodes
            else "",
        )

    def _stop_workers(self) -> None:
        """Close the group (its ranks return) and end the worker actors and processes."""
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.send(("close",))
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            self._channel = None
        if self._workers:
            from plugrl.api.cluster import import_ray

            ray = import_ray("the hf engine's tensor-parallel workers")
            for worker, _ in self._workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker)
            self._workers = []
        for process in self._processes:
            # they return when the group closes; one that does not is ended
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        self._processes = []

    def _whole_shape(self, name: str, target: torch.Tensor) -> tuple[int, ...]:
        """The unsplit shape of the weight ``name`` (``target``: this rank's)."""
        if self._shards is None:
            return tuple(target.shape)
        return self._shards.whole_shapes[name]

    # ------------------------------------------------------------------------------- requests

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        params = request.params
        params.check()
        if not request.prompt_ids:
            raise ValueError(
                f"the prompt of request {request.request_id!r} is empty; every prompt needs at "
                "least one token"
            )
        self._check_ready()
        if request.multi_modal_inputs is not None and self._batch.vision is None:
            raise ValueError(
                f"request {request.request_id!r} has images or videos, but the engine's model is "
                "not a vision-language model; use a vision-language model (model.path)"
            )
        loop = asyncio.get_running_loop()
        seed = params.seed if params.seed is not None else self._draw_seed()
        if params.max_tokens == 0:
            return [
                Completion(
                    token_ids=[],
                    log_probs=[],
                    finish_reason="length",
                    weight_version=self.weight_version,
                    request_id=request.request_id,
                    sample_index=index,
                )
                for index in range(params.n)
            ]
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need the run's tokenizer; the engine has none")
        matcher = StopStringMatcher(params.stop, self._decode) if params.stop else None
        stop_ids = self._default_stop_ids | frozenset(params.stop_token_ids)
        state = _Request(request, loop.create_future(), seed, stop_ids, matcher)
        self._in_flight.setdefault(request.request_id, []).append(state)
        self._waiting.append(state)
        self._kick(loop)
        try:
            return await state.future
        except asyncio.CancelledError:
            # the caller gave up: the request leaves the engine
            self._end_request(state, finish=False)
            raise

    async def score_tokens(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int]
    ) -> list[float]:
        if not prompt_ids:
            raise ValueError("cannot score tokens after an empty prompt; give at least one token")
        self._check_ready()
        if not response_ids:
            return []
        tokens = torch.tensor(
            [[*prompt_ids, *response_ids]], dtype=torch.long, device=self.torch_device
        )
        targets = tokens[0, len(prompt_ids) :]
        training = self.model.training
        if self._channel is not None:
            self._channel.send(("score", tokens[0].tolist()))
        # one prefill between two decode steps: the decode loop yields to this loop between them
        with torch.no_grad():
            if training:
                self.model.eval()
            try:
                logits = self.model(input_ids=tokens, use_cache=False).logits
            finally:
                if training:
                    self.model.train()
        # the logits at position i predict token i + 1
        predicting = logits[0, len(prompt_ids) - 1 : -1].float()
        log_probs = torch.log_softmax(predicting, dim=-1).gather(-1, targets[:, None])
        return log_probs.squeeze(-1).tolist()

    async def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            for state in list(self._in_flight.get(request_id, ())):
                self._abort_request(state)

    async def pause(self, mode: PauseMode = "keep") -> None:
        if mode not in ("keep", "abort"):
            raise ValueError(f"pause mode must be 'keep' or 'abort', got {mode!r}")
        # the decode loop runs on this event loop, so no step is under way now: it sees the
        # flag before its next step
        self._paused = True
        if mode == "abort":
            for states in list(self._in_flight.values()):
                for state in list(states):
                    self._abort_request(state)

    async def resume(self) -> None:
        self._paused = False
        self._kick()

    # -------------------------------------------------------------------------------- weights

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        self._require_own_model()
        if self._sleep_level == 2 and "weights" in self._asleep:
            raise RuntimeError(
                "the hf rollout engine dropped its weights in sleep(level=2); call "
                "wake_up(tags=['weights']) before begin_weight_update"
            )
        if self._update is not None:
            logger.warning(
                "begin_weight_update(%d) while the update to version %d was not finished; "
                "starting over",
                version,
                self._update.version,
            )
        targets = self.model.state_dict()
        path = self.recipe.model.path
        announced: dict[str, WeightMeta] = {}
        for meta in weights:
            target = targets.get(meta.name)
            if target is None:
                raise PluginError(
                    f"begin_weight_update announced {meta.name!r}, which the rollout model of "
                    f"{path} does not have; push weights under Hugging Face names of the same "
                    "architecture"
                )
            whole = self._whole_shape(meta.name, target)
            if whole != tuple(meta.shape):
                raise PluginError(
                    f"begin_weight_update announced {meta.name!r} of shape {tuple(meta.shape)}, "
                    f"the rollout model's is {whole}; push full (unsharded) weights"
                )
            announced[meta.name] = meta
        storages = {name: _storage(targets[name]) for name in announced}
        covered = set(storages.values())
        missing = [name for name, target in targets.items() if _storage(target) not in covered]
        if missing:
            raise PluginError(
                f"begin_weight_update announced {len(targets) - len(missing)} of {len(targets)} "
                f"weights; missing {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + "; push every weight with each version"
            )
        # generation waits until finish_weight_update: no token comes from a mix of versions
        self._update = _WeightUpdate(version, announced, storages)

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        update = self._update
        if update is None:
            raise RuntimeError(
                "load_weights without begin_weight_update; announce the weights of the new "
                "version first"
            )
        targets = self.model.state_dict()
        with torch.no_grad():
            if self._channel is None:
                for name, tensor in bucket:
                    target = self._checked_target(update, targets, name, tensor)
                    # the model holds a mix of versions until every weight has arrived
                    self._no_weights = "the last weight update did not finish"
                    target.copy_(tensor.detach())
                    update.received.add(update.storages[name])
                return
            # a split model: the whole bucket is checked before any rank takes a slice of it
            for name, tensor in bucket:
                self._checked_target(update, targets, name, tensor)
            self._no_weights = "the last weight update did not finish"
            self._channel.send(("load", [(name, tuple(t.shape), t.dtype) for name, t in bucket]))
            for name, tensor in bucket:
                self._channel.send_tensor(tensor)
                self._shards.load(name, tensor.detach())
                update.received.add(update.storages[name])

    def _checked_target(
        self, update: _WeightUpdate, targets: dict[str, torch.Tensor], name: str, tensor: Any
    ) -> torch.Tensor:
        """The model's tensor ``name`` of a bucket, once ``tensor`` is known to fit it."""
        if update.announced.get(name) is None:
            raise PluginError(
                f"load_weights got {name!r}, which begin_weight_update did not announce; "
                "announce every weight of the version"
            )
        target = targets[name]
        whole = self._whole_shape(name, target)
        if tuple(tensor.shape) != whole:
            raise PluginError(
                f"load_weights got {name!r} of shape {tuple(tensor.shape)}, the rollout "
                f"model's is {whole}; push full (unsharded) weights"
            )
        return target

    async def finish_weight_update(self) -> None:
        update = self._update
        if update is None:
            raise RuntimeError("finish_weight_update without begin_weight_update")
        self._update = None
        missing = [n for n, s in update.storages.items() if s not in update.received]
        if missing:
            self._no_weights = "the last weight update did not finish"
            raise PluginError(
                f"finish_weight_update: {len(update.storages) - len(missing)} of "
                f"{len(update.storages)} announced weights arrived; missing "
                f"{', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                + "; push the version again from begin_weight_update, every announced weight "
                "through load_weights"
            )
        self._no_weights = None
        assert self._batch is not None
        self._batch.weights_changed()
        self._new_version(update.version)
        self._kick()

    async def weight_fingerprints(self, names: Sequence[str]) -> dict[str, WeightFingerprint]:
        """The fingerprints of the named weights of the model the engine samples with (its
        own, or its copy of the trainer's, or the trainer's module itself), in its dtype."""
        self._check_ready()
        held = self.model.state_dict()
        names = [name for name in names if name in held]
        if self._shards is not None and self._channel is not None:
            # the split weights are gathered whole from every rank's slice
            self._channel.send(("gather", names))
            return {
                name: weight_fingerprint(self._shards.whole(name, self._channel.group))
                for name in names
            }
        return {name: weight_fingerprint(_full_tensor(held[name])) for name in names}

    def bind_model(self, model: Any, version: int) -> None:
        """Generate with the trainer's live ``model`` from now on, as ``version``: with the
        module itself, or with the engine's copy of its weights, taken now (see the module
        docstring). Rows in flight continue: their caches are recomputed with it before their
        next token. Call it between steps (the engine idle or paused), not from another thread
        while it generates."""
        if self._shards is not None:
            raise RuntimeError(
                "this hf rollout engine splits its own model over its span; it takes new "
                "weights through begin_weight_update, load_weights and finish_weight_update"
            )
        reason = self._copy_reason(model)
        if reason is not None:
            self._bind_copy(model, reason)
        elif model is not self.model:
            self._source = None
            self._use_model(model, owns=False)
        elif self._batch is not None:
            # the trainer changed the weights since (copies of them are stale)
            self._batch.weights_changed()
        self._no_weights = None
        if version != self.weight_version:
            self._new_version(version)

    def _copy_reason(self, model: Any) -> str | None:
        """Why the engine generates from a copy of ``model``'s weights (``None``: it uses the
        module itself)."""
        parameter = next(iter(model.parameters()), None)
        if parameter is None:
            return None
        trainer_dtype = str(parameter.dtype).removeprefix("torch.")
        if not self.config.copy_trainer_weights:
            if self.config.dtype != "auto" and parameter.dtype != self.dtype:
                raise RecipeError(
                    f"rollout.dtype is {self.config.dtype}, but the trainer's weights are "
                    f"{trainer_dtype} and rollout.copy_trainer_weights is false (the engine "
                    f"generates with them as they are); set rollout.dtype to {trainer_dtype} or "
                    "auto, or rollout.copy_trainer_weights to true",
                    key="rollout.dtype",
                )
            return None
        if parameter.dtype != self.dtype:
            return f"the trainer's weights are {trainer_dtype}, rollout.dtype {self.dtype_name}"
        return managed_by_backend(model)

    def _bind_copy(self, source: Any, reason: str) -> None:
        """Generate from the engine's own plain module with ``source``'s current weights, cast
        to the engine's dtype (built on the first call for a module, refreshed after)."""
        if source is self._source and self.model is not None:
            copy_weights(source, self.model)
            assert self._batch is not None
            self._batch.weights_changed()
            return
        parameter = next(iter(source.parameters()))
        plain = plain_model_like(
            source,
            self.dtype,
            parameter.device,
            self.config.attn_implementation,
            self.recipe.model.trust_remote_code,
        )
        copy_weights(source, plain)
        self._source = source
        self._use_model(plain, owns=False)
        # a detail of how the engine works, not news at every start: shown with --verbose
        logger.debug(
            "hf rollout engine: generates from its own %s copy of the trainer's weights, "
            "refreshed at each weight sync (rollout.copy_trainer_weights): %s",
            self.dtype_name,
            reason,
        )

    def _new_version(self, version: int) -> None:
        self.weight_version = version
        if self._batch is not None:
            for row in self._batch.rows:
                row.mark_version(version)
            # the cache of rows in flight was computed with the old weights
            self._batch.invalidate()

    # ------------------------------------------------------------------------------ lifecycle

    async def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if not self._sleeps:
            return
        if self._batch is not None:
            self._batch.invalidate(free=True)
        if self.owns_model and "weights" not in self._asleep:
            if self._channel is not None:
                self._channel.send(("sleep", level))
            if level == 1:
                self.model.to("cpu")
            else:
                with torch.no_grad():
                    for parameter in self.model.parameters():
                        parameter.data = parameter.data.new_empty(0)
                self._no_weights = "the hf rollout engine dropped its weights in sleep(level=2)"
            self._sleep_level = level
        self._asleep = {"weights", "kv_cache"}
        if self.context.device is not None:
            self.context.device.empty_cache()

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        if not self._sleeps:
            return
        tags = set(tags or ("weights", "kv_cache"))
        unknown = tags - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"wake_up tags are 'weights' and 'kv_cache', got {sorted(unknown)}")
        if "weights" in tags and "weights" in self._asleep and self.owns_model:
            if self._channel is not None:
                self._channel.send(("wake_up",))
            if self._sleep_level == 2:
                with torch.no_grad():
                    for name, parameter in self.model.named_parameters():
                        shape, dtype = self._param_shapes[name]
                        parameter.data = torch.empty(shape, dtype=dtype, device=self.torch_device)
            else:
                self.model.to(self.torch_device)
        self._asleep -= tags
        if not self._asleep:
            self._sleep_level = 0
        self._kick()

    def close(self) -> None:
        for states in list(self._in_flight.values()):
            for state in list(states):
                self._abort_request(state)
        self._stop_workers()
        self._shards = None
        self.model = None
        self._source = None
        self.owns_model = False
        self._batch = None

    # ---------------------------------------------------------------------------- checkpoints

    def rng_state(self) -> torch.Tensor:
        """The state of the generator unseeded requests take their seeds from."""
        return self._seeds.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore :meth:`rng_state`, so a resumed run samples what the original would have."""
        self._seeds.set_state(state)

    # ------------------------------------------------------------------------ the decode loop

    def _can_step(self) -> bool:
        batch = self._batch
        return (
            batch is not None
            and not self._paused
            and self._update is None
            and self._no_weights is None
            and not self._asleep
            and bool(batch.rows or (self._waiting and batch.free_slots))
        )

    def _kick(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the decode loop on this event loop when there is work and it is not running."""
        if not self._can_step():
            return
        loop = loop or asyncio.get_running_loop()
        task = self._task
        if task is not None and not task.done():
            if self._task_loop is loop:
                return
            if self._task_loop is not None and not self._task_loop.is_closed():
                raise RuntimeError(
                    "the hf rollout engine is generating on another event loop; drive one "
                    "engine from one loop"
                )
        self._task_loop = loop
        self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        try:
            while self._can_step():
                self._iteration()
                if not self._can_step():
                    break
                # let abort, pause and weight calls in between two tokens
                await asyncio.sleep(0)
        except Exception as error:
            self._fail_all(error)
        finally:
            if self._restore_training and self.model is not None:
                self.model.train()
            self._restore_training = False

    def _iteration(self) -> None:
        """Admit waiting requests into free slots, then one decode step."""
        batch = self._batch
        assert batch is not None
        # grad mode is per thread: set it here, where the model runs
        with torch.no_grad():
            if self.model.training:
                self.model.eval()
                self._restore_training = True
            if self._waiting and batch.free_slots:
                batch.admit(self._take_waiting(batch.free_slots))
            if batch.rows:
                for row in batch.step():
                    self._row_done(row)

    def _take_waiting(self, free: int) -> list[Row]:
        rows = []
        while self._waiting and free:
            state = self._waiting[0]
            params = state.request.params
            take = min(free, params.n - state.admitted)
            for index in range(state.admitted, state.admitted + take):
                row = Row(
                    owner=state,
                    sample_index=index,
                    prompt=state.request.prompt_ids,
                    images=state.request.multi_modal_inputs,
                    params=params,
                    seed=derive_seed(state.seed, index),
                    stop_ids=state.stop_ids,
                    matcher=state.matcher,
                    version=self.weight_version,
                )
                state.rows.append(row)
                rows.append(row)
            state.admitted += take
            free -= take
            if state.admitted == params.n:
                self._waiting.popleft()
        return rows

    def _row_done(self, row: Row) -> None:
        state: _Request = row.owner
        state.rows.remove(row)
        state.completions[row.sample_index] = Completion(
            token_ids=row.tokens,
            log_probs=row.log_probs,
            finish_reason=row.finish_reason or "aborted",  # type: ignore[arg-type]
            token_versions=row.token_versions(),
            weight_version=self.weight_version,
            request_id=state.request.request_id,
            sample_index=row.sample_index,
        )
        state.unfinished -= 1
        if state.unfinished == 0:
            self._end_request(state, finish=True)

    def _abort_request(self, state: _Request) -> None:
        """End a request now: running samples keep their tokens, the others are empty."""
        if self._batch is not None and state.rows:
            self._batch.remove(state.rows)
        if state in self._waiting:
            self._waiting.remove(state)
        for index in range(state.admitted, state.request.params.n):
            state.completions[index] = Completion(
                token_ids=[],
                log_probs=[],
                finish_reason="aborted",
                weight_version=self.weight_version,
                request_id=state.request.request_id,
                sample_index=index,
            )
            state.unfinished -= 1
        state.admitted = state.request.params.n
        if not state.rows:
            self._end_request(state, finish=True)
        for row in list(state.rows):
            row.finish_reason = "aborted"
            self._row_done(row)  # the last one ends the request

    def _end_request(self, state: _Request, *, finish: bool) -> None:
        if state in self._waiting:
            self._waiting.remove(state)
        if self._batch is not None and state.rows:
            self._batch.remove(state.rows)
        state.rows.clear()
        states = self._in_flight.get(state.request.request_id, [])
        if state in states:
            states.remove(state)
            if not states:
                del self._in_flight[state.request.request_id]
        if finish and _waited_on(state.future):
            state.future.set_result(list(state.completions))

    def _fail_all(self, error: Exception) -> None:
        logger.error("the hf rollout engine failed while generating: %s", error)
        if self._batch is not None:
            try:
                self._batch.clear()
            except Exception as lost:
                # the other ranks of a split model are gone: the requests fail all the same
                logger.error("the hf rollout engine could not reach its other ranks: %s", lost)
        for states in list(self._in_flight.values()):
            for state in list(states):
                state.rows.clear()
                self._end_request(state, finish=False)
                if _waited_on(state.future):
                    state.future.set_exception(error)

    # -------------------------------------------------------------------------------- helpers

    def _use_model(self, model: Any, *, owns: bool) -> None:
        rows = self._batch.rows if self._batch is not None else []
        self.model = model
        self.owns_model = owns
        parameter = next(iter(model.parameters()), None)
        if parameter is not None and parameter.device != self.torch_device:
            # sample where the model lives (the trainer's rank device)
            self.torch_device = parameter.device
            self._sleeps = self.torch_device.type != "cpu"
        self._param_shapes = {name: (p.shape, p.dtype) for name, p in model.named_parameters()}
        self._default_stop_ids = frozenset(default_stop_token_ids(model, self.tokenizer))
        if self._channel is not None:
            # the lean path computes on whole weights: a split model runs its own forward,
            # whose o_proj and down_proj sum over the ranks
            self._batch = LockstepBatch(
                model,
                self._channel,
                device=self.torch_device,
                pad_token_id=self.pad_token_id,
                max_rows=self.config.max_num_seqs,
                prefill_tokens=self.config.max_prefill_tokens,
                lean_decode=False,
            )
        else:
            self._batch = DecodeBatch(
                model,
                device=self.torch_device,
                pad_token_id=self.pad_token_id,
                max_rows=self.config.max_num_seqs,
                prefill_tokens=self.config.max_prefill_tokens,
                lean_decode=self.config.lean_decode,
                vision=self._vision_family(model),
            )
        if self._batch.fallback_reason:
            logger.info(
                "hf rollout engine: %s, so requests join only when the running batch is empty "
                "(no continuous batching for this model)",
                self._batch.fallback_reason,
            )
        lean_unsupported = getattr(self._batch.kv, "lean_unsupported", None)
        if self.config.lean_decode and lean_unsupported:
            # the trainer's own model (bind_model) is managed by its backend (FSDP's DTensor
            # weights): its forward is the only way, which is no news at every start
            (logger.info if owns else logger.debug)(
                "hf rollout engine: decode steps and prompt passes run the model's own forward: %s",
                lean_unsupported,
            )
        self._batch.adopt(rows)

    def _vision_family(self, model: Any) -> Any:
        """The model family of a vision-language model (from the plugin answering
        ``multimodal_model``), which gives the positions of prompts with images; ``None`` for
        a text model."""
        if getattr(model.config, "vision_config", None) is None:
            return None
        plugins = self.context.plugins
        if plugins is None:
            raise PluginError(
                "the hf rollout engine serves a vision-language model, whose positions come "
                "from the plugin supporting it: build the engine's context with plugins=..."
            )
        return multimodal_family(str(self.recipe.model.path), model.config, plugins)

    def _check_ready(self) -> None:
        if self.model is None:
            raise RuntimeError(
                "the hf rollout engine has no model yet: it was built to share the trainer's "
                "(context.model_from_trainer), so call bind_model(model, version) first"
            )
        if self._no_weights is not None and self._update is None:
            raise RuntimeError(
                f"{self._no_weights}; load new weights (begin_weight_update, load_weights, "
                "finish_weight_update) before generating"
            )

    def _require_own_model(self) -> None:
        if not self.owns_model:
            raise RuntimeError(
                "this hf rollout engine generates with the trainer's own model (bind_model); "
                "there are no weights to push, call bind_model(model, version)"
            )

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self._seeds))

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


def managed_by_backend(model: Any) -> str | None:
    """Why ``model`` is its training backend's to run (FSDP's module, DTensor weights), or
    ``None`` for a plain module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        fsdp_types: tuple[type, ...] = ()
    else:
        fsdp_types = (FSDPModule,)
    if fsdp_types and any(isinstance(m, fsdp_types) for m in model.modules()):
        return "FSDP manages the trainer's module (its hooks and DTensor weights)"
    for parameter in model.parameters():
        if type(parameter.data) is not torch.Tensor:
            return f"the trainer's weights are {type(parameter.data).__name__}, not plain tensors"
    return None


def plain_model_like(
    source: Any,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str,
    trust_remote_code: bool,
) -> Any:
    """An eval-mode module of ``source``'s class and config in ``dtype`` on ``device``, its
    tensors allocated and not initialised (:func:`copy_weights` fills them)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    # the trainer's config stays the trainer's: the copy sets its own attention kernel
    config = copy.deepcopy(source.config)
    vision = getattr(config, "vision_config", None) is not None
    model_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    with torch.device("meta"):
        plain = model_class.from_config(
            config,
            dtype=dtype,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
        )
    plain.to_empty(device=device)
    if getattr(source, "generation_config", None) is not None:
        plain.generation_config = copy.deepcopy(source.generation_config)
    return plain.eval()


def copy_weights(source: Any, target: Any) -> None:
    """Copy every parameter and buffer of ``source`` into ``target``'s of the same name,
    cast to ``target``'s dtypes (DTensor weights are gathered whole first)."""
    tensors = dict(source.named_parameters(remove_duplicate=False))
    tensors.update(source.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        for name, target_tensor in [
            *target.named_parameters(remove_duplicate=False),
            *target.named_buffers(remove_duplicate=False),
        ]:
            tensor = tensors.get(name)
            if tensor is None:
                raise PluginError(
                    f"the trainer's module has no {name!r}, which the hf rollout engine's copy "
                    f"of its architecture ({type(target).__name__}) has; hand bind_model the "
                    "Hugging Face module itself, or set rollout.copy_trainer_weights to false"
                )
            full = getattr(tensor, "full_tensor", None)
            target_tensor.copy_(full() if full is not None else tensor)


def _full_tensor(tensor: Any) -> torch.Tensor:
    """A local tensor of the whole weight: a DTensor (the trainer's FSDP module, shared) is
    gathered."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def _waited_on(future: asyncio.Future) -> bool:
    """Whether someone can still receive the future's result (its loop may have ended)."""
    return not future.done() and not future.get_loop().is_closed()


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
