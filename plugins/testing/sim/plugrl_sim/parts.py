"""The simulated parts (see :mod:`plugrl_sim`); the task and recipe they run on are the test
kit's (:mod:`plugrl.testing.simulated`), named here too."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from plugrl.api import (
    CheckpointError,
    PluginError,
    PlugrlError,
    fraction,
    non_negative,
    option,
    positive,
)
from plugrl.api.backend import ActorConfig, TrainingBackend
from plugrl.api.rollout import (
    Capability,
    Completion,
    GenerationRequest,
    PauseMode,
    RolloutConfig,
    RolloutEngine,
    WeightMeta,
    derive_seed,
)
from plugrl.testing.simulated import SimTask, build_sim_task, sim_recipe

__all__ = [
    "SimBackend",
    "SimBackendConfig",
    "SimEngine",
    "SimEngineConfig",
    "SimTask",
    "build_sim_task",
    "compute_score",
    "sim_recipe",
    "sim_weights",
]

if TYPE_CHECKING:
    import torch

    from plugrl.api import PartContext
    from plugrl.api.algorithms import ActorObjective
    from plugrl.api.data import Batch

_CHECKPOINT_FILE = "sim_backend.pt"
_RESUME_FIX = (
    "resume from an earlier global_step_N folder or start fresh with trainer.resume_mode=disable"
)
_MAX_CATCH_UP_S = 0.01


def _visible_devices(context: PartContext) -> str | None:
    """What the device's ``visible_devices_env`` says in this process (``None`` on CPU)."""
    name = getattr(type(context.device), "visible_devices_env", None) if context.device else None
    return os.environ.get(name) if name else None


