"""The fsdp2 backend on one rank in this process (the same collective code as on many)."""

import math

import pytest
import torch

from plugrl.config.structuring import structure
from plugrl.errors import RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl_fsdp2.config import FSDP2ActorConfig
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
    objective_value,
    plain_log_probs,
    plain_token_columns,
)


def test_log_probs_and_entropy_match_the_plain_model(tiny_model):
    backend = make_backend(make_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3))
    batch = make_batch(8)
    out = backend.compute_log_prob(batch, calculate_entropy=True)
    expected_log_probs, expected_entropy = plain_log_probs(tiny_model, batch)
    assert out["log_probs"].shape == batch["responses"].shape
    torch.testing.assert_close(out["log_probs"], expected_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["entropys"], expected_entropy, atol=1e-5, rtol=0)
    assert "sum_pi_squared" not in out  # only when asked


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_sum_pi_squared_matches_the_plain_model(tiny_model, packed):
    backend = make_backend(
        make_recipe(tiny_model, ppo_micro_batch_size_per_gpu=3, use_remove_padding=packed)
    )
    batch = make_batch(8)
    batch.meta["temperature"] = 0.7
    out = backend.compute_log_prob(batch, calculate_sum_pi_squared=True)
    expected_log_probs, _, expected = plain_token_columns(tiny_model, batch, temperature=0.7)
    torch.testing.assert_close(out["log_probs"], expected_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["sum_pi_squared"], expected, atol=1e-6, rtol=1e-5)
    valid = batch["response_mask"].bool()
    # a distribution's sum of squares lies in (1/V, 1]; padding is 0
    assert bool(
        ((out["sum_pi_squared"][valid] > 1 / 320) & (out["sum_pi_squared"][valid] <= 1)).all()
    )
    assert bool((out["sum_pi_squared"][~valid] == 0).all())


def test_log_probs_use_the_sampling_temperature(tiny_model):
    backend = make_backend(make_recipe(tiny_model))
    batch = make_batch(4)
    batch.meta["temperature"] = 0.7
    expected, _ = plain_log_probs(tiny_model, batch, temperature=0.7)
    torch.testing.assert_close(
        backend.compute_log_prob(batch)["log_probs"], expected, atol=1e-5, rtol=0
    )


def test_log_probs_do_not_depend_on_the_micro_batch_split(tiny_model):
    batch = make_batch(8)
    whole = make_backend(make_recipe(tiny_model)).compute_log_prob(batch)["log_probs"]
    dynamic = make_backend(
        make_recipe(tiny_model, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=30)
    ).compute_log_prob(batch)["log_probs"]
    torch.testing.assert_close(dynamic, whole, atol=1e-5, rtol=0)


def test_updates_reduce_the_objective(tiny_model):
    backend = make_backend(make_recipe(tiny_model, lr=1e-3))
    batch = make_batch(8)
    before = objective_value(backend, batch)
    for _ in range(3):
        metrics = backend.update_policy(batch, TokenMeanReinforce())
    after = objective_value(backend, batch)
    assert after < before - 0.05
    assert set(metrics) == {"actor/pg_loss", "actor/loss", "actor/grad_norm", "actor/lr"}
    assert metrics["actor/loss"] == pytest.approx(metrics["actor/pg_loss"], rel=1e-4)


def _weights_after_one_update(model_dir, batch, **actor):
    backend = make_backend(make_recipe(model_dir, **actor))
    metrics = backend.update_policy(batch, TokenMeanReinforce())
    return full_weights(backend), metrics


@pytest.mark.parametrize(
    "split",
    [
        {"ppo_micro_batch_size_per_gpu": 3},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24},
    ],
    ids=["micro-batches", "dynamic-bsz"],
)
def test_split_updates_equal_the_whole_batch_update(tiny_model, split):
    batch = make_batch(8)
    whole, whole_metrics = _weights_after_one_update(tiny_model, batch)
    parts, part_metrics = _weights_after_one_update(tiny_model, batch, **split)
    # Adam's first step moves every weight by about lr (1e-3); summation order differs only
    assert max_weight_difference(whole, parts) < 2e-5
    assert part_metrics["actor/loss"] == pytest.approx(whole_metrics["actor/loss"], rel=1e-5)
    assert part_metrics["actor/grad_norm"] == pytest.approx(
        whole_metrics["actor/grad_norm"], rel=1e-5
    )


