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


def test_vocabulary_terms(plan):
    response_tokens = 8192 * 256 // 512  # half of a full-length row is response
    update = terms_of(plan, "update", "actor")
    # as the backward starts: the head output the gather keeps, the float32 logits kept,
    # logsumexp's backward (difference, exponential, product) and the gather's gradient
    assert update["lm_head output"] == response_tokens * V * 2
    assert update["logits (float32)"] == response_tokens * V * 4
    assert update["log-softmax backward"] == response_tokens * V * 4 * 3
    assert update["logit gradients"] == response_tokens * V * 4
    log_prob = plan.phase("trainer", "log_prob").instants
    assert {t.name: t.bytes for t in log_prob["actor lm_head"]}["lm_head output"] == (
        response_tokens * V * 2
    )
    softmax = {t.name: t.bytes for t in log_prob["actor log-softmax"]}
    assert softmax == {"logits (float32)": response_tokens * V * 4} | {
        "log-softmax workspace": response_tokens * V * 4
    }


def test_packed_update_keeps_no_head_output(bench_recipe):
    """Packed rows pick the response positions by indexing, whose backward keeps only the
    indices: the head's bfloat16 output is freed once its float32 copy exists (measured on
    the CPU, bench/bench_memory_plan.py), so the update holds 20 bytes a logit, not 22."""
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, ["actor.use_remove_padding=true"], plugins)
    plan = plan_recipe(recipe, None, plugins)
    response_tokens = 8192 * 256 // 512
    update = terms_of(plan, "update", "actor")
    assert "lm_head output" not in update
    assert update["logits (float32)"] == response_tokens * V * 4
    assert update["log-softmax backward"] == response_tokens * V * 4 * 3
    assert update["logit gradients"] == response_tokens * V * 4
    # the log-prob pass still has the moment the head's output is made
    log_prob = plan.phase("trainer", "log_prob").instants
    assert {t.name: t.bytes for t in log_prob["actor lm_head"]}["lm_head output"] == (
        response_tokens * V * 2
    )


def test_ulysses_scores_every_position_of_its_slice(bench_recipe):
    """Under Ulysses each rank takes the log-softmax of every position of its slice, prompt
    included: the vocabulary buffers are over the micro-batch's tokens on the rank (8192,
    ppo_max_token_len_per_gpu), not its response share."""
    plugins = get_plugin_manager()
    overrides = ["cluster=ray", "trainer.n_gpus_per_node=2"]
    overrides.append("actor.ulysses_sequence_parallel_size=2")
    plan = plan_recipe(load_recipe(bench_recipe, overrides, plugins), None, plugins)
    update = terms_of(plan, "update", "actor")
    assert "lm_head output" not in update  # the slice's float32 copy owns the logits
    assert update["logits (float32)"] == 8192 * V * 4
    assert update["log-softmax backward"] == 8192 * V * 4 * 3
    log_prob = plan.phase("trainer", "log_prob").instants
    assert {t.name: t.bytes for t in log_prob["actor log-softmax"]}["logits (float32)"] == (
        8192 * V * 4
    )


def test_unfused_log_softmax_is_named_when_the_update_does_not_fit(bench_recipe):
    """A plan over the device's memory says what its log-probs cost per logit here against
    a fused cross-entropy's 2 bytes, so it never silently disagrees with a verl run."""
    plugins = get_plugin_manager()
    recipe = load_recipe(bench_recipe, [], plugins)
    response_tokens = 8192 * 256 // 512
    over = plan_recipe(recipe, 10 * GIB, plugins)
    vocabulary = response_tokens * V * (2 + 4 + 12 + 4)  # 22 bytes a logit, padded rows
    caveat = (
        "the actor's log-probs take 22 bytes a scored logit at the update's peak here "
        f"({vocabulary / GIB:.2f} GiB: a float32 log-softmax and its backward, unfused)"
    )
    assert any(note.startswith(caveat) for note in over.notes)
    assert "note: " + caveat in render_table(over)
    assert json.loads(render_json(over))["notes"] == list(over.notes)
    assert not any("log-probs" in note for note in plan_recipe(recipe, 80 * GIB, plugins).notes)


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
    # the update needs about 39 GiB, 29 GiB with gradient checkpointing
    planner = RecipePlanner(str(bench_recipe), [], plugins, device_memory=30 * GIB)
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
