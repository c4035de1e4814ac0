"""Multi-turn sampling on vLLM's engine: a sync training step whose samples are tool-calling
conversations, every turn sampled by vLLM, the tool results appended between turns read but
not trained on."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

import plugrl
from plugrl.data.batch import response_attention_mask
from plugrl.parts.agent import ParsedTurn, ToolCall
from plugrl.run import RunContext
from tests.core.agents.agent_support import TOOL_TEMPLATE, AgentTestPlugin
from tests.e2e.e2e_support import tiny_recipe


def call_echo_each_turn(text: str) -> ParsedTurn:
    """Reads every turn as a call of ``echo`` with the turn's text, so that each sample has as
    many turns as the run allows whatever the untrained model writes."""
    call = ToolCall(id="call_0", name="echo", arguments={"text": text[:8]}, raw=text)
    return ParsedTurn(content="", tool_calls=[call])


class EchoEveryTurn:
    @plugrl.hookimpl
    def register_tool_parsers(self, register):
        register("echo_every_turn", call_echo_each_turn)


@pytest.fixture(scope="module")
def chat_task(tmp_path_factory):
    from transformers import AutoTokenizer

    from plugrl_tools.quickstart.untrained import build_untrained_task

    task = build_untrained_task(tmp_path_factory.mktemp("chat-task"))
    # the tool loop renders each conversation with the model's chat template
    tokenizer = AutoTokenizer.from_pretrained(task.model)
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.save_pretrained(task.model)
    return task


@pytest.mark.slow
def test_a_sync_step_on_vllm_trains_on_tool_conversations(
    chat_task, tmp_path, monkeypatch, plugrl_recipe, plugrl_plugin_manager, plugrl_register_plugin
):
    from plugrl_sync import scheduler as sync_module
    from plugrl_sync.scheduler import SyncScheduler

    plugrl_register_plugin(AgentTestPlugin(), "agent-test-tools")
    plugrl_register_plugin(EchoEveryTurn(), "agent-test-parser")
    data = tiny_recipe(
        chat_task,
        tmp_path / "run",
        data={"max_prompt_length": 96, "max_response_length": 40},
        rollout={
            "engine": "vllm",
            "n": 2,
            "agent": {
                "loop": "tool",
                "tools": ["echo"],
                "tool_parser": "echo_every_turn",
                "max_turns": 3,
                # the untrained model rarely ends a turn: each turn stops at 8 tokens
                "max_turn_tokens": 8,
            },
        },
    )
    recipe = plugrl_recipe(base=data)
    trained = []
    update = sync_module.update_from_batch

    def recording(parts, batch, timer):
        trained.append(batch)
        return update(parts, batch, timer)

    monkeypatch.setattr(sync_module, "update_from_batch", recording)
    context = RunContext(recipe, tmp_path / "run", plugrl_plugin_manager, "cpu")
    scheduler = SyncScheduler(recipe.scheduler, context)
    parts = context.build_parts(scheduler.needed_capabilities())
    try:
        parts.sync_weights()
        metrics = scheduler.train_step(parts, 1)
    finally:
        parts.close()
    (batch,) = trained
    assert len(batch) == 8
    # every sample took more than one turn, each sampled by vLLM
    assert metrics["agent/num_turns/max"] > 1
    assert metrics["agent/tool/echo/calls"] > 0
    mask, attention = batch["response_mask"], response_attention_mask(batch)
    appended = attention.bool() & ~mask.bool()
    assert appended.any()
    # sampled tokens carry vLLM's log-probs; appended ones none, and no advantage
    assert (batch["rollout_log_probs"][appended] == 0).all()
    assert (batch["rollout_log_probs"][mask.bool()] < 0).any()
    assert (batch["advantages"][appended] == 0).all()
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
