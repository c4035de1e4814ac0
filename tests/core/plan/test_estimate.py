"""Each term of a plan held to a hand-computed value, the phases, the verdict and the JSON.

The recipe is the GPU benchmark's Qwen2.5-0.5B step (tests/core/plan/conftest.py): h=896,
a=896 (14 heads x 64), k=128 (2 kv heads), i=4864, V=151936, L=24, P=494,032,768.
"""

from __future__ import annotations

import json

import pytest

from plugrl.plan import GIB, plan_recipe
from plugrl.plan.planner import RecipePlanner
from plugrl.plan.render import render_json, render_table
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import load_recipe

P = 494_032_768
H, A, K, INTER, V, L = 896, 896, 128, 4864, 151_936, 24


def terms_of(plan, phase, role):
    estimate = plan.phase("trainer", phase)
    everything = estimate.persistent + tuple(t for ts in estimate.instants.values() for t in ts)
    return {t.name: t.bytes for t in everything if t.role == role}


@pytest.fixture
def plan(bench_recipe):
    plugins = get_plugin_manager()
    return plan_recipe(load_recipe(bench_recipe, [], plugins), 80 * GIB, plugins)


def test_model_states(plan):
    update = terms_of(plan, "update", "actor")
    # mixed precision: float32 weights, gradients and two AdamW moments, one rank
    assert update["parameters"] == P * 4
    assert update["gradients"] == P * 4
    assert update["optimizer states"] == 2 * P * 4
    assert "gradients" not in terms_of(plan, "log_prob", "actor")  # freed after each step


def test_activations_without_checkpointing(plan):
    e = 2
    per_layer = (
        2 * (4 + e) * H  # two RMSNorms: float32 input, normalized output
        + 2 * e * H  # inputs of q/k/v and gate/up
        + e * (A + 2 * K)  # q, k, v after rotary
        + 2 * e * A  # attention output, and o_proj's contiguous input
        + 4 * 14  # float32 log-sum-exp per head
        + 4 * e * INTER  # gate, up, silu(gate), product
    )
    assert per_layer == 59_192
    tokens = 8192  # ppo_max_token_len_per_gpu
    assert terms_of(plan, "update", "actor")["activations"] == tokens * (
        L * per_layer + (4 + e) * H
    )


def test_activations_with_checkpointing(bench_recipe):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, ["model.enable_gradient_checkpointing=true"], plugins)
    plan = plan_recipe(recipe, None, plugins)
    e, per_layer = 2, 59_192
    # each layer keeps its input; one layer is recomputed with its full activations
    expected = 8192 * (L * e * H + per_layer + (4 + e) * H)
    assert terms_of(plan, "update", "actor")["activations"] == expected


CHUNK = 32 * 2**20 // V  # tokens per chunk of the log-probs at this vocabulary


def test_vocabulary_terms(plan):
    """As the backward starts the update holds the head's bfloat16 output, which the
    log-probs read where it lies and write their gradient over, and one chunk's working set:
    a float32 buffer and a bfloat16 one (no entropy), a second float32 one where the
    log-prob pass computes the entropy."""
    response_tokens = 8192 * 256 // 512  # half of a full-length row is response
    assert response_tokens > CHUNK
    update = terms_of(plan, "update", "actor")
    assert update["lm_head output"] == response_tokens * V * 2
    assert update["log-prob chunk"] == CHUNK * V * (4 + 2)
    for gone in ("logits (float32)", "log-softmax backward", "logit gradients"):
        assert gone not in update
    log_prob = plan.phase("trainer", "log_prob").instants
    assert {t.name: t.bytes for t in log_prob["actor lm_head"]}["lm_head output"] == (
        response_tokens * V * 2
    )
    scoring = {t.name: t.bytes for t in log_prob["actor log-probs"]}
    assert scoring == {"lm_head output": response_tokens * V * 2, "log-prob chunk": CHUNK * V * 10}


def test_packed_update_holds_what_the_padded_one_does(bench_recipe, plan):
    """Packed or padded, the model keeps only the outputs that predict a response token and
    the log-probs read them in place: the same vocabulary terms."""
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, ["actor.use_remove_padding=true"], plugins)
    packed = terms_of(plan_recipe(recipe, None, plugins), "update", "actor")
    padded = terms_of(plan, "update", "actor")
    for name in ("lm_head output", "log-prob chunk"):
        assert packed[name] == padded[name]


def test_a_micro_batch_smaller_than_a_chunk_is_one_chunk(bench_recipe):
    plugins = get_plugin_manager()
    lengths = ["data.max_prompt_length=64", "data.max_response_length=64"]
    overrides = [*lengths, "actor.ppo_max_token_len_per_gpu=128"]
    update = terms_of(
        plan_recipe(load_recipe(bench_recipe, overrides, plugins), None, plugins), "update", "actor"
    )
    assert update["log-prob chunk"] == 64 * V * 6  # 128 tokens, half of them response


