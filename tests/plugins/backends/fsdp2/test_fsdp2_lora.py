"""LoRA on fsdp2 (model.lora_rank): only the adapters train, the reference is the same model
with them off, engines and exports get merged weights under Hugging Face names, checkpoints
hold the adapters and resume exactly, the exported adapter folder loads with peft."""

import sys

import pytest
import torch
import torch.multiprocessing as mp
import transformers

from plugrl.errors import RecipeError
from plugrl_fsdp2 import lora
from plugrl_fsdp2.checkpoint import PlainDataReader
from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    full_weights,
    make_backend,
    make_batch,
    make_recipe,
    max_weight_difference,
    plain_log_probs,
    rank_log_probs_worker,
)

LORA = {"lora_rank": 4, "lora_alpha": 8}


def lora_recipe(tiny_model, lr=1e-2, **model):
    return make_recipe(tiny_model, lr=lr, model={**LORA, **model})


def logits_of(model, batch):
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """A LoRA actor after one update, exported (merged folder and adapter folder)."""
    backend = make_backend(lora_recipe(tiny_model))
    backend.update_policy(make_batch(8, seed=1), TokenMeanReinforce())
    folder = tmp_path_factory.mktemp("lora-export") / "hf"
    backend.export_hf(folder)
    return backend, folder


def test_two_updates_train_the_adapters_alone_and_ref_is_the_base_model(tiny_model):
    backend = make_backend(lora_recipe(tiny_model))
    batch = make_batch(8)
    trainable = {name for name, p in backend.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    optimized = [p for group in backend.optimizer.param_groups for p in group["params"]]
    assert len(optimized) == len(trainable)
    before = {
        name: p.detach().full_tensor().clone() for name, p in backend.model.named_parameters()
    }
    first = backend.update_policy(batch, TokenMeanReinforce())
    second = backend.update_policy(batch, TokenMeanReinforce())
    assert second["actor/loss"] < first["actor/loss"]
    after = {name: p.detach().full_tensor() for name, p in backend.model.named_parameters()}
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    # lora_A starts random and lora_B at zero: after two steps both have moved, nothing else
    assert changed == trainable
    base, _ = plain_log_probs(tiny_model, batch)
    reference = backend.compute_ref_log_prob(batch)["log_probs"]
    torch.testing.assert_close(reference, base, atol=1e-5, rtol=0)
    current = backend.compute_log_prob(batch)["log_probs"]
    assert float((current - base).abs().max()) > 1e-2, "the adapters change the policy"


def test_the_ref_of_a_full_actor_is_not_the_actors_to_compute(tiny_model):
    backend = make_backend(make_recipe(tiny_model))
    with pytest.raises(RuntimeError) as info:
        backend.compute_ref_log_prob(make_batch(2))
    assert str(info.value) == (
        "compute_ref_log_prob() needs an actor that trains LoRA adapters (model.lora_rank > 0); "
        "otherwise the ref role computes them"
    )


def test_engines_get_merged_weights_under_the_hugging_face_names(tiny_model, trained):
    backend, _ = trained
    weights = dict(backend.named_weights())
    plain = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    assert list(weights) == list(plain.state_dict())
    assert [meta.name for meta in backend.weight_metadata()] == list(weights)
    assert [meta.shape for meta in backend.weight_metadata()] == [
        tuple(t.shape) for t in weights.values()
    ]
    layer = backend.model.base_model.model.model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight.full_tensor() + 2.0 * (
        layer.lora_B["default"].weight.full_tensor() @ layer.lora_A["default"].weight.full_tensor()
    )
    torch.testing.assert_close(weights["model.layers.0.self_attn.q_proj.weight"], expected)
    # a plain model with those weights computes what the backend does
    plain.load_state_dict(weights)
    batch = make_batch(8, seed=3)
    response = batch["responses"].shape[1]
    logits = logits_of(plain.eval(), batch)[:, -response - 1 : -1]
    expected_lp = torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1))
    got = backend.compute_log_prob(batch)["log_probs"]
    mask = batch["attention_mask"][:, -response:]
    torch.testing.assert_close(got, expected_lp.squeeze(-1) * mask, atol=1e-5, rtol=0)


