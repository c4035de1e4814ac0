"""On the hf engine and the tiny model, ``single_turn`` through the agent runtime samples the
tokens the batched path samples: a run without agents changes nothing by having
them."""

from __future__ import annotations

import torch

from plugrl.run.runner import RunContext
from plugrl.run.steps import generate, generate_with_agents, sampling_params
from plugrl_sync.scheduler import SyncScheduler
from tests.e2e.e2e_support import tiny_recipe


def test_single_turn_through_agents_samples_what_the_batched_path_does_on_hf(
    tiny_task, tmp_path, plugrl_recipe, plugrl_plugin_manager
):
    data = tiny_recipe(
        tiny_task, tmp_path / "run", data={"max_response_length": 16}, rollout={"n": 3}
    )
    recipe = plugrl_recipe(base=data)
    context = RunContext(recipe, tmp_path / "run", plugrl_plugin_manager, "cpu")
    parts = context.build_parts(SyncScheduler(recipe.scheduler, context).needed_capabilities())
    try:
        parts.sync_weights()
        prompts = parts.train_loader.next_batch()
        params = sampling_params(recipe, 1)
        batched = generate(parts, prompts, params)
        looped = generate_with_agents(parts, prompts, params, ["single_turn"] * len(prompts))
    finally:
        parts.close()
    assert recipe.rollout.engine == "hf"
    for name in ("responses", "response_mask", "attention_mask"):
        assert torch.equal(batched[name], looped[name]), name
    # the same tokens; their log-probs come from forwards over differently composed batches
    torch.testing.assert_close(batched["rollout_log_probs"], looped["rollout_log_probs"])