def test_ulysses_scores_every_position_of_its_slice(bench_recipe):
    """Under Ulysses each rank scores every position of its slice, prompt included: the
    head's output is over the micro-batch's tokens on the rank (8192,
    ppo_max_token_len_per_gpu), not its response share."""
    plugins = get_plugin_manager()
    overrides = ["cluster=ray", "trainer.n_gpus_per_node=2"]
    overrides.append("actor.ulysses_sequence_parallel_size=2")
    plan = plan_recipe(load_recipe(bench_recipe, overrides, plugins), None, plugins)
    update = terms_of(plan, "update", "actor")
    assert update["lm_head output"] == 8192 * V * 2
    assert update["log-prob chunk"] == CHUNK * V * 6
    log_prob = plan.phase("trainer", "log_prob").instants
    assert {t.name: t.bytes for t in log_prob["actor log-probs"]}["lm_head output"] == (
        8192 * V * 2
    )


def test_the_entropy_takes_a_second_chunk_buffer(bench_recipe):
    """An entropy bonus, or an update that may take the old log-probs from its own forward
    (and report the entropy the skipped pass would have), computes the entropy in the update:
    one more float32 buffer of a chunk."""
    plugins = get_plugin_manager()
    for override in ("actor.entropy_coeff=0.01", "actor.ppo_mini_batch_size=32"):
        recipe = load_recipe(bench_recipe, [override], plugins)
        update = terms_of(plan_recipe(recipe, None, plugins), "update", "actor")
        assert update["log-prob chunk"] == CHUNK * V * (4 + 4 + 2), override
    one_step = ["actor.ppo_mini_batch_size=32", "actor.reuse_on_policy_log_prob=false"]
    recipe = load_recipe(bench_recipe, one_step, plugins)
    update = terms_of(plan_recipe(recipe, None, plugins), "update", "actor")
    assert update["log-prob chunk"] == CHUNK * V * (4 + 2)


def test_no_log_probs_caveat_is_left(bench_recipe):
    """The log-probs hold 2 bytes a bfloat16 logit, as verl's fused cross-entropy does: a
    plan over the device's memory has no note that blames them."""
    plugins = get_plugin_manager()
    over = plan_recipe(load_recipe(bench_recipe, [], plugins), 10 * GIB, plugins)
    assert not over.fits
    assert not any("log-probs" in note for note in over.notes)


def test_engine_terms(plan):
    rollout = terms_of(plan, "generate", "rollout")
    assert rollout["engine weights"] == P * 2  # bfloat16 copy of the trainer's weights
    assert rollout["fused decode weights"] == L * H * (A + 2 * K + 2 * INTER) * 2
    rows, length = 32 * 8, 512
    columns = 2048  # the power of two above twice the 512 tokens the window can hold
    assert rollout["KV cache"] == 2 * L * K * 2 * rows * columns
    assert columns >= 2 * length + 1
    assert rollout["decode logits"] == rows * V * (2 + 4 + 4)
    # one process: the engine keeps its weights and cache while the trainer runs
    assert "engine weights" in terms_of(plan, "update", "rollout")


def test_hf_engine_split_over_two_devices(bench_recipe):
    plugins = get_plugin_manager()
    overrides = [
        "cluster=ray",
        "rollout.colocate=false",
        "rollout.n_gpus_per_node=2",
        "rollout.tensor_model_parallel_size=2",
    ]
    plan = plan_recipe(load_recipe(bench_recipe, overrides, plugins), None, plugins)
    generate = plan.phase("rollout", "generate")
    everything = generate.persistent + tuple(t for ts in generate.instants.values() for t in ts)
    rollout = {t.name: t.bytes for t in everything}
    # half of each layer's projections and q/k/v biases, its two norms, the tied embedding
    # table and the final norm whole
    projections = 2 * H * A + 2 * H * K + 3 * H * INTER + (A + 2 * K)
    held = L * (projections // 2 + 2 * H) + V * H + H
    assert held == 315_105_664
    assert rollout["engine weights"] == held * 2
    assert "fused decode weights" not in rollout  # the split forward runs without them
    rows, columns = 32 * 8, 2048  # one engine of two devices takes every row
    assert rollout["KV cache"] == 2 * L * (K // 2) * 2 * rows * columns  # one kv head each


def test_engine_sleeps_on_ray_colocated(bench_recipe):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, ["cluster=ray"], plugins)
    plan = plan_recipe(recipe, None, plugins)
    assert "engine weights" not in terms_of(plan, "update", "rollout")


def test_phase_is_persistent_plus_worst_instant(plan):
    update = plan.phase("trainer", "update")
    held = sum(t.bytes for t in update.persistent)
    instants = {k: sum(t.bytes for t in v) for k, v in update.instants.items()}
    assert update.worst_instant == max(instants, key=instants.get) == "actor backward"
    assert update.peak == held + instants["actor backward"]


def test_verdict_and_margin(bench_recipe):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, [], plugins)
    roomy = plan_recipe(recipe, 80 * GIB, plugins)
    tight = plan_recipe(recipe, 10 * GIB, plugins)
    assert roomy.fits is True
    assert tight.fits is False
    worst = tight.worst()
    assert worst.margin == 10 * GIB - worst.peak < 0
    assert plan_recipe(recipe, None, plugins).fits is None
    assert "does not fit: trainer devices, update phase" in render_table(tight)


