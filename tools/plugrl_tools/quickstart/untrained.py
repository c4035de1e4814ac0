"""A task for runs of the quickstart's model before any training (end-to-end tests, the
accelerator smoke script): the untrained model, a few arithmetic prompts in verl's schema, and
a reward that gives such a model something to learn from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

SPREAD_REWARD_FILE = Path(__file__).with_name("spread_reward.py")
"""A custom reward function file that scores each response by a hash of its text (see it)."""


@attrs.frozen
class UntrainedTask:
    """An untrained quickstart model and a few arithmetic prompts, saved in ``root``."""

    root: Path
    model: Path
    train_file: Path
    val_file: Path
    reward_file: Path = SPREAD_REWARD_FILE

    def recipe_sections(
        self, *, max_response_length: int, train_batch_size: int = 4
    ) -> dict[str, Any]:
        """The ``model``, ``data`` and ``reward`` sections of a GRPO recipe on this task
        (float32, prompts of at most 32 tokens); the rest is the caller's."""
        return {
            "model": {"path": str(self.model), "dtype": "float32"},
            "data": {
                "train_files": [str(self.train_file)],
                "val_files": [str(self.val_file)],
                "train_batch_size": train_batch_size,
                "max_prompt_length": 32,
                "max_response_length": max_response_length,
            },
            "reward": {"custom_function": {"path": str(self.reward_file)}},
        }


def build_untrained_task(root: Path, *, num_train: int = 16, num_val: int = 4) -> UntrainedTask:
    """Save the untrained model and ``num_train`` / ``num_val`` prompts (half of them with a
    carry) under ``root``; the same files for the same arguments."""
    from plugrl_tools.quickstart.arithmetic import make_splits, write_parquet
    from plugrl_tools.quickstart.build import save_untrained_model

    splits = make_splits(
        0, num_warm_start=0, num_train=num_train, num_val=num_val, carry_fraction=0.5
    )
    task = UntrainedTask(
        root=root,
        model=root / "model",
        train_file=root / "train.parquet",
        val_file=root / "val.parquet",
    )
    save_untrained_model(task.model)
    write_parquet(splits.train, "train", task.train_file)
    write_parquet(splits.val, "val", task.val_file)
    return task
