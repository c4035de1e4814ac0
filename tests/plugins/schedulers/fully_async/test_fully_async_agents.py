"""The tool loop under ``scheduler: fully_async`` on the simulated parts: a whole
trajectory is the unit in flight, its staleness is its oldest sampled token, and turns a weight
sync interrupts go on (paused in place, or aborted and continued)."""

from __future__ import annotations

import pytest

from plugrl.run.metrics import read_metrics
from plugrl.run.runner import run_recipe
from plugrl_fully_async.rollouter import Sample
from plugrl_sim.parts import sim_recipe
from tests.core.agents.agent_support import AgentTestPlugin
from tests.plugins.schedulers.sync.test_sync_agents import EchoParserPlugin, two_turn_trajectory


@pytest.mark.parametrize("engine_keeps_requests", [True, False], ids=["pause", "abort"])
def test_a_tool_run_trains_multi_turn_trajectories_fully_async(
    sim_task,
    tmp_path,
    plugrl_recipe,
    plugrl_plugin_manager,
    plugrl_register_plugin,
    monkeypatch,
    engine_keeps_requests,
):
    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    plugrl_register_plugin(EchoParserPlugin(), "agent-test-parser")
    if not engine_keeps_requests:
        from plugrl.parts.rollout import Capability
        from plugrl_sim.parts import SimEngine

        monkeypatch.setattr(
            SimEngine, "capabilities", SimEngine.capabilities - {Capability.PAUSE_KEEP}
        )
    data = sim_recipe(
        sim_task,
        tmp_path / "run",
        scheduler="fully_async",
        colocate=False,
        steps=3,
        train_batch_size=4,
        n=2,
        max_response_length=48,
    )
    data["scheduler"].update(partial_rollout=True, staleness_threshold=1.0)
    data["rollout"]["agent"] = {
        "loop": "tool",
        "tools": ["echo"],
        "tool_parser": "always_echo",
        "max_turns": 3,
    }
    run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    records = read_metrics(tmp_path / "run")
    assert [r["training/global_step"] for r in records if "training/global_step" in r] == [
        1,
        2,
        3,
    ]
    for record in records:
        if "training/global_step" not in record:
            continue
        assert record["agent/tool_calls/mean"] > 0
        assert record["agent/num_turns/max"] <= 3
        assert record["fully_async/monitor/max_version_lag"] >= 0


def test_a_trajectorys_staleness_is_its_oldest_sampled_token():
    older = two_turn_trajectory(versions=[3, 3, 2, 2, 4])  # appended tokens (version 2) skip
    newer = two_turn_trajectory(versions=[5, 5, 5, 5, 5])
    sample = Sample(0, (0, 0), None, [], [[older], [newer]])
    assert (sample.oldest_version, sample.newest_version) == (3, 5)
    assert sample.response_tokens == 10


def test_a_fully_async_step_whose_trajectories_all_failed_stops_the_run_in_one_line(
    sim_task, tmp_path, plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin
):
    from plugrl.errors import PluginError
    from tests.plugins.schedulers.sync.test_sync_agents import RefusingEnvironmentPlugin

    plugrl_register_plugin(RefusingEnvironmentPlugin(), "agent-test-refusing")
    data = sim_recipe(
        sim_task,
        tmp_path / "run",
        scheduler="fully_async",
        colocate=False,
        steps=2,
        train_batch_size=4,
        n=2,
        max_response_length=48,
    )
    data["rollout"]["agent"] = {"loop": "env", "env": "refusing"}
    # no validation: the trainer's own steps must stop, not the validation before them
    data["trainer"]["val_before_train"] = False
    with pytest.raises(PluginError) as info:
        run_recipe(plugrl_recipe(data), plugrl_plugin_manager)
    message = str(info.value)
    assert "trajectories of the step ended in error; the first: agent loop 'env'" in message
    assert "environment RefusingEnvironment.reset raised RuntimeError" in message
    assert "\n" not in message
    # it stopped at the first step, not after training on them (then the validation stops it)
    metrics_file = tmp_path / "run" / "metrics.jsonl"
    records = read_metrics(tmp_path / "run") if metrics_file.exists() else []
    assert not [r for r in records if "training/global_step" in r]
