"""The scheduler interface, the run it is handed, and the pieces of a training step that
schedulers share (generate, score, update, metrics), so a new scheduler writes only its order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.agents.batch import agent_rows, build_trajectory_batch, check_not_all_errors
    from plugrl.algorithms.dynamic_sampling import DynamicSampler
    from plugrl.cluster.engines import EngineGroup
    from plugrl.compose.run_parts import RunParts
    from plugrl.parts.scheduler import Scheduler, SchedulerConfig
    from plugrl.run.metrics import StepTimer
    from plugrl.run.runner import RunContext
    from plugrl.run.steps import (
        compute_old_log_probs,
        generate,
        prefetch_scores,
        reward_output,
        row_loop_names,
        run_uses_agents,
        sampling_params,
        score,
        scores_early,
        step_metrics,
        update_from_batch,
        validate,
    )

__all__ = [
    "DynamicSampler",
    "EngineGroup",
    "RunContext",
    "RunParts",
    "Scheduler",
    "SchedulerConfig",
    "StepTimer",
    "agent_rows",
    "build_trajectory_batch",
    "check_not_all_errors",
    "compute_old_log_probs",
    "generate",
    "prefetch_scores",
    "reward_output",
    "row_loop_names",
    "run_uses_agents",
    "sampling_params",
    "score",
    "scores_early",
    "step_metrics",
    "update_from_batch",
    "validate",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "DynamicSampler": ("plugrl.algorithms.dynamic_sampling", "DynamicSampler"),
        "EngineGroup": ("plugrl.cluster.engines", "EngineGroup"),
        "RunContext": ("plugrl.run.runner", "RunContext"),
        "RunParts": ("plugrl.compose.run_parts", "RunParts"),
        "Scheduler": ("plugrl.parts.scheduler", "Scheduler"),
        "SchedulerConfig": ("plugrl.parts.scheduler", "SchedulerConfig"),
        "StepTimer": ("plugrl.run.metrics", "StepTimer"),
        "agent_rows": ("plugrl.agents.batch", "agent_rows"),
        "build_trajectory_batch": ("plugrl.agents.batch", "build_trajectory_batch"),
        "check_not_all_errors": ("plugrl.agents.batch", "check_not_all_errors"),
        "compute_old_log_probs": ("plugrl.run.steps", "compute_old_log_probs"),
        "generate": ("plugrl.run.steps", "generate"),
        "prefetch_scores": ("plugrl.run.steps", "prefetch_scores"),
        "reward_output": ("plugrl.run.steps", "reward_output"),
        "row_loop_names": ("plugrl.run.steps", "row_loop_names"),
        "run_uses_agents": ("plugrl.run.steps", "run_uses_agents"),
        "sampling_params": ("plugrl.run.steps", "sampling_params"),
        "score": ("plugrl.run.steps", "score"),
        "scores_early": ("plugrl.run.steps", "scores_early"),
        "step_metrics": ("plugrl.run.steps", "step_metrics"),
        "update_from_batch": ("plugrl.run.steps", "update_from_batch"),
        "validate": ("plugrl.run.steps", "validate"),
    },
)