def test_json(plan):
    data = json.loads(render_json(plan))
    assert data["parameters"] == P
    assert data["fits"] is True
    update = next(p for p in data["phases"] if p["phase"] == "update")
    assert update["worst_instant"] == "actor backward"
    names = [t["name"] for t in update["persistent"]]
    assert "optimizer states" in names


class _WithoutEngineTerms:
    """The plugins, with the engine's answer withdrawn: what a third-party engine that does
    not implement the hook looks like."""

    def __init__(self, plugins):
        self._plugins = plugins
        self.hook = self

    def estimate_memory(self, **kwargs):
        if kwargs["role"] == "rollout":
            return [None]
        return self._plugins.hook.estimate_memory(**kwargs)


def test_unestimated_plugin_listed(bench_recipe):
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, [], plugins)
    plan = plan_recipe(recipe, 80 * GIB, _WithoutEngineTerms(plugins))
    assert [(u.role, u.plugin) for u in plan.unestimated] == [("rollout", "hf")]
    assert "unestimated: rollout (hf reports no memory terms" in render_table(plan)
    assert "rollout" not in {t.role for p in plan.phases for t in p.terms}


def test_solver_finds_the_largest_fitting_value(bench_recipe):
    plugins = get_plugin_manager()
    planner = RecipePlanner(str(bench_recipe), [], plugins, device_memory=20 * GIB)
    value, plan = planner.solve("actor.ppo_max_token_len_per_gpu")
    assert plan.fits
    assert not planner.plan([f"actor.ppo_max_token_len_per_gpu={value + 1}"]).fits
    assert planner.plan([f"actor.ppo_max_token_len_per_gpu={value}"]).fits


def test_suggestions_each_fit(bench_recipe):
    plugins = get_plugin_manager()
    # the update needs about 27 GiB, 17 GiB with gradient checkpointing
    planner = RecipePlanner(str(bench_recipe), [], plugins, device_memory=20 * GIB)
    plan = planner.plan_with_suggestions()
    assert plan.fits is False
    overrides = [s.override for s in plan.suggestions]
    assert "model.enable_gradient_checkpointing=true" in overrides
    for suggestion in plan.suggestions:
        assert planner.plan([suggestion.override]).fits


def test_deepspeed_zero3_model_states_7b():
    """DeepSpeed's estimate_zero3_model_states_mem_needs (no offload) gives per GPU
    4 x largest_layer_params + 18 x total_params / gpus: fp16 weights and gradients (2 + 2),
    a float32 master copy and two moments (12), and 2 more bytes of fp32 gradient buffer.
    FSDP2's sharded float32 weights are the master copy, so its model states are 16 bytes a
    parameter: DeepSpeed's less its fp16 weight copy."""
    plugins = get_plugin_manager()
    recipe = load_recipe(
        None,
        [
            "model.path=qwen2.5-7b",
            "cluster=ray",
            "trainer.n_gpus_per_node=8",
            "data.train_batch_size=64",
            "actor.ppo_mini_batch_size=64",
        ],
        plugins,
        runnable_here=False,
    )
    plan = plan_recipe(recipe, None, plugins)
    update = terms_of(plan, "update", "actor")
    ours = update["parameters"] + update["gradients"] + update["optimizer states"]
    total, gpus = 7_615_616_512, 8
    largest = 152_064 * 3584  # the vocabulary table is the largest module
    deepspeed = 4 * largest + 18 * total // gpus
    assert ours == 16 * total // gpus
    assert ours == pytest.approx(deepspeed - 2 * total / gpus - 4 * largest, rel=1e-6)
    # with the gathered units (DeepSpeed's largest-layer term, fp32 there, bf16 here)
    gathered = update["gathered weights"]
    # the root (embeddings, head, final norm) and a layer running with the next prefetched
    assert gathered == 2 * (2 * largest + 3584 + 2 * 233_057_792)
    assert (ours + gathered) / deepspeed == pytest.approx(0.95, abs=0.01)