def test_the_merged_export_equals_the_adapter_on_the_base_model(tiny_model, trained):
    from peft import PeftModel

    _, folder = trained
    merged = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    adapter = folder / lora.ADAPTER_FOLDER
    assert {p.name for p in adapter.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    with_adapter = PeftModel.from_pretrained(base, adapter).eval()
    batch = make_batch(8, seed=4)
    torch.testing.assert_close(
        logits_of(merged, batch), logits_of(with_adapter, batch), atol=1e-5, rtol=0
    )
    with with_adapter.disable_adapter():  # the adapter does change the model
        assert not torch.allclose(logits_of(merged, batch), logits_of(with_adapter, batch))


def test_a_run_starts_from_a_saved_adapter(tiny_model, trained):
    backend, folder = trained
    batch = make_batch(8, seed=5)
    resumed = make_backend(
        lora_recipe(tiny_model, lora_adapter_path=str(folder / lora.ADAPTER_FOLDER))
    )
    torch.testing.assert_close(
        resumed.compute_log_prob(batch)["log_probs"],
        backend.compute_log_prob(batch)["log_probs"],
        atol=1e-6,
        rtol=0,
    )
    assert all(p.requires_grad == (".lora_" in n) for n, p in resumed.model.named_parameters())


def _resume_recipe(tiny_model):
    # shuffling and warm-up make the next step depend on the restored RNG and LR schedule
    return make_recipe(
        tiny_model,
        shuffle=True,
        ppo_mini_batch_size=4,
        optim={"lr_warmup_steps": 3},
        model=LORA,
    )


def test_the_checkpoint_holds_the_adapters_and_resumes_to_the_same_step(tiny_model, tmp_path):
    backend = make_backend(_resume_recipe(tiny_model))
    backend.update_policy(make_batch(8, seed=1), TokenMeanReinforce())
    backend.save_checkpoint(tmp_path / "actor")
    expected_metrics = backend.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    expected = full_weights(backend)

    saved = PlainDataReader(tmp_path / "actor").read_metadata().state_dict_metadata
    model_keys = [key for key in saved if key.startswith("model.")]
    assert model_keys and all(".lora_A." in key or ".lora_B." in key for key in model_keys)
    assert any(key.startswith("optimizer.") for key in saved)

    resumed = make_backend(_resume_recipe(tiny_model))
    resumed.load_checkpoint(tmp_path / "actor")
    metrics = resumed.update_policy(make_batch(8, seed=2), TokenMeanReinforce())
    assert metrics == expected_metrics
    assert max_weight_difference(full_weights(resumed), expected) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_ranks_build_the_adapters_from_rank0_and_merge_the_same(
    tiny_model, trained, tmp_path, dtype
):
    from plugrl.cluster.distributed import free_port

    _, folder = trained
    options = {**LORA, "lora_adapter_path": str(folder / lora.ADAPTER_FOLDER)}
    one_rank = make_backend(make_recipe(tiny_model, dtype=dtype, model=options))
    mp.spawn(
        rank_log_probs_worker,
        args=(2, free_port(), str(tiny_model), str(tmp_path), {**options, "dtype": dtype}),
        nprocs=2,
        join=True,
    )
    expected = one_rank.compute_log_prob(make_batch(8))["log_probs"]
    for rank in (0, 1):
        log_probs = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        torch.testing.assert_close(log_probs, expected, atol=1e-5, rtol=0)
    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert max_weight_difference(weights, full_weights(one_rank)) == 0.0


def test_under_mixed_precision_the_frozen_base_is_held_in_the_compute_dtype(tiny_model):
    backend = make_backend(make_recipe(tiny_model, dtype="bfloat16", lr=1e-2, model=LORA))
    held = {
        ".lora_" in name: p.dtype for name, p in backend.model.named_parameters()
    }  # adapters float32 for the optimizer; base weights bfloat16, never updated
    assert held == {True: torch.float32, False: torch.bfloat16}
    batch = make_batch(8)
    reference = backend.compute_ref_log_prob(batch)["log_probs"]
    backend.update_policy(batch, TokenMeanReinforce())
    assert torch.equal(backend.compute_ref_log_prob(batch)["log_probs"], reference)
    assert {t.dtype for _, t in backend.named_weights()} == {torch.bfloat16}


# ------------------------------------------------------------------------------- errors


def test_a_folder_without_adapter_config_is_refused(tiny_model, tmp_path):
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model, lora_adapter_path=str(tmp_path)))
    assert str(info.value) == (
        f"model.lora_adapter_path: {str(tmp_path)!r} is not a PEFT adapter folder (no "
        "adapter_config.json); give a folder written by save_pretrained of a peft model, or "
        "unset it"
    )


