"""A recipe in the shape of the GPU benchmark's (bench/bench_gpu.py): fsdp2 in one process,
bfloat16 compute over float32 weights, the colocated hf engine."""

from __future__ import annotations

import pytest

BENCH = {
    "model": {"path": "qwen2.5-0.5b", "dtype": "bfloat16"},
    "data": {
        "train_files": ["train.parquet"],
        "val_files": [],
        "train_batch_size": 32,
        "max_prompt_length": 256,
        "max_response_length": 256,
    },
    "device": "cpu",
    "actor": {
        "backend": "fsdp2",
        "ppo_mini_batch_size": 16,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 8192,
    },
    "rollout": {"engine": "hf", "n": 8, "dtype": "bfloat16"},
    "algorithm": {"adv_estimator": "grpo"},
    "reward": {"manager": "naive"},
    "cluster": "local",
}


@pytest.fixture
def bench_recipe(write_recipe):
    return write_recipe(BENCH)
