"""One sync training step on the vLLM engine whose samples are tool-calling conversations, run
as ``python -m tests.plugins.rollout.vllm.agent_step TASK_MODEL TASK_ROOT RUN_DIR OUT_JSON``.

A process of its own: the run must import vLLM itself (after ``prepare_rollout``), which a
test process that already imported it for other tests cannot give it. What the step trained
on is summed up in ``OUT_JSON`` for the test to check."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import plugrl
from plugrl.parts.agent import ParsedTurn, ToolCall


def call_echo_each_turn(text: str) -> ParsedTurn:
    """Reads every turn as a call of ``echo`` with the turn's text, so that each sample has as
    many turns as the run allows whatever the untrained model writes."""
    call = ToolCall(id="call_0", name="echo", arguments={"text": text[:8]}, raw=text)
    return ParsedTurn(content="", tool_calls=[call])


class EchoEveryTurn:
    @plugrl.hookimpl
    def register_tool_parsers(self, register):
        register("echo_every_turn", f"{__name__}:call_echo_each_turn")


def run_step(recipe_data: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    from plugrl.data.batch import response_attention_mask
    from plugrl.plugin.manager import PluginManager, set_plugin_manager
    from plugrl.run.runner import RunContext
    from plugrl.testing import make_recipe
    from plugrl_sync import scheduler as sync_module
    from plugrl_sync.scheduler import SyncScheduler
    from tests.core.agents.agent_support import AgentTestPlugin

    plugins = PluginManager()
    plugins.load_entry_points(None)
    plugins.register(AgentTestPlugin(), "agent-test-tools")
    plugins.register(EchoEveryTurn(), "agent-test-parser")
    set_plugin_manager(plugins)
    recipe = make_recipe(None, base=recipe_data, plugins=plugins)
    trained = []
    update = sync_module.update_from_batch

    def recording(parts, batch, timer):
        trained.append(batch)
        return update(parts, batch, timer)

    sync_module.update_from_batch = recording
    context = RunContext(recipe, run_dir, plugins, "cpu")
    scheduler = SyncScheduler(recipe.scheduler, context)
    parts = context.build_parts(scheduler.needed_capabilities())
    try:
        parts.sync_weights()
        metrics = scheduler.train_step(parts, 1)
    finally:
        parts.close()
    (batch,) = trained
    mask = batch["response_mask"].bool()
    appended = response_attention_mask(batch).bool() & ~mask
    return {
        "engine": recipe.rollout.engine,
        "rows": len(batch),
        "num_turns_max": metrics["agent/num_turns/max"],
        "echo_calls": metrics["agent/tool/echo/calls"],
        "appended_tokens": int(appended.sum()),
        "appended_log_probs_zero": bool((batch["rollout_log_probs"][appended] == 0).all()),
        "sampled_log_probs_negative": bool((batch["rollout_log_probs"][mask] < 0).any()),
        "appended_advantages_zero": bool((batch["advantages"][appended] == 0).all()),
        "pg_loss": float(metrics["actor/pg_loss"]),
    }


if __name__ == "__main__":
    recipe_path, run_dir, out = sys.argv[1:4]
    data = json.loads(Path(recipe_path).read_text(encoding="utf-8"))
    Path(out).write_text(json.dumps(run_step(data, Path(run_dir))), encoding="utf-8")
