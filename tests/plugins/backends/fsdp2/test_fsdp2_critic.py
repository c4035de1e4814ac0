"""The critic role: a value head on the language model's hidden states."""

import pytest
import torch
import transformers

from tests.plugins.backends.fsdp2.fsdp2_testing import make_backend, make_batch, make_recipe


@pytest.fixture(scope="module")
def critic(tiny_model):
    return make_backend(make_recipe(tiny_model, critic_lr=1e-2), role="critic")


def test_values_come_from_the_hidden_state_before_each_response_token(tiny_model, critic):
    batch = make_batch(8)
    values = critic.compute_values(batch)
    assert values.shape == (8, 6)
    assert torch.all(values[batch["response_mask"] == 0] == 0)
    config = transformers.AutoConfig.from_pretrained(tiny_model, num_labels=1)
    plain = transformers.AutoModelForTokenClassification.from_config(config).eval()
    plain.load_state_dict(dict(critic.named_weights()))
    with torch.no_grad():
        scores = plain(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[:, -7:-1, 0]
    torch.testing.assert_close(values, scores * batch["response_mask"], atol=1e-5, rtol=0)


def test_critic_updates_move_values_towards_returns(tiny_model):
    critic = make_backend(
        make_recipe(tiny_model, critic_lr=1e-2, critic={"cliprange_value": 100.0}), role="critic"
    )
    batch = make_batch(8)
    mask = batch["response_mask"]

    def error():
        return float((((critic.compute_values(batch) - batch["returns"]) * mask) ** 2).sum())

    before = error()
    for _ in range(5):
        batch["values"] = critic.compute_values(batch)
        metrics = critic.update_critic(batch)
    assert error() < 0.75 * before
    assert set(metrics) == {
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vpred_mean",
        "critic/grad_norm",
        "critic/lr",
    }
    assert metrics["critic/lr"] == pytest.approx(1e-2)


def test_value_clipping_limits_the_loss_gradient(tiny_model):
    batch = make_batch(8)
    batch["returns"] = batch["returns"] + 5.0 * batch["response_mask"]
    clipped = make_backend(make_recipe(tiny_model, critic={"cliprange_value": 0.0}), role="critic")
    batch["values"] = clipped.compute_values(batch)
    metrics = clipped.update_critic(batch)
    # with a zero clip range the clipped prediction is the old value: the larger error wins
    # wherever the prediction moved towards the return, so part of the tokens are clipped
    assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0
    mask = batch["response_mask"].float()
    expected = 0.5 * (((batch["values"] - batch["returns"]) ** 2) * mask).sum() / mask.sum()
    assert metrics["critic/vf_loss"] == pytest.approx(float(expected), rel=1e-5)


def test_the_critic_has_no_log_probs_and_the_actor_no_values(tiny_model, critic):
    with pytest.raises(RuntimeError, match="compute_log_prob\\(\\) is for the actor or ref role"):
        critic.compute_log_prob(make_batch(2))
    actor = make_backend(make_recipe(tiny_model))
    with pytest.raises(RuntimeError, match="compute_values\\(\\) is for the critic role"):
        actor.compute_values(make_batch(2))


def test_an_exported_critic_loads_as_a_token_classifier(critic, tmp_path):
    critic.export_hf(tmp_path / "critic")
    loaded = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "critic")
    batch = make_batch(4)
    with torch.no_grad():
        scores = loaded.eval()(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[:, -7:-1, 0]
    torch.testing.assert_close(
        critic.compute_values(batch), scores * batch["response_mask"], atol=1e-5, rtol=0
    )


def test_critic_metrics_do_not_depend_on_the_micro_batch_split(tiny_model):
    batch = make_batch(8)
    batch["returns"] = batch["returns"] + 2.0 * batch["response_mask"]

    def metrics_of(**critic):
        backend = make_backend(
            make_recipe(tiny_model, critic={"cliprange_value": 0.05, **critic}), role="critic"
        )
        # old values away from the predictions, so that some are clipped
        shift = torch.linspace(-0.5, 0.5, batch["returns"].numel()).reshape(8, -1)
        batch["values"] = (backend.compute_values(batch) + shift) * batch["response_mask"]
        return backend.update_critic(batch)

    whole, split = metrics_of(), metrics_of(ppo_micro_batch_size_per_gpu=3)
    assert 0.0 < whole["critic/vf_clipfrac"] < 1.0
    for name, value in whole.items():
        assert split[name] == pytest.approx(value, rel=1e-4), name
