"""A two-step GRPO run of a tiny model with ``rollout.engine: sglang``, the fake SGLang found on
import: the engine works inside the core's engine group (its own event-loop thread), gets the
actor's weights after each step and feeds the trainer its tokens and log-probs. What it
samples is the fake's, so the run checks wiring, not learning."""

from __future__ import annotations

import sys

import pytest
import torch

import plugrl_sglang
from plugrl.plugin.manager import get_plugin_manager
from plugrl.run.metrics import read_metrics
from plugrl.run.runner import run_recipe
from plugrl_tools.quickstart.untrained import build_untrained_task
from tests.plugins.rollout.sglang import fake_sglang


@pytest.fixture
def fake(monkeypatch):
    return fake_sglang.install_on_import(monkeypatch)


def test_a_grpo_run_drives_the_engine_through_the_core(
    fake, tmp_path, plugrl_register_plugin, plugrl_recipe
):
    torch.set_num_threads(1)
    task = build_untrained_task(tmp_path / "task", num_train=8, num_val=4)
    plugrl_register_plugin(plugrl_sglang)
    recipe = plugrl_recipe(
        {
            **task.recipe_sections(max_response_length=6),
            "device": "cpu",
            "actor": {"ppo_mini_batch_size": 4, "optim": {"lr": 1e-3}},
            "rollout": {"engine": "sglang", "n": 2},
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {
                "total_training_steps": 2,
                "test_freq": -1,
                "val_before_train": False,
                "save_freq": -1,
                "export_hf": False,
                "default_local_dir": str(tmp_path / "run"),
                "logger": ["jsonl"],
                "seed": 7,
            },
        }
    )
    assert "sglang" not in sys.modules  # the core prepares the engine before its import
    metrics = run_recipe(recipe, get_plugin_manager())
    (engine,) = fake.instances
    names = [name for name, _ in engine.calls]
    assert names[0] == "Engine" and names[-1] == "shutdown"
    assert engine.server_args["model_path"] == str(task.model)
    generated = [args for name, args in engine.calls if name == "async_generate"]
    sampled = [args for args in generated if args["sampling_params"]["temperature"] == 1.0]
    assert len(sampled) == 2 * 4 * 2  # steps x prompts x samples; the rest is the validation
    assert all(args["sampling_params"]["temperature"] == 0.0 for args in generated[16:])
    assert all(len(args["input_ids"]) > 0 for args in generated)
    # the actor's weights reach the engine after each step: every weight, then a cache flush
    pushed = [args["names"] for name, args in engine.calls if name == "update_weights_from_tensor"]
    assert pushed and names.count("flush_cache") >= 1
    assert set().union(*pushed) == set(engine.weights)
    assert "model.embed_tokens.weight" in engine.weights
    records = list(read_metrics(tmp_path / "run"))
    assert [record["step"] for record in records] == [1, 2]
    assert all(record["perf/weight_sync_megabytes"] > 0 for record in records)
    assert metrics["response_length/mean"] > 0
