"""The training-backend interface and what backends share: the optimizer and its schedule,
mini- and micro-batches of an update, response log-probs, checkpoint files read safely, the
random generators' state, and a Hugging Face folder written whole or not at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
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
        response_sum_pi_squared,
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
    "response_sum_pi_squared",
    "restore_rng_state",
    "rows_to_run",
    "rows_with_gradient",
    "sampling_temperature",
    "staged_folder",
    "update_mini_batch_rows",
]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "ENTROPY_SLICE_TOKENS": ("plugrl.algorithms.training", "ENTROPY_SLICE_TOKENS"),
        "SEQUENCE_COLUMNS": ("plugrl.algorithms.training", "SEQUENCE_COLUMNS"),
        "TOKENIZER_FILES": ("plugrl.algorithms.training", "TOKENIZER_FILES"),
        "ActorConfig": ("plugrl.parts.backend", "ActorConfig"),
        "ActorObjective": ("plugrl.parts.algorithm", "ActorObjective"),
        "CriticConfig": ("plugrl.parts.backend", "CriticConfig"),
        "LRSchedule": ("plugrl.algorithms.training", "LRSchedule"),
        "LogProbRows": ("plugrl.algorithms.training", "LogProbRows"),
        "LossScale": ("plugrl.parts.algorithm", "LossScale"),
        "OptimConfig": ("plugrl.parts.backend", "OptimConfig"),
        "PolicyUpdate": ("plugrl.algorithms.training", "PolicyUpdate"),
        "Role": ("plugrl.parts.context", "Role"),
        "RowsWithoutGradient": ("plugrl.algorithms.training", "RowsWithoutGradient"),
        "TrainingBackend": ("plugrl.parts.backend", "TrainingBackend"),
        "WeightMeta": ("plugrl.parts.rollout", "WeightMeta"),
        "adamw": ("plugrl.algorithms.training", "adamw"),
        "all_reduced_loss_scale": ("plugrl.algorithms.training", "all_reduced_loss_scale"),
        "backend_config": ("plugrl.algorithms.training", "backend_config"),
        "capture_rng_state": ("plugrl.state.rng", "capture"),
        "check_single_step": ("plugrl.algorithms.training", "check_single_step"),
        "copy_tokenizer_files": ("plugrl.algorithms.training", "copy_tokenizer_files"),
        "ensure_process_group": ("plugrl.cluster.distributed", "ensure_process_group"),
        "entropy_for_metrics": ("plugrl.algorithms.training", "entropy_for_metrics"),
        "fixed_micro_batches": ("plugrl.algorithms.training", "fixed_micro_batches"),
        "load_weights_only": ("plugrl.state.checkpoint", "load_weights_only"),
        "lr_schedule": ("plugrl.algorithms.training", "lr_schedule"),
        "mean_metrics": ("plugrl.run.metrics", "mean_metrics"),
        "mini_batch_rows": ("plugrl.algorithms.training", "mini_batch_rows"),
        "mini_batches": ("plugrl.algorithms.training", "mini_batches"),
        "one_line_cause": ("plugrl.state.checkpoint", "one_line_cause"),
        "policy_update": ("plugrl.algorithms.training", "policy_update"),
        "raise_if_any_rank_failed": ("plugrl.state.checkpoint", "raise_if_any_rank_failed"),
        "refused_file_error": ("plugrl.state.checkpoint", "refused_file_error"),
        "response_log_probs": ("plugrl.algorithms.training", "response_log_probs"),
        "response_sum_pi_squared": ("plugrl.algorithms.training", "response_sum_pi_squared"),
        "restore_rng_state": ("plugrl.state.rng", "restore"),
        "rows_to_run": ("plugrl.algorithms.training", "rows_to_run"),
        "rows_with_gradient": ("plugrl.algorithms.training", "rows_with_gradient"),
        "sampling_temperature": ("plugrl.algorithms.training", "sampling_temperature"),
        "staged_folder": ("plugrl.algorithms.training", "staged_folder"),
        "update_mini_batch_rows": ("plugrl.algorithms.training", "update_mini_batch_rows"),
    },
)