def test_an_adapter_folder_without_weights_is_refused(tiny_model, trained, tmp_path):
    _, folder = trained
    config = (folder / lora.ADAPTER_FOLDER / "adapter_config.json").read_text()
    (tmp_path / "adapter_config.json").write_text(config)
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model, lora_adapter_path=str(tmp_path)))
    assert str(info.value) == (
        f"model.lora_adapter_path: {str(tmp_path)!r} has no adapter_model.safetensors; give a "
        "folder written by save_pretrained of a peft model"
    )


def test_target_modules_the_model_lacks_are_refused(tiny_model):
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model, target_modules=["query_key_value"]))
    message = str(info.value)
    assert message.startswith(
        "model.target_modules: peft could not put adapters on Qwen2ForCausalLM: "
    )
    assert message.endswith(
        "; name modules the model has (all-linear, or names such as q_proj and v_proj)"
    )
    assert "\n" not in message


def test_exclude_modules_leave_layers_without_adapters(tiny_model):
    backend = make_backend(lora_recipe(tiny_model, exclude_modules=["down_proj", "up_proj"]))
    names = [name for name, _ in backend.model.named_parameters() if ".lora_A." in name]
    assert names and not any("down_proj" in n or "up_proj" in n for n in names)
    assert any("gate_proj" in n for n in names)


def test_without_peft_the_error_says_how_to_install_it(tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model))
    assert str(info.value) == (
        "model.lora_rank: is set but peft is not installed; pip install peft (or set "
        "model.lora_rank=0)"
    )


def test_peft_comes_with_plugrl_and_the_lora_extra_still_names_it():
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[4]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("peft") for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert [r for r in extras["lora"] if r.startswith("peft")] == extras["lora"]


# peft says so when it finds a Conv1D among targets of a config made for Linear layers
@pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to False:UserWarning")
def test_merging_matches_peft_for_plain_and_transposed_weights():
    import peft
    from transformers.pytorch_utils import Conv1D

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.plain = torch.nn.Linear(6, 4)
            self.conv = Conv1D(4, 6)  # GPT-2's layer: weight stored (in, out)

    torch.manual_seed(0)
    config = peft.LoraConfig(
        r=2, lora_alpha=6, target_modules=["plain", "conv"], init_lora_weights=False
    )
    model = peft.get_peft_model(Two(), config)
    found = lora.adapters(model)
    merged = {
        lora.hf_name(name): lora.merge(
            dict(model.named_parameters())[name],
            a.lora_a,
            a.lora_b,
            a.scaling,
            a.transposed,
        )
        for name, a in found.items()
    }
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == {"plain.weight", "conv.weight"}
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name])


def test_an_adapter_other_than_lora_is_refused(tiny_model, tmp_path):
    import peft

    peft.IA3Config(target_modules=["q_proj"], feedforward_modules=[]).save_pretrained(tmp_path)
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model, lora_adapter_path=str(tmp_path)))
    assert str(info.value) == (
        f"model.lora_adapter_path: {str(tmp_path)!r} holds a IA3Config adapter; the fsdp2 "
        "backend trains LoRA adapters only"
    )


def test_an_adapter_file_of_another_model_is_refused(tiny_model, trained, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = trained
    adapter = folder / lora.ADAPTER_FOLDER
    (tmp_path / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    state = load_file(adapter / "adapter_model.safetensors")
    state = {name.replace("layers.1.", "layers.7."): tensor for name, tensor in state.items()}
    save_file(state, tmp_path / "adapter_model.safetensors")
    with pytest.raises(RecipeError) as info:
        make_backend(lora_recipe(tiny_model, lora_adapter_path=str(tmp_path)))
    message = str(info.value)
    assert message.startswith(
        f"model.lora_adapter_path: {str(tmp_path / 'adapter_model.safetensors')!r} does not "
        "fit the model's adapters: missing ['base_model.model.model.layers.1."
    )
    assert message.endswith("; is it an adapter of another model?")


@pytest.mark.filterwarnings("error:`is_gradient_checkpointing`:FutureWarning")
def test_peft_wraps_a_model_without_the_renamed_attribute_warning(tiny_model):
    """peft's get_peft_model reads an attribute transformers 5 renamed: the fsdp2 backend's
    LoRA wrapping does not show that warning (an error here, as the filter turns it into
    one)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    recipe = lora_recipe(tiny_model)
    wrapped = lora.wrap(model, recipe, load_adapter=False)
    assert any(".lora_A." in name for name, _ in wrapped.named_parameters())
