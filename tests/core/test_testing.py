"""The test kit's builders (plugrl.testing): batches, loss aggregators and recipes as the core
makes them, for plugin authors' unit tests."""

import asyncio
import os.path

import attrs
import pytest
import torch

import plugrl
from plugrl.algorithms.functional import LOSS_AGG_MODES, LossAggregator
from plugrl.config import option
from plugrl.data.batch import Batch
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.agent import ParsedTurn, Tool, ToolResult
from plugrl.parts.algorithm import PolicyLoss
from plugrl.plugin import registry
from plugrl.plugin.manager import get_plugin_manager
from plugrl.testing import (
    ScriptedSession,
    make_batch,
    make_fake_entry_point,
    make_loss_aggregator,
    make_recipe,
    make_tiny_tokenizer,
    part_context,
    tool_call_text,
)

# ------------------------------------------------------------------------------ make_batch


def test_make_batch_has_the_verl_layout_with_consistent_masks():
    batch = make_batch((3, 5), [4, 2, 0, 3], n=2, pad_token_id=7, vocab_size=9)
    assert len(batch) == 4
    assert list(batch["uid"]) == ["uid-0", "uid-0", "uid-1", "uid-1"]
    assert batch.meta == {"prompt_width": 5, "response_width": 4, "pad_token_id": 7}
    assert batch["prompts"].shape == (4, 5) and batch["responses"].shape == (4, 4)
    assert batch["prompt_attention_mask"].sum(dim=-1).tolist() == [3, 3, 5, 5]
    assert batch["response_mask"].sum(dim=-1).tolist() == [4, 2, 0, 3]
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], -1))
    assert torch.equal(
        batch["attention_mask"],
        torch.cat([batch["prompt_attention_mask"], batch["response_mask"]], -1),
    )
    valid = batch["attention_mask"].bool()
    assert not (batch["input_ids"][valid] == 7).any()  # real tokens are never the pad token
    assert (batch["input_ids"][~valid] == 7).all()
    # positions count real tokens only
    assert batch["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    assert batch["position_ids"][2].tolist() == [0, 1, 2, 3, 4, 4, 4, 4, 4]
    assert (batch["rollout_log_probs"][batch["response_mask"].bool()] < 0).all()
    assert (batch["rollout_log_probs"][~batch["response_mask"].bool()] == 0).all()
    assert list(batch["raw_prompt_ids"][0]) == batch["prompts"][0, 2:].tolist()
    assert set(batch.keys()) >= {"data_source", "ground_truth", "extra_info", "finish_reason"}


def test_make_batch_is_reproducible_by_seed():
    first, again, other = make_batch(seed=3), make_batch(seed=3), make_batch(seed=4)
    assert torch.equal(first["input_ids"], again["input_ids"])
    assert not torch.equal(first["input_ids"], other["input_ids"])


def test_make_batch_scores_sit_on_the_last_response_token():
    batch = make_batch((2,), [3, 0, 1], n=3, scores=[1.0, 0.5, -1.0])
    scores = batch["token_level_scores"]
    assert scores.tolist() == [[0, 0, 1.0], [0.5, 0, 0], [-1.0, 0, 0]]
    assert torch.equal(batch["token_level_rewards"], scores)
    assert scores.sum(dim=-1).tolist() == [1.0, 0.5, -1.0]


def test_make_batch_advantages_and_log_probs_are_zero_off_the_mask():
    batch = make_batch((2, 2), [2, 1, 3, 0], advantages=[1.0, -2.0, 0.5, 3.0], log_probs=True)
    mask = batch["response_mask"].bool()
    assert batch["advantages"].tolist() == [
        [1.0, 1.0, 0.0],
        [-2.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.0, 0.0, 0.0],
    ]
    assert torch.equal(batch["returns"], batch["advantages"])
    assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])
    assert not torch.equal(batch["ref_log_prob"][mask], batch["old_log_probs"][mask])
    assert (batch["ref_log_prob"][~mask] == 0).all()

    per_token = torch.arange(12.0).reshape(4, 3)
    given = make_batch((2, 2), [2, 1, 3, 0], advantages=per_token)
    assert torch.equal(given["advantages"], torch.where(given["response_mask"] != 0, per_token, 0))
    with pytest.raises(ValueError, match="advantages is"):
        make_batch((2, 2), 3, advantages=torch.zeros(4, 2))