def sim_weights(seed: int) -> dict[str, torch.Tensor]:
    """The weights of version 0, the same in the backend and in every engine."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=generator),
        "model.norm.weight": torch.ones(16),
        "lm_head.weight": torch.randn(64, 16, generator=generator),
    }


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class SimEngineConfig(RolloutConfig):
    """``rollout`` with ``engine: sim``."""

    sim_devices: int | None = option(
        None,
        "Simulated devices of the engine, each a replica running up to rollout.max_num_seqs "
        "sequences; unset: the devices one engine spans (rollout.tensor_model_parallel_size), "
        "so that on Ray the engines of rollout.nnodes x rollout.n_gpus_per_node devices are "
        "that many devices. Set it for one engine in one process to stand for several.",
        validator=positive,
    )
    sim_step_ms: float = option(
        2.0, "Fixed milliseconds of one decode step of a device.", validator=non_negative
    )
    sim_token_ms: float = option(
        0.015,
        "Milliseconds one decode step adds per sequence running on the device. Decoding a "
        "small model is bound by reading its weights, so a full batch costs little more than "
        "one sequence: 64 sequences make a step about 1.5x as long as one.",
        validator=non_negative,
    )
    sim_long_fraction: float = option(
        0.06, "Fraction of samples that run to max_tokens.", validator=fraction
    )
    sim_median_length_fraction: float = option(
        0.15,
        "Median length of the other samples, as a fraction of max_tokens.",
        validator=fraction,
    )
    sim_length_sigma: float = option(
        0.6, "Log-normal spread of the other samples' lengths.", validator=non_negative
    )
    sim_weight_load_ms: float = option(
        5.0, "Milliseconds finish_weight_update takes to load a version.", validator=non_negative
    )
    sim_trace_file: str | None = option(
        None,
        "File to which every engine appends one JSON line per call that changes its phase "
        "(start, sleep, wake_up, begin/finish_weight_update, generate) with its process id, "
        "weight version and what is asleep: the order of the phases across engine processes.",
    )


@attrs.define(eq=False)
class _Request:
    request: GenerationRequest
    future: asyncio.Future
    seed: int
    completions: list[Completion | None]
    unfinished: int
    samples: list[_Sample] = attrs.field(factory=list)


@attrs.define(eq=False)
class _Sample:
    owner: _Request
    index: int
    rng: random.Random
    target: int
    finish_reason: str
    tokens: list[int] = attrs.field(factory=list)
    log_probs: list[float] = attrs.field(factory=list)
    versions: list[int] = attrs.field(factory=list)
    device: int | None = None


class SimEngine(RolloutEngine):
    """A rollout engine whose costs are simulated (see the module's docstring)."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.STREAM,
            Capability.ABORT,
            Capability.PAUSE_KEEP,
            Capability.WEIGHT_UPDATE,
            Capability.SLEEP,
        }
    )

    def __init__(self, config: SimEngineConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: SimEngineConfig = config
        trainer = context.recipe.trainer
        devices = config.sim_devices or config.tensor_model_parallel_size
        self.devices = devices
        tokenizer = context.tokenizer
        self.vocab_size = len(tokenizer) if tokenizer is not None else 256
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id: int | None = eos
        self.weights = sim_weights(trainer.seed)
        self._seeds = random.Random(trainer.seed)
        self._waiting: deque[_Sample] = deque()
        self._running: list[list[_Sample]] = [[] for _ in range(devices)]
        self._requests: dict[str, list[_Request]] = {}
        self._tasks: list[asyncio.Task | None] = [None] * devices
        self._ticks: list[asyncio.Future | None] = [None] * devices
        self._paused = False
        self._asleep: set[str] = set()
        self._no_weights = False
        self._update: tuple[int, dict[str, WeightMeta], dict[str, torch.Tensor]] | None = None
        self.tokens_generated = 0
        """Tokens sampled so far (aborted samples' included)."""
        self._trace("start", devices=devices, visible=_visible_devices(context))

    def _trace(self, event: str, **fields: Any) -> None:
        path = self.config.sim_trace_file
        if path is None:
            return
        line = {
            "event": event,
            "pid": os.getpid(),
            "version": self.weight_version,
            "asleep": sorted(self._asleep),
            **fields,
        }
        # one write of one line: lines of several engine processes do not interleave
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(line) + "\n")

    # ------------------------------------------------------------------------------ requests

    async def generate_request(self, request: GenerationRequest) -> list[Completion]:
        params = request.params
        params.check()
        if not request.prompt_ids:
            raise ValueError(
                f"the prompt of request {request.request_id!r} is empty; every prompt needs at "
                "least one token"
            )
        self._trace("generate")
        loop = asyncio.get_running_loop()
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(62)
        state = _Request(request, loop.create_future(), seed, [None] * params.n, params.n)
        for index in range(params.n):
            sample = self._new_sample(state, index, params.max_tokens)
            if sample.target == 0:
                self._finish(sample, "length")
                continue
            state.samples.append(sample)
            self._waiting.append(sample)
        if state.unfinished:
            self._requests.setdefault(request.request_id, []).append(state)
            self._kick()
        try:
            return await state.future
        except asyncio.CancelledError:
            self._drop(state)
            raise

    def _new_sample(self, state: _Request, index: int, max_tokens: int) -> _Sample:
        rng = random.Random(derive_seed(state.seed, index))
        config = self.config
        if max_tokens == 0:
            target = 0
        elif rng.random() < config.sim_long_fraction:
            target = max_tokens
        else:
            median = max(config.sim_median_length_fraction * max_tokens, 1.0)
            drawn = rng.lognormvariate(math.log(median), config.sim_length_sigma)
            target = min(max_tokens, max(1, round(drawn)))
        reason = "length" if target >= max_tokens else "stop"
        return _Sample(state, index, rng, target, reason)

    async def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            for state in list(self._requests.get(request_id, ())):
                self._abort(state)

    async def pause(self, mode: PauseMode = "keep") -> None:
        if mode not in ("keep", "abort"):
            raise ValueError(f"pause mode must be 'keep' or 'abort', got {mode!r}")
        self._paused = True
        await self._quiesce()
        if mode == "abort":
            for states in list(self._requests.values()):
                for state in list(states):
                    self._abort(state)

    async def resume(self) -> None:
        self._paused = False
        self._kick()

    # ------------------------------------------------------------------------------- weights

    async def begin_weight_update(self, version: int, weights: Sequence[WeightMeta]) -> None:
        announced = {meta.name: meta for meta in weights}
        for name, meta in announced.items():
            own = self.weights.get(name)
            if own is None:
                raise PluginError(
                    f"begin_weight_update announced {name!r}, which the sim engine does not "
                    "have; push the sim backend's weights"
                )
            if tuple(own.shape) != tuple(meta.shape):
                raise PluginError(
                    f"begin_weight_update announced {name!r} of shape {tuple(meta.shape)}, the "
                    f"sim engine's is {tuple(own.shape)}; push full weights"
                )
        missing = sorted(set(self.weights) - set(announced))
        if missing:
            raise PluginError(
                f"begin_weight_update did not announce {', '.join(missing)}; push every weight "
                "with each version"
            )
        # no step runs from here to finish_weight_update: no token of a mix of versions
        self._trace("begin_weight_update", to=version)
        self._update = (version, announced, {})
        await self._quiesce()

    async def load_weights(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        if self._update is None:
            raise RuntimeError("load_weights without begin_weight_update")
        _, announced, received = self._update
        for name, tensor in bucket:
            if name not in announced:
                raise PluginError(
                    f"load_weights got {name!r}, which begin_weight_update did not announce"
                )
            received[name] = tensor.detach().clone()

    async def finish_weight_update(self) -> None:
        if self._update is None:
            raise RuntimeError("finish_weight_update without begin_weight_update")
        version, announced, received = self._update
        self._update = None
        missing = sorted(set(announced) - set(received))
        if missing:
            self._no_weights = True
            raise PluginError(
                f"finish_weight_update: {', '.join(missing)} did not arrive; push the version again"
            )
        await asyncio.sleep(self.config.sim_weight_load_ms / 1000)
        self.weights.update(received)
        self.weight_version = version
        self._no_weights = False
        self._trace("finish_weight_update")
        self._kick()

    # ----------------------------------------------------------------------------- lifecycle

    async def sleep(self, level: int = 1) -> None:
        self._asleep = {"weights", "kv_cache"}
        await self._quiesce()
        if level >= 2:
            self._no_weights = True  # dropped: a weight update must come before generating
        self._trace("sleep", level=level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        self._asleep -= set(tags) if tags is not None else {"weights", "kv_cache"}
        self._trace("wake_up")
        self._kick()

    def close(self) -> None:
        for task in self._tasks:
            if task is not None and not task.done():
                task.cancel()
        for states in list(self._requests.values()):
            for state in list(states):
                if not state.future.done():
                    state.future.set_exception(RuntimeError("the sim engine was closed"))
        self._requests.clear()

    # ------------------------------------------------------------------------ the decode loops

    def _blocked(self) -> bool:
        return self._paused or self._update is not None or bool(self._asleep) or self._no_weights

    def _kick(self) -> None:
        """Start the decode loop of every device that has work and none running."""
        if self._blocked():
            return
        loop = asyncio.get_running_loop()
        for device in range(self.devices):
            task = self._tasks[device]
            idle = task is None or task.done()
            if idle and (self._running[device] or self._waiting):
                self._tasks[device] = loop.create_task(self._decode(device))

    async def _quiesce(self) -> None:
        """Wait for the decode steps under way to end (no new one starts while blocked)."""
        pending = [tick for tick in self._ticks if tick is not None and not tick.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def _admit(self, device: int) -> None:
        running = self._running[device]
        # a new sample goes to the device with the fewest running, as a router spreads them
        while self._waiting and len(running) < self.config.max_num_seqs:
            if any(len(other) < len(running) for other in self._running):
                return
            sample = self._waiting.popleft()
            sample.device = device
            running.append(sample)

    async def _decode(self, device: int) -> None:
        loop = asyncio.get_running_loop()
        running = self._running[device]
        # the device's own clock: a step ends its cost after the previous one ended, so the
        # event loop's wake-up latency (about a millisecond) does not add to every step
        clock = loop.time()
        while not self._blocked():
            self._admit(device)
            if not running:
                return
            config = self.config
            tick = loop.create_future()
            self._ticks[device] = tick
            version = self.weight_version
            try:
                clock += (config.sim_step_ms + config.sim_token_ms * len(running)) / 1000
                # time the host lost beyond a few steps is lost to the device too
                clock = max(clock, loop.time() - _MAX_CATCH_UP_S)
                await asyncio.sleep(max(clock - loop.time(), 0.0))
                for sample in list(running):  # aborted samples left the list meanwhile
                    self._sample_token(sample, version)
            finally:
                tick.set_result(None)

    def _sample_token(self, sample: _Sample, version: int) -> None:
        rng = sample.rng
        last = len(sample.tokens) + 1 == sample.target
        if last and sample.finish_reason == "stop" and self.eos_token_id is not None:
            token = self.eos_token_id
        else:
            token = rng.randrange(self.vocab_size - 1)
            if self.eos_token_id is not None and token >= self.eos_token_id:
                token += 1  # anything but the end of the text
        sample.tokens.append(token)
        sample.log_probs.append(-0.05 - 2.0 * rng.random())
        sample.versions.append(version)
        self.tokens_generated += 1
        if last:
            self._finish(sample, sample.finish_reason)

    # -------------------------------------------------------------------------- request ends

    def _finish(self, sample: _Sample, reason: str) -> None:
        if sample.device is not None and sample in self._running[sample.device]:
            self._running[sample.device].remove(sample)
        state = sample.owner
        state.completions[sample.index] = Completion(
            token_ids=sample.tokens,
            log_probs=sample.log_probs,
            finish_reason=reason,  # type: ignore[arg-type]
            token_versions=sample.versions,
            weight_version=self.weight_version,
            request_id=state.request.request_id,
            sample_index=sample.index,
        )
        state.unfinished -= 1
        if state.unfinished == 0:
            self._forget(state)
            if not state.future.done():
                state.future.set_result(list(state.completions))

    def _abort(self, state: _Request) -> None:
        """End a request now: its samples return the tokens they have."""
        for sample in state.samples:
            if state.completions[sample.index] is None:
                if sample in self._waiting:
                    self._waiting.remove(sample)
                self._finish(sample, "aborted")

    def _drop(self, state: _Request) -> None:
        """The caller gave up on a request: it leaves the engine."""
        for sample in state.samples:
            if sample in self._waiting:
                self._waiting.remove(sample)
            if sample.device is not None and sample in self._running[sample.device]:
                self._running[sample.device].remove(sample)
        self._forget(state)

    def _forget(self, state: _Request) -> None:
        states = self._requests.get(state.request.request_id, [])
        if state in states:
            states.remove(state)
            if not states:
                del self._requests[state.request.request_id]


# --------------------------------------------------------------------------------------------
# The training backend
# --------------------------------------------------------------------------------------------


@attrs.define(kw_only=True)
class SimBackendConfig(ActorConfig):
    """``actor`` with ``backend: sim``."""

    sim_devices: int | None = option(
        None,
        "Simulated devices one rank's costs are divided over; unset: 1, each rank one device "
        "(on Ray the batch is split over trainer.nnodes x trainer.n_gpus_per_node ranks). Set "
        "it for the one rank of a one-process run to stand for several.",
        validator=positive,
    )
    sim_forward_ms_per_ktoken: float = option(
        20.0,
        "Milliseconds of a forward pass (log-probs) per thousand tokens on one device.",
        validator=non_negative,
    )
    sim_train_ms_per_ktoken: float = option(
        60.0,
        "Milliseconds of forward and backward (an update) per thousand tokens on one device.",
        validator=non_negative,
    )


class SimBackend(TrainingBackend):
    """A training backend whose costs are simulated (see the module's docstring)."""

    def __init__(self, config: SimBackendConfig, context: PartContext) -> None:
        super().__init__(config, context)
        self.config: SimBackendConfig = config
        self.devices = config.sim_devices or 1
        self.weights: dict[str, torch.Tensor] = {}
        self.shift = 0.0
        """The policy: an offset added to the rollout log-probability of every token."""
        self.update_steps = 0

    def setup(self, total_training_steps: int) -> None:
        self.weights = sim_weights(self.recipe.trainer.seed)

    def _spend(self, batch: Batch, ms_per_ktoken: float) -> int:
        tokens = int(batch["attention_mask"].sum().item())
        time.sleep(tokens / 1000 * ms_per_ktoken / 1000 / max(self.devices, 1))
        return tokens

    def _log_prob(self, batch: Batch, shift: Any) -> torch.Tensor:
        import torch

        mask = batch["response_mask"].to(torch.float32)
        base = batch.get("rollout_log_probs")
        if base is None:
            base = torch.zeros_like(mask)
        return (base.to(torch.float32) + shift) * mask

    def compute_log_prob(
        self, batch: Batch, *, calculate_entropy: bool = False
    ) -> dict[str, torch.Tensor]:
        import torch

        self._spend(batch, self.config.sim_forward_ms_per_ktoken)
        out = {"log_probs": self._log_prob(batch, self.shift)}
        if calculate_entropy:
            out["entropys"] = batch["response_mask"].to(torch.float32)
        return out

    def update_policy(self, batch: Batch, objective: ActorObjective) -> dict[str, float]:
        import torch

        from plugrl.api.algorithms import loss_scale_from_mask
        from plugrl.api.backend import mean_metrics

        needed = ["response_mask", "advantages", "old_log_probs", "attention_mask"]
        if getattr(objective, "needs_ref", False):
            needed.append("ref_log_prob")
        batch.require(*needed, by="the sim actor update")
        self._spend(batch, self.config.sim_train_ms_per_ktoken)
        rows = max(self.config.mini_batch_rows(self.recipe.rollout.n) // self.dp_size, 1)
        lr = self.config.optim.lr
        records = []
        for _ in range(self.config.ppo_epochs):
            for mini_batch in batch.split(rows):
                shift = torch.tensor(self.shift, requires_grad=True)
                mask = mini_batch["response_mask"]
                scale = loss_scale_from_mask(
                    mask,
                    dp_size=self.dp_size,
                    max_response_length=self.recipe.data.max_response_length,
                    loss_scale_factor=self.config.loss_scale_factor,
                )
                entropy = (
                    mask.to(torch.float32) if getattr(objective, "needs_entropy", False) else None
                )
                loss, metrics = objective(
                    mini_batch, self._log_prob(mini_batch, shift), entropy, scale
                )
                loss.backward()
                grad = float(shift.grad) if shift.grad is not None else 0.0
                clip = self.config.grad_clip
                step = max(-clip, min(clip, grad)) if clip > 0 else grad
                self.shift -= lr * step
                self.weights["model.norm.weight"] -= lr * step
                self.update_steps += 1
                records.append({**metrics, "actor/grad_norm": abs(grad), "actor/lr": lr})
        return mean_metrics(records)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from self.weights.items()

    def weight_metadata(self) -> list[WeightMeta]:
        return [
            WeightMeta(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
            for name, tensor in self.weights.items()
        ]

    def save_checkpoint(self, path: Path) -> None:
        import torch

        path.mkdir(parents=True, exist_ok=True)
        state = {"weights": self.weights, "shift": self.shift, "update_steps": self.update_steps}
        torch.save(state, path / _CHECKPOINT_FILE)

    def load_checkpoint(self, path: Path) -> None:
        from plugrl.api.backend import load_weights_only

        file = path / _CHECKPOINT_FILE
        try:
            state = load_weights_only(file, fix=_RESUME_FIX)
        except FileNotFoundError:
            raise CheckpointError(f"{file} is missing; the checkpoint is incomplete") from None
        except CheckpointError:
            raise
        except Exception as exc:
            reason = (str(exc).strip().splitlines() or [""])[0]
            raise CheckpointError(f"{file} cannot be read ({reason}); it is corrupt") from None
        self.weights = state["weights"]
        self.shift = float(state["shift"])
        self.update_steps = int(state["update_steps"])

    def export_hf(self, path: Path) -> None:
        raise PlugrlError(
            "the sim backend has no model to export as a Hugging Face folder; set "
            "trainer.export_hf=false"
        )


# --------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> dict[str, float]:
    """1 when the response text's length has the parity the ground truth names, else 0."""
    correct = len(solution_str) % 2 == int(ground_truth) % 2
    return {"score": float(correct), "acc": float(correct)}
