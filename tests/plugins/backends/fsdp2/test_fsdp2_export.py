"""export_hf writes a folder Hugging Face loads back to the same model."""

import json
import shutil

import torch
import transformers

from tests.plugins.backends.fsdp2.fsdp2_testing import (
    TokenMeanReinforce,
    make_backend,
    make_batch,
    make_recipe,
)


def test_export_loads_with_automodel_and_gives_the_same_logits(tiny_model, tmp_path):
    backend = make_backend(make_recipe(tiny_model, lr=1e-2))
    batch = make_batch(8)
    backend.update_policy(batch, TokenMeanReinforce())  # export trained, not initial, weights
    (tmp_path / ".hf.k1ll3d_9").mkdir()  # the staging folder of an export killed with -9
    backend.export_hf(tmp_path / "hf")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert not any(p.name.startswith(".hf") for p in tmp_path.iterdir())  # staging removed
    with torch.no_grad():
        logits = exported(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits[:, -7:-1]
    mask = batch["attention_mask"][:, -6:]
    expected = torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1))
    got = backend.compute_log_prob(batch)["log_probs"]
    torch.testing.assert_close(got, expected.squeeze(-1) * mask, atol=1e-5, rtol=0)
    # the model folder's tokenizer travels with the weights
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "hf" / name).read_bytes() == (tiny_model / name).read_bytes()


def model_without_tokenizer(tiny_model, folder):
    transformers.AutoModelForCausalLM.from_pretrained(tiny_model).save_pretrained(folder)
    return folder


def test_a_model_folder_without_tokenizer_exports_none(tiny_model, tmp_path):
    model_dir = model_without_tokenizer(tiny_model, tmp_path / "model")
    make_backend(make_recipe(model_dir)).export_hf(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert not (tmp_path / "hf" / "tokenizer.json").exists(), "none is invented"
    assert not (tmp_path / "hf" / "tokenizer_config.json").exists()


def test_export_copies_tokenizer_files_and_replaces_an_old_export(tiny_model, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    model_dir = model_without_tokenizer(tiny_model, tmp_path / "model")
    vocab = {f"t{i}": i for i in range(255)} | {"<unk>": 255}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")
    fast.save_pretrained(model_dir)
    target = tmp_path / "export"
    target.mkdir()
    (target / "stale.bin").write_text("from an older export")

    backend = make_backend(make_recipe(model_dir, dtype="bfloat16"))
    backend.export_hf(target)

    assert not (target / "stale.bin").exists()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (model_dir / name).read_bytes()
    assert json.loads((target / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(target)
    assert loaded.dtype == torch.bfloat16
    reloaded_tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(target)
    assert reloaded_tokenizer("t1 t2")["input_ids"] == fast("t1 t2")["input_ids"] == [1, 2]
    shutil.rmtree(target)
