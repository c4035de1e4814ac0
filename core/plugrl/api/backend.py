"""The training-backend interface and what backends share: the optimizer and its schedule,
mini- and micro-batches of an update, response log-probs, checkpoint files read safely, the
random generators' state, and a Hugging Face folder written whole or not at all."""

from plugrl.algorithms.training import (
    ENTROPY_SLICE_TOKENS,
    SEQUENCE_COLUMNS,
    TOKENIZER_FILES,
    LogProbRows,
    LRSchedule,
    PolicyUpdate,
    RowsWithoutGradient,
    adamw,
    all_reduced_loss_scale,
    backend_config,
    check_single_step,
    copy_tokenizer_files,
    entropy_for_metrics,
    fixed_micro_batches,
    lr_schedule,
    mini_batch_rows,
    mini_batches,
    policy_update,
    response_log_probs,
    rows_to_run,
    rows_with_gradient,
    sampling_temperature,
    staged_folder,
    update_mini_batch_rows,
)
from plugrl.cluster.distributed import ensure_process_group
from plugrl.parts.algorithm import ActorObjective, LossScale
from plugrl.parts.backend import ActorConfig, CriticConfig, OptimConfig, TrainingBackend
from plugrl.parts.context import Role
from plugrl.parts.rollout import WeightMeta
from plugrl.run.metrics import mean_metrics
from plugrl.state.checkpoint import (
    load_weights_only,
    one_line_cause,
    raise_if_any_rank_failed,
    refused_file_error,
)
from plugrl.state.rng import capture as capture_rng_state
from plugrl.state.rng import restore as restore_rng_state

__all__ = [
    "ENTROPY_SLICE_TOKENS",
    "SEQUENCE_COLUMNS",
    "TOKENIZER_FILES",
    "ActorConfig",
    "ActorObjective",
    "CriticConfig",
    "LRSchedule",
    "LogProbRows",
    "LossScale",
    "OptimConfig",
    "PolicyUpdate",
    "Role",
    "RowsWithoutGradient",
    "TrainingBackend",
    "WeightMeta",
    "adamw",
    "all_reduced_loss_scale",
    "backend_config",
    "capture_rng_state",
    "check_single_step",
    "copy_tokenizer_files",
    "ensure_process_group",
    "entropy_for_metrics",
    "fixed_micro_batches",
    "load_weights_only",
    "lr_schedule",
    "mean_metrics",
    "mini_batch_rows",
    "mini_batches",
    "one_line_cause",
    "policy_update",
    "raise_if_any_rank_failed",
    "refused_file_error",
    "response_log_probs",
    "restore_rng_state",
    "rows_to_run",
    "rows_with_gradient",
    "sampling_temperature",
    "staged_folder",
    "update_mini_batch_rows",
]
