"""The scheduler interface, the run it is handed, and the pieces of a training step that
schedulers share (generate, score, update, metrics), so a new scheduler writes only its order."""

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
