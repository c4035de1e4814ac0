"""Hugging Face <-> megatron weight mapping, tensor-parallel cuts, rank layout and packing:
plain torch, no megatron-core needed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("plugrl_megatron", reason="pip install -e plugins/backends/megatron")
from plugrl.errors import RecipeError
from plugrl_megatron import convert
from plugrl_megatron.batching import pack, token_budget_micro_batches
from plugrl_megatron.layout import grid_position
from plugrl_megatron.sharding import shard, unshard


def hf_model(kind: str, tie: bool = False):
    import transformers

    config_class = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    config = config_class(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=96,
        vocab_size=128,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(("kind", "tie"), [("qwen2", False), ("qwen3", False), ("qwen2", True)])
def test_weights_go_to_megatron_and_back_unchanged(kind, tie):
    model = hf_model(kind, tie)
    hf_state = {k: v for k, v in model.state_dict().items() if not (tie and k == "lm_head.weight")}
    megatron = convert.from_hf(model.config, hf_state)
    assert list(megatron) == convert.megatron_names(model.config)
    back = [pair for name, t in megatron.items() for pair in convert.to_hf(model.config, name, t)]
    assert [name for name, _ in back] == convert.hf_names(model.config)
    assert sorted(hf_state) == sorted(convert.hf_names(model.config))
    for name, tensor in back:
        assert torch.equal(tensor, hf_state[name]), name
    shapes = dict(convert.hf_shapes(model.config))
    assert {name: tuple(t.shape) for name, t in hf_state.items()} == shapes


def test_fused_qkv_interleaves_each_key_value_group():
    model = hf_model("qwen2")
    config = model.config  # 8 query heads of 8 in 2 groups: 4 query heads per group
    size = convert.head_dim(config)
    q = torch.arange(8 * size).float()
    k = 1000 + torch.arange(2 * size).float()
    v = 2000 + torch.arange(2 * size).float()
    fused = convert.fuse_qkv(config, q, k, v).reshape(2, 6, size)
    assert torch.equal(fused[0, :4].flatten(), q[: 4 * size])
    assert torch.equal(fused[0, 4], k[:size])
    assert torch.equal(fused[0, 5], v[:size])
    assert torch.equal(fused[1, :4].flatten(), q[4 * size :])


def test_an_unsupported_model_type_is_named_with_the_fix():
    import transformers

    with pytest.raises(RecipeError) as error:
        convert.check_supported(transformers.LlamaConfig())
    assert str(error.value) == (
        "model.path: model type 'llama' is not supported by the megatron backend (it converts "
        "qwen2 and qwen3 dense models; Llama, Mistral, Gemma, DeepSeek and mixture-of-experts "
        "models are not converted yet); use actor.backend: fsdp2 for this model"
    )


def test_a_vision_language_model_is_refused_in_one_line():
    import transformers

    with pytest.raises(RecipeError) as error:
        convert.check_supported(transformers.Qwen2_5_VLConfig())
    assert str(error.value) == (
        "model.path: model type 'qwen2_5_vl' is a vision-language model, which the megatron "
        "backend does not train; use actor.backend: fsdp2 for this model"
    )


@pytest.mark.parametrize(
    ("name", "dim"),
    [
        ("decoder.layers.0.mlp.linear_fc1.weight", 0),
        ("decoder.layers.0.self_attention.linear_qkv.weight", 0),
        ("decoder.layers.0.self_attention.linear_proj.weight", 1),
    ],
)
def test_tensor_parallel_pieces_join_back_to_the_whole(name, dim):
    whole = torch.randn(8, 12) if dim == 0 else torch.randn(6, 8)
    pieces = [shard(name, whole, dim, rank, 2) for rank in range(2)]
    assert torch.equal(unshard(name, pieces, dim), whole)


def test_a_gated_fc1_piece_holds_its_gate_slice_above_its_up_slice():
    gate, up = torch.arange(4.0)[:, None], 10 + torch.arange(4.0)[:, None]
    piece = shard("decoder.layers.0.mlp.linear_fc1.weight", torch.cat([gate, up]), 0, 1, 2)
    assert piece.flatten().tolist() == [2.0, 3.0, 12.0, 13.0]


def test_an_uneven_tensor_parallel_cut_is_refused():
    with pytest.raises(ValueError, match="cannot be split evenly over 4 tensor-parallel ranks"):
        shard("decoder.layers.0.self_attention.linear_proj.weight", torch.ones(2, 6), 1, 0, 4)


def test_rank_layout_follows_megatron_order_and_names_the_output_ranks():
    # 8 ranks, tp 2, pp 2: tensor parallelism fastest, pipeline stages slowest
    positions = [grid_position(rank, 8, tp=2, pp=2, cp=1) for rank in range(8)]
    assert [p.tp_rank for p in positions] == [0, 1] * 4
    assert [p.dp_rank for p in positions] == [0, 0, 1, 1] * 2
    assert [p.pp_rank for p in positions] == [0] * 4 + [1] * 4
    assert [rank for rank, p in enumerate(positions) if p.is_output_rank] == [4, 6]


def test_a_rank_count_that_does_not_fit_the_model_parallel_sizes_is_refused():
    with pytest.raises(RecipeError, match=r"make the role's rank count a multiple of 4$"):
        grid_position(0, 6, tp=2, pp=2, cp=1)


def test_packing_moves_attended_tokens_left_and_points_at_the_predicting_positions():
    # prompt width 4 (left-padded), response width 3 (right-padded)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    layout = pack(mask, response_width=3)
    assert layout.columns[0, :4].tolist() == [2, 3, 4, 5]
    assert layout.columns[1, :5].tolist() == [0, 1, 2, 3, 4]
    assert layout.used == 2
    # row 0: 2 prompt tokens, so packed position 1 predicts the first response token
    assert layout.predict.tolist() == [[1, 2], [3, 4]]
    assert pack(mask, 3, multiple=4).width == 8


def test_token_budget_micro_batches_keep_each_within_the_budget():
    plans = token_budget_micro_batches([5, 9, 3, 9, 2], max_tokens=18)
    assert sorted(row for plan in plans for row in plan) == [0, 1, 2, 3, 4]
    lengths = [5, 9, 3, 9, 2]
    for plan in plans:
        assert len(plan) * max(lengths[row] for row in plan) <= 18 or len(plan) == 1