def test_make_batch_takes_given_token_ids_and_checks_counts():
    batch = make_batch(prompt_ids=[[5, 6]], response_ids=[[1, 2, 3], [4]], n=2)
    assert batch["responses"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["prompts"].tolist() == [[5, 6], [5, 6]]
    with pytest.raises(ValueError, match="expected one per row: 2 prompts x n=2 = 4"):
        make_batch((1, 1), [1, 2, 3])
    with pytest.raises(ValueError, match="scores has 1 entries"):
        make_batch((1,), 2, n=2, scores=[1.0])
    with pytest.raises(ValueError, match="ground_truths has 1 entries"):
        make_batch((1, 1), 2, ground_truths=["4"])


def test_make_batch_widths_and_finish_reasons():
    batch = make_batch((2,), [4, 2], response_width=4)
    assert batch["responses"].shape == (2, 4)
    assert list(batch["finish_reason"]) == ["length", "stop"]
    # batches of different widths join as rollouts of one step do
    joined = Batch.concat([batch, make_batch((6,), [1, 1])])
    assert joined.meta["prompt_width"] == 6 and joined["responses"].shape == (4, 4)


def test_make_batch_feeds_a_registered_estimator(plugrl_recipe):
    from plugrl.plugin.build import build_estimator

    recipe = plugrl_recipe({"algorithm.adv_estimator": "grpo", "rollout.n": 4})
    batch = make_batch((3, 4), 2, n=4, scores=[1, 0, 0, 1, 1, 1, 1, 0])
    advantages, _ = build_estimator(recipe, get_plugin_manager()).compute(batch)
    per_row = advantages[:, 0]
    assert per_row[:4].sum() == pytest.approx(0, abs=1e-5)
    assert per_row[0] > 0 > per_row[1]


# ------------------------------------------------------------------------ make_loss_aggregator


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_the_aggregator_of_a_mini_batch_is_exact_over_any_micro_batch_split(mode):
    recipe = make_recipe({"actor.loss_agg_mode": mode, "data.max_response_length": 6})
    batch = make_batch((2, 3, 4), [5, 1, 0, 3, 2, 6], n=2, response_width=6)
    values = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    aggregate = make_loss_aggregator(batch, recipe=recipe)
    assert aggregate.mode == mode
    assert aggregate.scale.max_response_length == 6
    whole = aggregate(values, batch["response_mask"])
    for size in (1, 2, 4):
        split = sum(
            aggregate(values[start : start + size], batch["response_mask"][start : start + size])
            for start in range(0, len(batch), size)
        )
        assert float(split) == pytest.approx(float(whole), rel=1e-5)
    # and it is the value of the whole mini-batch aggregated on its own
    alone = LossAggregator(mode, None)(values, batch["response_mask"])
    if mode != "seq-mean-token-sum-norm":  # that one divides by the recipe's constant
        assert float(whole) == pytest.approx(float(alone), rel=1e-5)


def test_make_loss_aggregator_defaults_and_data_parallel_shares():
    batch = make_batch((2, 2), [1, 2, 3, 4])
    aggregate = make_loss_aggregator(batch["response_mask"])
    assert (aggregate.mode, aggregate.scale.num_tokens, aggregate.scale.num_seqs) == (
        "token-mean",
        10,
        4,
    )
    assert make_loss_aggregator(batch, "token-sum").mode == "token-sum"
    values = torch.ones(4, 4)
    two_ranks = make_loss_aggregator(batch, dp_size=2)
    mask = batch["response_mask"]
    per_rank = [two_ranks(values[:2], mask[:2]), two_ranks(values[2:], mask[2:])]
    assert float(sum(per_rank) / 2) == pytest.approx(1.0)  # ranks are averaged
    with pytest.raises(RecipeError, match=r"^actor.loss_agg_mode: unknown loss aggregation"):
        make_loss_aggregator(batch, "mean")


# ------------------------------------------------------------------------------ make_recipe


def test_make_recipe_merges_dotted_and_nested_overrides():
    recipe = make_recipe(
        {
            "device": "cpu",
            "actor.clip_ratio_high": 0.28,
            "actor": {"loss_agg_mode": "seq-mean-token-mean"},
            "rollout.n": 4,
        }
    )
    assert recipe.device.name == "cpu"
    assert recipe.actor.clip_ratio_high == 0.28
    assert recipe.actor.loss_agg_mode == "seq-mean-token-mean"
    assert recipe.rollout.n == 4
    assert make_recipe().actor.policy_loss == "vanilla"


def test_make_recipe_starts_from_a_base():
    shipped = make_recipe({"rollout.n": 3}, base="quickstart")
    assert shipped.trainer.experiment_name == "grpo-arithmetic" and shipped.rollout.n == 3
    mapping = make_recipe({"device.name": "cpu"}, base={"device": "auto", "rollout": {"n": 2}})
    assert (mapping.device.name, mapping.rollout.n) == ("cpu", 2)


def test_make_recipe_raises_the_users_one_line_error():
    with pytest.raises(RecipeError) as info:
        make_recipe({"actor.clip_ratio_hgh": 0.2})
    assert str(info.value) == (
        "actor.clip_ratio_hgh: unknown key; did you mean 'actor.clip_ratio_high'?"
    )


@attrs.define(kw_only=True)
class _ScaleArgs:
    factor: float = option(1.0, "Loss multiplier.")


class _ScaledLoss(PolicyLoss):
    def __call__(
        self,
        *,
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        aggregate,
        importance_weights=None,
    ):
        loss = aggregate(-advantages * log_prob * self.args.factor, response_mask)
        return loss, {"actor/pg_loss": float(loss.detach())}


class _ScaledLossPlugin:
    @plugrl.hookimpl
    def register_policy_losses(self, register):
        register("scaled", _ScaledLoss, config=_ScaleArgs)


def test_plugrl_recipe_sees_the_plugins_of_the_test(plugrl_register_plugin, plugrl_recipe):
    from plugrl.algorithms.objective import PolicyObjective

    plugrl_register_plugin(_ScaledLossPlugin(), "scaled-loss")
    recipe = plugrl_recipe({"actor.policy_loss": "scaled", "actor.policy_loss_args.factor": 2})
    batch = make_batch((2,), [2, 2], advantages=[1.0, 1.0], log_probs=True)
    log_prob = torch.full((2, 2), -1.0, requires_grad=True)
    loss, _ = PolicyObjective.from_recipe(recipe, get_plugin_manager())(
        batch, log_prob, None, make_loss_aggregator(batch, recipe=recipe).scale
    )
    assert float(loss.detach()) == pytest.approx(2.0)
    with pytest.raises(RecipeError, match=r"^actor.policy_loss_args.factr: unknown key"):
        plugrl_recipe({"actor.policy_loss": "scaled", "actor.policy_loss_args.factr": 2})


def test_a_fake_entry_point_loads_its_target_as_the_registry_imports_paths():
    assert make_fake_entry_point("a", "os.path:join").load() is os.path.join
    assert make_fake_entry_point("b", "os.path").load() is os.path
    assert make_fake_entry_point("c", registry).load() is registry
    with pytest.raises(ModuleNotFoundError):
        make_fake_entry_point("d", "plugrl_no_such_module").load()
    with pytest.raises(PluginError, match=r"^bad import path 'os.path:'"):
        make_fake_entry_point("e", "os.path:").load()


def test_a_scripted_session_plays_its_script_and_cuts_at_max_tokens():
    tokenizer = make_tiny_tokenizer()
    session = ScriptedSession(tokenizer, ["hello", "hello world"], log_prob=-0.25)
    first = asyncio.run(session.generate([1, 2], 100))
    hello = tokenizer.encode("hello", add_special_tokens=False)
    assert first.token_ids == [*hello, tokenizer.eos_token_id]
    assert (first.finish_reason, set(first.log_probs)) == ("stop", {-0.25})
    cut = asyncio.run(session.generate([3], 1))
    assert (len(cut.token_ids), cut.finish_reason) == (1, "length")
    assert session.calls == [([1, 2], 100), ([3], 1)]
    with pytest.raises(IndexError) as info:
        asyncio.run(session.generate([4], 10))
    assert str(info.value) == "the script has 2 replies; turn 2 asked"
    with pytest.raises(ValueError) as info:
        session.make_environment()
    assert str(info.value) == (
        "this ScriptedSession has no environment; pass environment=<a function returning a "
        "fresh Environment>"
    )


class Lookup(Tool):
    """A tool with state per sample, as a plugin author writes one."""

    def __init__(self, config, context):
        super().__init__(config, context)
        self.seen: dict[str, int] = {}
        self.released: list[str] = []

    def schema(self):
        return {"type": "function", "function": {"name": "lookup", "parameters": {}}}

    async def call(self, arguments, context):
        self.seen[context.sample_id] = self.seen.get(context.sample_id, 0) + 1
        if arguments.get("key") != "k":
            return ToolResult(text=f"no entry {arguments.get('key')!r}", error=True)
        return ToolResult(text="value", reward=0.5)

    async def release(self, sample_id):
        self.released.append(sample_id)


def test_a_scripted_session_parses_and_runs_its_tools_as_a_run_does():
    tokenizer = make_tiny_tokenizer()
    lookup = Lookup(None, part_context())
    session = ScriptedSession(tokenizer, [], tools=[lookup], sample_id="u/1")
    assert session.tool_schemas() == [lookup.schema()]
    text = "Let me look.\n" + tool_call_text("lookup", {"key": "k"})
    text += "\n" + tool_call_text("lookup", {"key": "x"}) + "\n" + tool_call_text("nope", {})
    parsed = session.parse_tool_calls(text)  # the registered hermes parser, by default
    assert parsed.content == "Let me look."
    results = asyncio.run(session.call_tools(parsed.tool_calls, {"uid": "u"}))
    assert [(r.text, r.error) for r in results] == [
        ("value", False),
        ("no entry 'x'", True),
        ("Error: unknown tool 'nope'; the tools are: lookup.", True),
    ]
    assert session.last_tool_reward == 0.5
    assert lookup.seen == {"u/1": 2}
    metrics = session.tool_metrics()
    assert (metrics["tool_calls"], metrics["tool_errors"]) == (3, 2)
    assert (metrics["tool/lookup/errors"], metrics["tool/invalid/errors"]) == (1, 1)
    asyncio.run(session.release_tools())
    assert lookup.released == ["u/1"]


def test_a_scripted_session_takes_a_parser_function_and_refuses_what_is_not_a_tool():
    tokenizer = make_tiny_tokenizer()
    session = ScriptedSession(tokenizer, [], parser=lambda text: ParsedTurn(content=text.upper()))
    assert session.parse_tool_calls("hi") == ParsedTurn(content="HI")
    with pytest.raises(TypeError) as info:
        ScriptedSession(tokenizer, [], tools=[Lookup])
    assert str(info.value) == (
        "ScriptedSession tools must be built Tool objects, got ABCMeta; pass "
        "MyTool(config, part_context())"
    )
    with pytest.raises(ValueError, match="tool_call_text writes the formats hermes, "):
        tool_call_text("f", {}, format="pythonic")
    harmony = tool_call_text("f", {"x": 1}, format="gpt-oss")
    (call,) = get_plugin_manager().registry("tool_parsers").load("gpt-oss")(harmony).tool_calls
    assert (call.name, call.arguments) == ("f", {"x": 1})
