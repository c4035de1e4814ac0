"""The fully-async scheduler: a rollouter keeps the engines generating on devices of their own
while the trainer trains on what they generated, within a bound on staleness (DESIGN section
7, verl's ``fully_async_policy``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from plugrl.api import RecipeError
from plugrl.api.algorithms import compute_rollout_is_weights
from plugrl.api.data import Batch, build_rollout_batch
from plugrl.api.rollout import Capability, SamplingParams, Stream
from plugrl.api.scheduler import (
    Scheduler,
    StepTimer,
    agent_rows,
    build_trajectory_batch,
    check_not_all_errors,
    compute_old_log_probs,
    prefetch_scores,
    row_loop_names,
    run_uses_agents,
    sampling_params,
    score,
    scores_early,
    step_metrics,
    update_from_batch,
)

from .accounting import StalenessAccount, implied_lag_bound
from .buffer import make_buffer
from .config import FullyAsyncConfig, warn_meaningless_bounds
from .rollouter import AgentSampler, PromptStream, Rollouter, Sample

if TYPE_CHECKING:
    from plugrl.api.scheduler import RunContext, RunParts

logger = logging.getLogger("plugrl.run")


class FullyAsyncScheduler(Scheduler):
    """verl's fully-async PPO/GRPO loop.

    A :class:`Rollouter` (a thread of the driver) streams prompts into the engine group and
    puts finished samples in a buffer (a Ray queue on Ray); the trainer takes
    ``required_samples = actor.ppo_mini_batch_size x require_batches`` of them per step,
    scores them, computes old log-probs (or uses the rollout's), advantages, and updates the
    actor; every ``trigger_parameter_sync_step`` steps it publishes new weights to every
    engine (``timing_s/param_sync``). :class:`StalenessAccount` bounds how far the rollouter
    runs ahead (verl's rule) and, under ``max_version_lag``, drops any sample older than that
    strict bound. The core's run loop does the rest (resume, validation, logs, checkpoints
    holding the rollouter's snapshot, export).
    """

    provides: ClassVar[frozenset[str] | None] = frozenset({"values"})
    config: FullyAsyncConfig

    # ------------------------------------------------------------------ start-up

    def __init__(self, config: FullyAsyncConfig, context: RunContext) -> None:
        super().__init__(config, context)
        self.check_recipe()
        self.account: StalenessAccount
        self.rollouter: Rollouter | None = None
        self.buffer: Any = None
        self.resubmit: list[Any] = []
        self.agents: Any = None
        """The run's agent runtime, in a run with agent loops."""
        self.marks: _Marks

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
        if recipe.trainer.full_determinism:
            raise RecipeError(
                "scheduler fully_async cannot be deterministic: which samples each step trains, "
                "and with which weights they were generated, depend on when the engines finish "
                "them; set trainer.full_determinism=false or scheduler=sync",
                key="trainer.full_determinism",
            )
        if recipe.algorithm.filter_groups.enable:
            raise RecipeError(
                "dynamic sampling (DAPO's group filtering) is not supported by scheduler "
                "fully_async; set algorithm.filter_groups.enable=false or scheduler=sync",
                key="algorithm.filter_groups.enable",
            )
        if self.config.use_rollout_log_probs:
            name = recipe.algorithm.adv_estimator
            estimator = self.context.plugins.registry("advantage_estimators").load(name)
            if "sum_pi_squared" in getattr(estimator, "requires", ()):
                raise RecipeError(
                    f"advantage estimator {name!r} reads sum_pi_squared from the trainer's "
                    "old_log_prob pass, which this setting skips; set it to false or choose "
                    "another estimator",
                    key="scheduler.use_rollout_log_probs",
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

    def start(self, parts: RunParts, step: int, saved: dict[str, Any] | None) -> None:
        """The staleness account, the data position and the prompts a checkpoint kept (they
        are generated again); a checkpoint written between two weight syncs starts a new
        weight period (see :meth:`start_period_on_resume`)."""
        config = self.config
        account = StalenessAccount(
            self.required_samples,
            config.trigger_parameter_sync_step,
            config.staleness_threshold,
            max_version_lag=config.max_version_lag,
        )
        if saved:
            account.load_state_dict(saved["account"])
            self.keep_implied_lag_bound(account, implied_lag_bound(saved["account"]))
            self.resubmit = [tuple(key) for key in saved["prompts"]]
            # the position the rollouter had when the kept prompts were listed
            parts.train_loader.load_state_dict(saved["dataloader"])
        account.version = parts.weight_version
        warn_meaningless_bounds(config, self.recipe, self.total_steps(parts), len(parts.train_data))
        if account.taken_this_period and step < self.total_steps(parts):
            self.start_period_on_resume(parts, account, step)
        self.account = account
        bound = account.version_lag_bound
        logger.info(
            "fully_async: %d prompts per step, weights synced every %d steps, at most %d "
            "samples ahead (max_required_samples), %s",
            account.required_samples,
            account.trigger_parameter_sync_step,
            account.max_required_samples,
            "every finished sample trained, its lag logged"
            if bound is None
            else f"trained samples at most {_versions(bound)} old (scheduler.max_version_lag)",
        )

    @staticmethod
    def keep_implied_lag_bound(account: StalenessAccount, implied: Any) -> None:
        """A checkpoint of a plugrl whose only rule was the strict bound (``implied``:
        ``"auto"``) resumed by a recipe without one (``max_version_lag`` unset, the default):
        the run goes on under the rule its steps so far had, so that they are one
        experiment. A bound the recipe sets wins."""
        if account.max_version_lag is not None or implied is None:
            return
        account.max_version_lag = implied
        account.lag_bound_implied = True
        bound = account.version_lag_bound
        logger.info(
            "resumed a checkpoint of a plugrl that dropped every sample older than the bound "
            "(%s here): this run keeps that rule (scheduler.max_version_lag: %s); a fresh "
            "start (trainer.resume_mode=disable) trains every finished sample",
            _versions(bound),
            implied,
        )

    def start_rollouter(self, parts: RunParts) -> Rollouter:
        """The rollouter streaming prompts into the engines, started at the first trainer
        step (after validation before training, which uses the same engines)."""
        config = self.config
        self.buffer = make_buffer(self.recipe.cluster.mode)
        rollouter = Rollouter(
            engines=parts.engines,
            account=self.account,
            stream=PromptStream(parts.train_loader),
            buffer=self.buffer,
            sampling_params=self.sampling_params,
            max_in_flight=config.max_in_flight_per_engine * parts.engines.num_engines,
            partial=self.partial_mode(parts),
            stop_after=config.total_rollout_steps,
            resubmit=self.resubmit,
            on_finished=self.score_early(parts),
            agents=self.agent_sampler(parts),
        )
        self.marks = _Marks(
            time.monotonic(),
            rollouter.idle_seconds(),
            rollouter.paused_seconds(),
            0,
            self.account.pauses,
        )
        rollouter.start()
        self.rollouter = rollouter
        return rollouter

    def agent_sampler(self, parts: RunParts) -> AgentSampler | None:
        """In a run with agent loops (:func:`plugrl.run.steps.run_uses_agents`), what runs each
        prompt's samples through them: every prompt goes through the agent runtime, so that
        every batch has one layout. A turn that a weight sync aborts goes on from its
        tokens (``scheduler.partial_rollout`` on an engine that cannot pause in place)."""
        if not run_uses_agents(parts):
            return None
        runtime = self.agents = parts.agent_runtime()
        runtime.continue_aborted = self.partial_mode(parts) == "abort"

        def sample(prompt: Batch, params: SamplingParams, prefix: str) -> Any:
            rows = agent_rows(prompt)
            return runtime.submit(rows, row_loop_names(parts, prompt), params, prefix)

        return sample

    def score_early(self, parts: RunParts) -> Callable[[Sample], None] | None:
        """What hands each finished sample's responses to the reward manager, which scores
        them while the trainer trains on others (``reward.overlap``)."""
        if not scores_early(parts):
            return None
        n = self.recipe.rollout.n

        def prefetch(sample: Sample) -> None:
            if sample.trajectories:
                parts.reward.prefetch(self.sample_batch(parts, sample))
            else:
                prefetch_scores(parts, sample.prompt, sample.completions, n)

        return prefetch

    def checkpoint_state(self) -> dict[str, Any]:
        """The rollouter's snapshot: the account, the data position and the prompts of every
        sample not yet trained on, taken together so that none is lost or repeated."""
        return self.rollouter.snapshot() if self.rollouter is not None else {}

    def close(self) -> None:
        if self.agents is not None:
            self.agents.continue_aborted = False  # the engines are being stopped
        if self.rollouter is not None:
            self.rollouter.close()
        if self.buffer is not None:
            self.buffer.close()

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
        """Each sample is seeded by its number in the run, on a stream of its own."""
        return sampling_params(self.recipe, sample_number, stream=Stream.SAMPLE_ROLLOUT)

    def train_step(self, parts: RunParts, step: int) -> dict[str, Any] | None:
        """Take ``required_samples`` finished samples from the rollouter, score them, compute
        old log-probs, update; at the end of a weight period publish new weights. ``None``
        when the rollouter has no more samples (``scheduler.total_rollout_steps``)."""
        rollouter = self.rollouter or self.start_rollouter(parts)
        account = rollouter.account
        timer = StepTimer()
        metrics: dict[str, Any] = {}
        with timer("step"):
            with timer("gen"):
                samples, dropped_lags = rollouter.take(self.required_samples)
            if len(samples) < self.required_samples:
                logger.info(
                    "the rollouter generated its scheduler.total_rollout_steps=%s prompts and "
                    "too few are left for step %d",
                    self.config.total_rollout_steps,
                    step,
                )
                return None
            version = account.version
            batch = self.assemble(parts, samples)
            with timer("reward"):
                metrics.update(score(parts, batch))
            metrics.update(self.old_log_probs(parts, batch, timer))
            metrics.update(update_from_batch(parts, batch, timer))
            # a period ends once it trained its samples; it starts at a sync, at the run's
            # start, or at a resume (see start_period_on_resume), not at a multiple of k
            if account.period_complete:
                with timer("param_sync"):
                    metrics.update(rollouter.sync(lambda: self.push_weights(parts)))
        metrics.update(step_metrics(parts, batch, timer, step))
        metrics.update(self.async_metrics(rollouter, samples, version, dropped_lags, timer))
        return metrics

    @staticmethod
    def push_weights(parts: RunParts) -> dict[str, float]:
        parts.weight_version += 1
        return parts.sync_weights()

    def assemble(self, parts: RunParts, samples: list[Sample]) -> Batch:
        check_not_all_errors(
            t for sample in samples for sequences in sample.trajectories for t in sequences
        )
        batch = Batch.concat(self.sample_batch(parts, sample) for sample in samples)
        # log-probs are recomputed at the temperature the tokens were sampled with
        batch.meta["temperature"] = self.recipe.rollout.temperature or 1.0
        return batch

    def sample_batch(self, parts: RunParts, sample: Sample) -> Batch:
        """The batch rows of one sample (a prompt and its responses or trajectories)."""
        if sample.trajectories:
            batch = build_trajectory_batch(
                sample.prompt, [sample.trajectories], pad_token_id=parts.pad_token_id
            )
            return parts.with_model_positions(batch)
        batch = build_rollout_batch(
            sample.prompt,
            sample.completions,
            n=self.recipe.rollout.n,
            pad_token_id=parts.pad_token_id,
        )
        return parts.with_model_positions(batch)

    def old_log_probs(self, parts: RunParts, batch: Batch, timer: StepTimer) -> dict[str, Any]:
        """``use_rollout_log_probs``: the engines' log-probs are the old ones (verl's meaning).
        Otherwise the trainer's current weights give them (recomputed, or taken by an exactly
        on-policy update from its own forward) and ``algorithm.rollout_is`` weighs each token
        by how much likelier the trainer finds it than the engine that sampled it."""
        if self.config.use_rollout_log_probs:
            batch["old_log_probs"] = batch["rollout_log_probs"].clone()
            return {}
        algorithm = self.recipe.algorithm
        # the flag is computed for data.train_batch_size; a step here trains
        # ppo_mini_batch_size x require_batches prompts, one optimizer step only if it is 1
        if (
            parts.old_log_probs_from_update
            and self.config.require_batches == 1
            and algorithm.rollout_is is None
        ):
            return {}
        metrics = compute_old_log_probs(parts, batch, timer)
        if algorithm.rollout_is is not None:
            weights, is_metrics = compute_rollout_is_weights(
                batch["old_log_probs"],
                batch["rollout_log_probs"],
                batch["response_mask"],
                algorithm.rollout_is,
                algorithm.rollout_is_threshold,
                kpop_threshold=algorithm.kpop_threshold,
            )
            batch["rollout_is_weights"] = weights
            metrics.update(is_metrics)
        return metrics

    def async_metrics(
        self,
        rollouter: Rollouter,
        samples: list[Sample],
        version: int,
        dropped_lags: list[int],
        timer: StepTimer,
    ) -> dict[str, float]:
        account, marks = rollouter.account, self.marks
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
            "fully_async/monitor/dropped_this_step": float(len(dropped_lags)),
            "fully_async/partial/samples": float(sum(span > 0 for span in spans)),
            "fully_async/partial/max_version_span": float(max(spans)),
            "fully_async/partial/total_samples": float(partial_total),
        }
        bound = account.version_lag_bound
        if bound is not None:  # without a strict bound no lag is too large: nothing to log
            metrics["fully_async/monitor/version_lag_bound"] = float(bound)
        marks.time, marks.idle, marks.paused = now, idle, paused
        marks.tokens, marks.pauses = tokens, pauses
        return metrics


def _versions(count: int | None) -> str:
    return f"{count} version" if count == 1 else f"{count} versions"


class _Marks:
    """The rollouter's counters at the end of the previous step (rates are per step)."""

    def __init__(self, time_: float, idle: float, paused: float, tokens: int, pauses: int) -> None:
        self.time, self.idle, self.paused = time_, idle, paused
        self.tokens, self.pauses = tokens, pauses
