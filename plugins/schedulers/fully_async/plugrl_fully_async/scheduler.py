"""The fully-async scheduler: a rollouter keeps the engines generating on devices of their own
while the trainer trains on what they generated, within a bound on staleness (DESIGN section
7, verl's ``fully_async_policy``)."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any, ClassVar

import numpy as np

from plugrl.algorithms.functional import compute_rollout_is_weights
from plugrl.compose.run_parts import RunParts, sampling_seed
from plugrl.data.batch import Batch
from plugrl.data.rollout_batch import build_rollout_batch
from plugrl.errors import RecipeError
from plugrl.metrics import StepTimer, compute_data_metrics, compute_throughput_metrics
from plugrl.parts.rollout import Capability, SamplingParams
from plugrl.parts.scheduler import Scheduler
from plugrl.steps import update_from_batch, validate

from .accounting import StalenessAccount
from .buffer import make_buffer
from .config import FullyAsyncConfig
from .rollouter import PromptStream, Rollouter, Sample

logger = logging.getLogger("plugrl.run")

_ROLLOUT_SEED = 2  # a stream of sampling seeds apart from validation's (plugrl.compose)


class FullyAsyncScheduler(Scheduler):
    """verl's fully-async PPO/GRPO loop.

    A :class:`Rollouter` (a thread of the driver) streams prompts into the engine group and
    puts finished samples in a buffer (a Ray queue on Ray); the trainer takes
    ``required_samples = actor.ppo_mini_batch_size x require_batches`` of them per step,
    scores them, computes old log-probs (or uses the rollout's), advantages, and updates the
    actor; every ``trigger_parameter_sync_step`` steps it publishes new weights to every
    engine (``timing_s/param_sync``). :class:`StalenessAccount` bounds how far the rollouter
    runs ahead and drops any sample older than the bound.
    """

    provides: ClassVar[frozenset[str] | None] = frozenset({"values"})
    config: FullyAsyncConfig

    # ------------------------------------------------------------------ start-up

    def needed_capabilities(self) -> dict[str, str]:
        needs = {Capability.STREAM.value: "scheduler fully_async (prompts streamed one at a time)"}
        if self.config.partial_rollout:
            engine_cls = self.context.part("rollout_engines", self.recipe.rollout.engine)
            # pausing in place is best; ending and continuing responses works too
            if Capability.PAUSE_KEEP not in getattr(engine_cls, "capabilities", frozenset()):
                needs[Capability.ABORT.value] = "scheduler.partial_rollout=true"
        return needs

    def check_recipe(self) -> None:
        recipe = self.recipe
        if recipe.rollout.colocate:
            raise RecipeError(
                "scheduler fully_async generates while the trainer trains, so the engines need "
                "devices of their own; set rollout.colocate=false (rollout.nnodes x "
                "rollout.n_gpus_per_node devices for the engines)",
                key="rollout.colocate",
            )
        if recipe.algorithm.filter_groups.enable:
            raise RecipeError(
                "dynamic sampling (DAPO's group filtering) is not supported by scheduler "
                "fully_async; set algorithm.filter_groups.enable=false or scheduler=sync",
                key="algorithm.filter_groups.enable",
            )
        if self.config.total_rollout_steps is not None and (
            self.config.total_rollout_steps < self.required_samples
        ):
            raise RecipeError(
                f"{self.config.total_rollout_steps} prompts are fewer than one trainer step "
                f"takes (required_samples = actor.ppo_mini_batch_size x "
                f"scheduler.require_batches = {self.required_samples}); raise it",
                key="scheduler.total_rollout_steps",
            )

    @property
    def required_samples(self) -> int:
        return self.recipe.actor.ppo_mini_batch_size * self.config.require_batches

    def total_steps(self, parts: RunParts) -> int:
        trainer = self.recipe.trainer
        if self.config.total_rollout_steps is not None:
            return self.config.total_rollout_steps // self.required_samples
        if trainer.total_training_steps:
            return trainer.total_training_steps
        per_epoch = max(1, len(parts.train_data) // self.required_samples)
        return per_epoch * trainer.total_epochs

    def run(self) -> dict[str, Any]:
        self.check_recipe()
        parts = self.context.build_parts(self.needed_capabilities())
        try:
            return self._train(parts)
        finally:
            parts.close()

    # ------------------------------------------------------------------ the loop

    def _train(self, parts: RunParts) -> dict[str, Any]:
        recipe, config, trainer = self.recipe, self.config, self.recipe.trainer
        total = self.total_steps(parts)
        account = StalenessAccount(
            self.required_samples, config.trigger_parameter_sync_step, config.staleness_threshold
        )
        state = parts.resume()
        step, history, resubmit, wall_offset = 0, [], [], 0.0
        if state:
            step = state["step"]
            history = list(state.get("validation", []))
            saved = state.get("fully_async")
            if saved:
                account.load_state_dict(saved["account"])
                resubmit = [tuple(key) for key in saved["prompts"]]
                wall_offset = float(saved.get("wall_clock_s", 0.0))
            account.version = parts.weight_version
            if account.taken_this_period and step < total:
                self.start_period_on_resume(parts, account, step)
        if step >= total:
            logger.info(
                "the run in %s already finished its %d steps; set trainer.resume_mode=disable "
                "(or another trainer.default_local_dir) to train again",
                self.context.run_dir,
                total,
            )
        logger.info(
            "fully_async: %d prompts per step, weights synced every %d steps, at most %d "
            "samples ahead (max_required_samples), trained samples at most %d versions old",
            account.required_samples,
            account.trigger_parameter_sync_step,
            account.max_required_samples,
            account.max_version_lag,
        )
        parts.sync_weights()
        run_start = time.monotonic()
        if step == 0 and trainer.val_before_train and parts.val_data is not None:
            before = self.validate(parts, step)
            before["perf/wall_clock_s"] = wall_offset + time.monotonic() - run_start
            history.append(before)
            self.context.step_end(0, before)

        buffer = make_buffer(recipe.cluster.mode)
        rollouter = Rollouter(
            engines=parts.engines,
            account=account,
            stream=PromptStream(parts.train_loader),
            buffer=buffer,
            sampling_params=self.sampling_params,
            max_in_flight=config.max_in_flight_per_engine * parts.engines.num_engines,
            partial=self.partial_mode(parts),
            stop_after=config.total_rollout_steps,
            resubmit=resubmit,
        )
        metrics: dict[str, Any] = {}
        marks = _Marks(
            time.monotonic(),
            rollouter.idle_seconds(),
            rollouter.paused_seconds(),
            0,
            account.pauses,
        )
        progress = _progress(total, step)
        if step < total:
            rollouter.start()
        try:
            while step < total:
                step += 1
                metrics = self.train_step(parts, rollouter, step, marks)
                if not metrics:
                    step -= 1
                    logger.info(
                        "the rollouter generated its scheduler.total_rollout_steps=%s prompts "
                        "and too few are left for step %d; the run ends at step %d",
                        config.total_rollout_steps,
                        step + 1,
                        step,
                    )
                    break
                last = step == total
                if parts.val_data is not None and (
                    last or (trainer.test_freq > 0 and step % trainer.test_freq == 0)
                ):
                    validation = self.validate(parts, step)
                    history.append(validation)
                    metrics.update(validation)
                wall_clock = wall_offset + time.monotonic() - run_start
                metrics["perf/wall_clock_s"] = wall_clock
                # logged before the checkpoint that covers it: a run killed between the two
                # resumes from the checkpoint before and logs the step again in its place
                self.context.step_end(step, metrics)
                if last or (trainer.save_freq > 0 and step % trainer.save_freq == 0):
                    snapshot = rollouter.snapshot()
                    parts.save_checkpoint(
                        step,
                        {
                            "validation": history,
                            "dataloader": snapshot.pop("dataloader"),
                            "fully_async": {**snapshot, "wall_clock_s": wall_clock},
                        },
                    )
                if progress is not None:
                    progress.update(1)
        finally:
            if progress is not None:
                progress.close()
            rollouter.close()
            buffer.close()
        if trainer.export_hf:
            export_dir = self.context.run_dir / "hf_model"
            parts.actor.export_hf(export_dir)
            logger.info("exported the trained actor to %s", export_dir)
        _print_validation_summary(history)
        return metrics

    @staticmethod
    def start_period_on_resume(parts: RunParts, account: StalenessAccount, step: int) -> None:
        """The checkpoint was saved between two syncs: the trainer's weights have moved on
        from those the engines had as ``weight_version``, and those are lost. The weights the
        run resumes with become the next version (a version names one set of weights, and
        the versions of the samples, the lags and the bound are computed on them) and a
        new period starts here; the checkpoint's outstanding samples are generated again,
        so none carries an older version."""
        steps_since_sync = account.taken_this_period // account.required_samples
        parts.weight_version += 1
        account.sync()
        logger.info(
            "resumed %d step(s) after the last weight sync: the engines get the weights of "
            "step %d as a new version %d, and the next sync comes %d steps later, at step %d",
            steps_since_sync,
            step,
            account.version,
            account.trigger_parameter_sync_step,
            step + account.trigger_parameter_sync_step,
        )

    def partial_mode(self, parts: RunParts) -> str | None:
        if not self.config.partial_rollout:
            return None
        return "keep" if Capability.PAUSE_KEEP in parts.engines.capabilities else "abort"

    def sampling_params(self, sample_number: int) -> SamplingParams:
        recipe = self.recipe
        params = recipe.rollout.sampling_params(recipe.data.max_response_length)
        params.seed = sampling_seed(recipe.trainer.seed, sample_number, _ROLLOUT_SEED)
        return params

    def train_step(
        self, parts: RunParts, rollouter: Rollouter, step: int, marks: _Marks
    ) -> dict[str, Any]:
        """One trainer step; empty metrics when the rollouter has no more samples."""
        recipe = self.recipe
        account = rollouter.account
        timer = StepTimer()
        metrics: dict[str, Any] = {}
        with timer("step"):
            with timer("gen"):
                samples, dropped_lags = rollouter.take(self.required_samples)
            if len(samples) < self.required_samples:
                return {}
            version = account.version
            batch = self.assemble(parts, samples)
            with timer("reward"):
                self.score(parts, batch, metrics)
            self.old_log_probs(parts, batch, timer, metrics)
            metrics.update(update_from_batch(parts, batch, timer))
            # a period ends once it trained its samples; it starts at a sync, at the run's
            # start, or at a resume (see start_period_on_resume), not at a multiple of k
            if account.period_complete:
                with timer("param_sync"):
                    metrics.update(rollouter.sync(lambda: self.push_weights(parts)))
        metrics.update(
            compute_data_metrics(
                batch, recipe.data.max_response_length, recipe.data.max_prompt_length
            )
        )
        metrics.update(timer.metrics())
        num_tokens = int(batch["attention_mask"].sum().item())
        metrics.update(
            compute_throughput_metrics(num_tokens, timer.seconds["step"], parts.actor.world_size)
        )
        metrics.update(parts.device.memory_metrics())
        metrics.update(self.async_metrics(rollouter, samples, version, dropped_lags, timer, marks))
        metrics["training/global_step"] = step
        metrics["training/epoch"] = parts.train_loader.epoch
        return metrics

    @staticmethod
    def push_weights(parts: RunParts) -> dict[str, float]:
        parts.weight_version += 1
        return parts.sync_weights()

    def assemble(self, parts: RunParts, samples: list[Sample]) -> Batch:
        n = self.recipe.rollout.n
        batch = Batch.concat(
            build_rollout_batch(
                sample.prompt, sample.completions, n=n, pad_token_id=parts.pad_token_id
            )
            for sample in samples
        )
        # log-probs are recomputed at the temperature the tokens were sampled with
        batch.meta["temperature"] = self.recipe.rollout.temperature or 1.0
        return batch

    def old_log_probs(
        self, parts: RunParts, batch: Batch, timer: StepTimer, metrics: dict[str, Any]
    ) -> None:
        """``use_rollout_log_probs``: the engines' log-probs are the old ones (verl's meaning).
        Otherwise the trainer's current weights give them (recomputed, or taken by an exactly
        on-policy update from its own forward) and ``algorithm.rollout_is`` weighs each token
        by how much likelier the trainer finds it than the engine that sampled it."""
        if self.config.use_rollout_log_probs:
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return
        algorithm = self.recipe.algorithm
        if (
            parts.old_log_probs_from_update
            and self.config.require_batches == 1
            and algorithm.rollout_is is None
        ):
            return
        with timer("old_log_prob"):
            computed = parts.actor.compute_log_prob(batch, calculate_entropy=True)
            batch["old_log_probs"] = computed["log_probs"]
            if "entropys" in computed:
                mask = batch["response_mask"].bool()
                metrics["actor/entropy"] = computed["entropys"][mask].mean().item()
        if algorithm.rollout_is is not None:
            weights, is_metrics = compute_rollout_is_weights(
                batch["old_log_probs"],
                batch["rollout_log_probs"],
                batch["response_mask"],
                algorithm.rollout_is,
                algorithm.rollout_is_threshold,
            )
            batch["rollout_is_weights"] = weights
            metrics.update(is_metrics)

    @staticmethod
    def score(parts: RunParts, batch: Batch, metrics: dict[str, Any]) -> None:
        output = parts.reward(batch)
        batch["token_level_scores"] = output.token_level_scores
        for name, values in output.extra.items():
            if len(values) == len(batch) and name not in batch:
                batch[name] = values
        metrics.update(output.metrics)

    def async_metrics(
        self,
        rollouter: Rollouter,
        samples: list[Sample],
        version: int,
        dropped_lags: list[int],
        timer: StepTimer,
        marks: _Marks,
    ) -> dict[str, float]:
        account = rollouter.account
        now = time.monotonic()
        wall = max(now - marks.time, 1e-9)
        idle, paused = rollouter.idle_seconds(), rollouter.paused_seconds()
        with rollouter.lock:
            tokens, generated, dropped, abandoned = (
                rollouter.response_tokens,
                account.generated,
                account.dropped,
                account.abandoned,
            )
            pauses, partial_total = account.pauses, rollouter.partial_samples
            outstanding, staleness = account.outstanding, account.staleness_samples
        lags = [version - sample.oldest_version for sample in samples]
        spans = [sample.newest_version - sample.oldest_version for sample in samples]
        metrics = {
            "fully_async/count/staleness_samples": float(sum(lag > 0 for lag in lags)),
            "fully_async/count/current_param_version": float(account.version),
            "fully_async/count/total_generated_samples": float(generated),
            "fully_async/count/dropped_stale_samples": float(dropped),
            "fully_async/count/ended_stale_samples": float(abandoned),
            "fully_async/count/pauses": float(pauses),
            "fully_async/count/outstanding_samples": float(outstanding),
            "fully_async/count/rollouter_staleness_samples": float(staleness),
            "fully_async/count/max_required_samples": float(account.max_required_samples),
            "fully_async/trainer/idle_ratio": min(1.0, timer.seconds["gen"] / wall),
            "fully_async/rollouter/idle_ratio": min(1.0, (idle - marks.idle) / wall),
            "fully_async/rollouter/paused_ratio": min(1.0, (paused - marks.paused) / wall),
            "fully_async/monitor/generated_tokens_per_s": (tokens - marks.tokens) / wall,
            "fully_async/monitor/max_version_lag": float(max(lags)),
            "fully_async/monitor/mean_version_lag": float(np.mean(lags)),
            "fully_async/monitor/version_lag_bound": float(account.max_version_lag),
            "fully_async/monitor/dropped_this_step": float(len(dropped_lags)),
            "fully_async/partial/samples": float(sum(span > 0 for span in spans)),
            "fully_async/partial/max_version_span": float(max(spans)),
            "fully_async/partial/total_samples": float(partial_total),
        }
        marks.time, marks.idle, marks.paused = now, idle, paused
        marks.tokens, marks.pauses = tokens, pauses
        return metrics

    # ------------------------------------------------------------------ validation

    def validate(self, parts: RunParts, step: int) -> dict[str, float]:
        """Validation runs on the engines beside the rollouter's requests, on the weights
        they have now."""
        return validate(parts, self.recipe, step)


class _Marks:
    """The rollouter's counters at the end of the previous step (rates are per step)."""

    def __init__(self, time_: float, idle: float, paused: float, tokens: int, pauses: int) -> None:
        self.time, self.idle, self.paused = time_, idle, paused
        self.tokens, self.pauses = tokens, pauses


def _progress(total: int, done: int) -> Any:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc="training", unit="step", dynamic_ncols=True)


def _print_validation_summary(history: list[dict[str, float]]) -> None:
    if len(history) < 2:
        return
    first, last = history[0], history[-1]
    for key in sorted(last):
        if key.startswith("val-core/") and key in first and not math.isnan(first[key]):
            before, after = first[key], last[key]
            print(
                f"{key}: {before:.3f} -> {after:.3f} ({(after - before) * 100:+.1f} points)",
                file=sys.stderr,
                flush=True,
            )
