"""Model shapes from config.json: parameter counts by hand, shipped shapes, one-line errors."""

from __future__ import annotations

import json

import pytest

from plugrl.errors import RecipeError
from plugrl.plan import read_shape, shape_from_config
from plugrl.plan.shape import shape_name


def test_qwen25_05b_parameters_by_hand():
    shape = read_shape("qwen2.5-0.5b")
    h, i, v, layers = 896, 4864, 151936, 24
    q = h * h + h  # 14 heads x 64, with bias
    kv = 2 * (h * 128 + 128)  # 2 kv heads x 64, with bias
    o = h * h
    mlp = 3 * h * i
    norms = 2 * h
    layer = q + kv + o + mlp + norms
    assert shape.layer_parameters() == layer == 14_912_384
    # tied embeddings: the table once, and the final norm
    assert shape.parameters() == layers * layer + v * h + h
    # the count the GPU benchmark measured on the built model (bench/baselines/gpu-h200.json)
    assert shape.parameters() == 494_032_768


def test_qwen25_7b_parameters_by_hand():
    shape = read_shape("Qwen/Qwen2.5-7B-Instruct")
    h, i, v = 3584, 18944, 152064
    layer = (h * h + h) + 2 * (h * 512 + 512) + h * h + 3 * h * i + 2 * h
    assert shape.parameters() == 28 * layer + 2 * v * h + h == 7_615_616_512


def test_llama_70b_and_qwen_32b_shapes_read():
    assert read_shape("llama-3-70b").parameters() == pytest.approx(70.55e9, rel=0.01)
    assert read_shape("qwen2.5-32b").parameters() == pytest.approx(32.76e9, rel=0.01)
    assert shape_name("meta-llama/Meta-Llama-3.1-70B-Instruct") == "llama-3-70b"


def test_model_folder_config(tmp_path):
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = read_shape(tmp_path)
    # no bias for llama; untied: embedding and head
    layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert shape.parameters() == 2 * layer + 2 * 100 * 64 + 64
    assert shape.head_dim == 16 and shape.kv_width == 32


def test_bad_config_json_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RecipeError) as error:
        read_shape(tmp_path)
    assert "\n" not in str(error.value)
    assert "is not valid JSON" in str(error.value)


def test_missing_fields_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(RecipeError, match="lacks num_hidden_layers, num_attention_heads"):
        read_shape(tmp_path)


def test_mixture_of_experts_refused_in_one_line():
    with pytest.raises(RecipeError) as error:
        read_shape("qwen3-30b-a3b")
    message = str(error.value)
    assert "mixture-of-experts" in message and "not estimated" in message
    assert "\n" not in message


def test_unknown_path_lists_the_shipped_shapes():
    with pytest.raises(RecipeError, match=r"qwen2\.5-7b"):
        read_shape("nowhere/some-model")


def test_text_config_of_a_multimodal_model():
    config = {
        "text_config": {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        }
    }
    assert shape_from_config(config, "m", "m").hidden_size == 64