def test_two_mini_batches_take_two_optimizer_steps(tiny_model):
    batch = make_batch(8)
    one_step, _ = _weights_after_one_update(tiny_model, batch, ppo_mini_batch_size=8)
    two_steps, _ = _weights_after_one_update(tiny_model, batch, ppo_mini_batch_size=4)
    first_half, _ = _weights_after_one_update(
        tiny_model, batch.select(range(4)), ppo_mini_batch_size=4
    )
    assert max_weight_difference(one_step, two_steps) > 1e-4
    # the second step starts where the first half left off
    assert max_weight_difference(first_half, two_steps) > 1e-5


def _grad_norms_at_each_step(backend):
    """The gradient norm the optimizer sees at each of its steps."""
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad.full_tensor() for p in backend.model.parameters() if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

    backend.optimizer.register_step_pre_hook(record)
    return norms


def test_grad_clip_bounds_the_step_and_reports_the_norm(tiny_model):
    batch = make_batch(8)
    unclipped = make_backend(make_recipe(tiny_model, grad_clip=0.0))
    seen = _grad_norms_at_each_step(unclipped)
    norm = unclipped.update_policy(batch, TokenMeanReinforce())["actor/grad_norm"]
    assert norm == pytest.approx(seen[0], rel=1e-5) and norm > 0.5

    clipped = make_backend(make_recipe(tiny_model, grad_clip=0.25))
    seen = _grad_norms_at_each_step(clipped)
    reported = clipped.update_policy(batch, TokenMeanReinforce())["actor/grad_norm"]
    assert reported == pytest.approx(norm, rel=1e-5)  # the norm before clipping
    assert seen[0] == pytest.approx(0.25, rel=1e-4)  # what the optimizer stepped with


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)`")
def test_a_non_finite_gradient_skips_the_step(tiny_model):
    class Poisoned(TokenMeanReinforce):
        def __call__(self, micro_batch, log_prob, entropy, scale):
            loss, metrics = super().__call__(micro_batch, log_prob, entropy, scale)
            return loss * float("nan"), metrics

    backend = make_backend(make_recipe(tiny_model))
    before = full_weights(backend)
    metrics = backend.update_policy(make_batch(8), Poisoned())
    assert metrics["actor/grad_norm"] != metrics["actor/grad_norm"]  # NaN is reported
    assert max_weight_difference(before, full_weights(backend)) == 0.0


def test_learning_rate_follows_warmup_then_cosine(tiny_model):
    recipe = make_recipe(
        tiny_model,
        lr=1e-3,
        optim={"lr_warmup_steps": 2, "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1},
    )
    backend = make_backend(recipe, total_steps=6)
    batch = make_batch(8)
    lrs = [backend.update_policy(batch, TokenMeanReinforce())["actor/lr"] for _ in range(7)]

    def cosine(progress):
        return 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    expected = [0.0, 0.5e-3, 1e-3, cosine(0.25), cosine(0.5), cosine(0.75), 0.1e-3]
    assert lrs == pytest.approx(expected, abs=1e-9)


def test_weight_decay_shrinks_weights_without_gradient(tiny_model):
    recipe = make_recipe(tiny_model, lr=1e-2, optim={"weight_decay": 0.5})
    backend = make_backend(recipe)
    batch = make_batch(8)
    batch["advantages"] = torch.zeros_like(batch["advantages"])  # zero gradient
    before = full_weights(backend)
    backend.update_policy(batch, TokenMeanReinforce())
    after = full_weights(backend)
    name = "model.layers.0.mlp.up_proj.weight"
    torch.testing.assert_close(after[name], before[name] * (1 - 1e-2 * 0.5))


def test_gradient_checkpointing_gives_the_same_update(tiny_model):
    batch = make_batch(8)
    plain, _ = _weights_after_one_update(tiny_model, batch)
    recipe = make_recipe(tiny_model, gradient_checkpointing=True)
    backend = make_backend(recipe)
    assert any(getattr(m, "gradient_checkpointing", False) for m in backend.model.modules())
    backend.update_policy(batch, TokenMeanReinforce())
    assert max_weight_difference(plain, full_weights(backend)) < 2e-5


def test_entropy_reaches_an_objective_that_asks_for_it(tiny_model):
    seen = []

    class EntropyBonus(TokenMeanReinforce):
        needs_entropy = True

        def __call__(self, micro_batch, log_prob, entropy, scale):
            seen.append(entropy)
            loss, metrics = super().__call__(micro_batch, log_prob, entropy, scale)
            return loss - 0.01 * (
                entropy * micro_batch["response_mask"]
            ).sum() / scale.num_tokens, metrics

    backend = make_backend(make_recipe(tiny_model))
    backend.update_policy(make_batch(8), EntropyBonus())
    assert seen and seen[0].requires_grad and seen[0].shape == (8, 6)


def test_mixed_precision_keeps_float32_weights_and_computes_in_bfloat16(tiny_model):
    backend = make_backend(make_recipe(tiny_model, dtype="bfloat16"))
    assert {p.dtype for p in backend.model.parameters()} == {torch.float32}
    assert {t.dtype for _, t in backend.named_weights()} == {torch.bfloat16}
    batch = make_batch(8)
    expected, _ = plain_log_probs(tiny_model, batch)
    got = backend.compute_log_prob(batch)["log_probs"]
    assert (got - expected).abs().max() < 0.1  # bfloat16 rounding, not a different model
    backend.update_policy(batch, TokenMeanReinforce())

    ref = make_backend(make_recipe(tiny_model, dtype="bfloat16"), role="ref")
    assert {p.dtype for p in ref.model.parameters()} == {torch.bfloat16}


def test_the_reference_role_is_frozen(tiny_model):
    ref = make_backend(make_recipe(tiny_model), role="ref")
    assert ref.optimizer is None
    assert not any(p.requires_grad for p in ref.model.parameters())
    batch = make_batch(4)
    expected, _ = plain_log_probs(tiny_model, batch)
    torch.testing.assert_close(
        ref.compute_log_prob(batch)["log_probs"], expected, atol=1e-5, rtol=0
    )
    with pytest.raises(RuntimeError, match="update_policy\\(\\) is for the actor role, not ref"):
        ref.update_policy(batch, TokenMeanReinforce())


def test_rollout_model_is_the_live_model_and_sees_each_update(tiny_model):
    backend = make_backend(make_recipe(tiny_model, lr=1e-2))
    model = backend.rollout_model()
    assert model is backend.model
    prompt = torch.randint(1, 256, (2, 5))
    with torch.no_grad():
        model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False
        )
    batch = make_batch(8)
    backend.update_policy(batch, TokenMeanReinforce())
    with torch.no_grad():
        live = model(input_ids=prompt).logits
    import transformers

    plain = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    plain.load_state_dict(dict(backend.named_weights()))
    with torch.no_grad():
        expected = plain(input_ids=prompt).logits
    torch.testing.assert_close(live, expected, atol=1e-5, rtol=0)
    assert make_backend(make_recipe(tiny_model), role="ref").rollout_model() is None


def test_named_weights_are_full_tensors_with_hugging_face_names(tiny_model):
    import transformers

    backend = make_backend(make_recipe(tiny_model))
    weights = dict(backend.named_weights())
    reference = transformers.AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor)


def test_a_batch_that_does_not_fill_mini_batches_is_refused(tiny_model):
    backend = make_backend(make_recipe(tiny_model, ppo_mini_batch_size=3))
    with pytest.raises(RecipeError) as info:
        backend.update_policy(make_batch(8), TokenMeanReinforce())
    assert str(info.value) == (
        "actor.ppo_mini_batch_size: a rank got 8 sequences, not a multiple of its mini-batch "
        "share of 3 (ppo_mini_batch_size 3 x rollout.n 1 / 1 ranks); make "
        "data.train_batch_size a multiple of actor.ppo_mini_batch_size"
    )


def test_missing_columns_are_named(tiny_model):
    backend = make_backend(make_recipe(tiny_model))
    batch = make_batch(8)
    batch.pop("advantages")
    with pytest.raises(KeyError, match="the fsdp2 actor update needs batch columns advantages"):
        backend.update_policy(batch, TokenMeanReinforce())


def test_model_path_errors_name_the_key(tiny_model, tmp_path):
    recipe = make_recipe(tiny_model)
    recipe.model.path = None
    with pytest.raises(RecipeError) as info:
        make_backend(recipe)
    assert str(info.value) == "model.path: is not set; give the folder of a Hugging Face model"
    recipe.model.path = str(tmp_path)
    with pytest.raises(RecipeError) as info:
        make_backend(recipe)
    assert str(info.value) == (
        f"model.path: {str(tmp_path)!r} is not a Hugging Face model folder (no config.json); "
        "give a local folder saved with save_pretrained"
    )


def test_override_config_sets_model_fields_and_rejects_unknown_ones(tiny_model):
    recipe = make_recipe(tiny_model)
    recipe.model.override_config = {"attention_dropout": 0.0, "rms_norm_eps": 1e-5}
    assert make_backend(recipe).model.config.rms_norm_eps == 1e-5
    recipe.model.override_config = {"no_such_field": 1}
    with pytest.raises(RecipeError) as info:
        make_backend(recipe)
    assert str(info.value) == (
        "model.override_config.no_such_field: Qwen2Config has no field 'no_such_field'; "
        "see the model's config.json"
    )


def test_fsdp_size_must_divide_the_ranks(tiny_model):
    with pytest.raises(RecipeError) as info:
        make_backend(make_recipe(tiny_model, fsdp_size=2))
    assert (
        str(info.value) == "actor.fsdp_size: must divide the 1 ranks of the role (or be -1), got 2"
    )
    with pytest.raises(RecipeError) as info:
        structure(FSDP2ActorConfig, {"fsdp_size": 0}, "actor")
    assert str(info.value) == "actor.fsdp_size: must be -1 (all ranks) or > 0, got 0"


def test_the_backend_is_registered_with_its_config():
    from plugrl.plugin.manager import PluginManager

    plugins = PluginManager()
    plugins.load_entry_points()
    entry = plugins.registry("training_backends").get("fsdp2")
    assert entry.load_config() is FSDP2ActorConfig
    assert entry.load().__name__ == "FSDP2Backend"


SPLITS = [
    {"ppo_micro_batch_size_per_gpu": 3},
    {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24},
]


@pytest.mark.parametrize("split", SPLITS, ids=["micro-batches", "dynamic-bsz"])
def test_objective_metrics_do_not_depend_on_the_micro_batch_split(tiny_model, split):
    from plugrl.algorithms.objective import PolicyObjective

    batch = make_batch(8)
    # old log-probs away from the current ones, so that ratios clip and ppo_kl is not zero
    generator = torch.Generator().manual_seed(3)
    current = make_backend(make_recipe(tiny_model)).compute_log_prob(batch)["log_probs"]
    noise = 0.3 * torch.randn(current.shape, generator=generator)
    batch["old_log_probs"] = (current + noise) * batch["response_mask"]

    def metrics_of(**actor):
        recipe = make_recipe(tiny_model, entropy_coeff=0.01, **actor)
        return make_backend(recipe).update_policy(
            batch, PolicyObjective.from_recipe(recipe, get_plugin_manager())
        )

    whole, parts = metrics_of(), metrics_of(**split)
    assert whole["actor/pg_clipfrac"] > 0.05 and abs(whole["actor/ppo_kl"]) > 1e-3
    assert set(parts) == set(whole)
    for name, value in whole.items():
        assert parts[name] == pytest.approx(value, rel=1e-4, abs=1e-7), name
