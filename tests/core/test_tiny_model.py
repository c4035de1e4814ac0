"""The tiny-model builders of plugrl.testing: offline, reproducible from a seed, reloadable."""

from __future__ import annotations

import pytest
import torch

from plugrl.testing import make_tiny_model, make_tiny_tokenizer, save_tiny_model

SMALL = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}

TEXTS = [
    "What is 47 + 38?",
    "7 + 8 = 15, carry 1\n4 + 3 + 1 = 8\nAnswer: 85",
    "Hello, wörld!  tabs\tand\n\nnewlines 12345 ünïcödé 🙂 ½",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "   leading spaces and trailing   ",
]


def tensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0, **SMALL)


def test_the_folder_loads_offline_as_a_qwen2_model_and_tokenizer(tiny_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert model.config.model_type == "qwen2"
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == 381  # the default text's merges
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 2)
    assert model.config.tie_word_embeddings
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.config.eos_token_id == im_end and model.config.pad_token_id == endoftext
    assert model.generation_config.eos_token_id == [im_end, endoftext]
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"


def test_the_same_arguments_write_the_same_files(tiny_folder, tmp_path):
    again = save_tiny_model(tmp_path / "again", seed=0, **SMALL)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_folder / name).read_bytes(), name
    first, second = tensors(tiny_folder), tensors(again)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    other = tensors(save_tiny_model(tmp_path / "other", seed=1, **SMALL))
    name = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(other[name], first[name]), "another seed, other weights"


@pytest.mark.parametrize("texts", [None, TEXTS])
def test_token_ids_survive_save_and_reload(texts, tmp_path):
    from transformers import AutoTokenizer

    trained = make_tiny_tokenizer(texts)
    make_tiny_model(trained, **SMALL).save_pretrained(tmp_path)
    trained.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = trained(text, add_special_tokens=False)["input_ids"]
        assert reloaded(text, add_special_tokens=False)["input_ids"] == ids, text
        assert reloaded.decode(ids) == text
    special = reloaded.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert reloaded("<|im_start|>", add_special_tokens=False)["input_ids"] == [special[1]]
    assert len(reloaded("12345", add_special_tokens=False)["input_ids"]) == 5  # as Qwen2's


def test_the_tokenizer_learns_the_given_text_up_to_its_vocabulary():
    default = make_tiny_tokenizer()
    learned = make_tiny_tokenizer(TEXTS * 20, vocab_size=300)
    assert len(learned) == 300
    assert len(make_tiny_tokenizer(TEXTS * 20, vocab_size=259)) == 259  # bytes and specials
    carry = "7 + 8 = 15, carry 1"
    assert len(learned(carry)["input_ids"]) < len(default(carry)["input_ids"])


def test_building_leaves_the_process_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_tiny_model(vocab_size=300, seed=5, **SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_a_weight_spread_redraws_matrices_and_moves_every_vector():
    plain = make_tiny_model(vocab_size=300, **SMALL)
    spread = make_tiny_model(vocab_size=300, weight_std=0.5, **SMALL)
    plain_weights, spread_weights = dict(plain.state_dict()), dict(spread.state_dict())
    embedding, down = "model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"
    assert float(plain_weights[embedding].std()) < 0.05
    assert float(spread_weights[embedding].std()) == pytest.approx(0.5, rel=0.05)
    assert float(spread_weights[down].std()) == pytest.approx(0.5, rel=0.1)
    # norm scales start at one and biases at zero; spread, none stays there
    norm, bias = "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias"
    assert torch.equal(plain_weights[norm], torch.ones(32))
    assert torch.equal(plain_weights[bias], torch.zeros(32))
    assert not (spread_weights[norm] == 1).any() and not (spread_weights[bias] == 0).any()
    again = make_tiny_model(vocab_size=300, weight_std=0.5, **SMALL).state_dict()
    assert all(torch.equal(again[name], tensor) for name, tensor in spread_weights.items())


def test_a_spread_model_answers_prompts_differently():
    tokenizer = make_tiny_tokenizer()
    prompts = ["What is 1 + 2?", "Hello, world!", "The quick brown fox"]

    def greedy(model) -> list[list[int]]:
        answers = []
        for prompt in prompts:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            with torch.no_grad():
                out = model.generate(input_ids=ids, max_new_tokens=6, eos_token_id=None)
            answers.append(out[0, ids.shape[1] :].tolist())
        return answers

    flat = greedy(make_tiny_model(tokenizer, **SMALL))
    varied = greedy(make_tiny_model(tokenizer, weight_std=0.15, **SMALL))
    assert all(len(set(answer)) == 1 for answer in flat), "near-flat logits repeat one token"
    assert len({tuple(answer) for answer in varied}) == len(prompts)


def test_sizes_model_type_dtype_and_a_padded_vocabulary():
    tokenizer = make_tiny_tokenizer()
    model = make_tiny_model(
        tokenizer,
        vocab_size=512,
        dtype="bfloat16",
        model_type="qwen3",
        head_dim=16,
        tie_word_embeddings=False,
        **SMALL,
    )
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.bfloat16
    assert model.config.head_dim == 16 and not model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.shape == (512, 32)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: make_tiny_tokenizer(vocab_size=100),
            "vocab_size must be at least 259 (256 bytes and 3 special tokens), got 100",
        ),
        (lambda: make_tiny_model(**SMALL), "make_tiny_model needs a tokenizer or a vocab_size"),
        (
            lambda: make_tiny_model(make_tiny_tokenizer(), vocab_size=300),
            "vocab_size 300 is smaller than the tokenizer's 381 tokens",
        ),
        (
            lambda: make_tiny_model(vocab_size=300, weight_std=0.0),
            "weight_std must be a positive number or None, got 0.0",
        ),
        (
            lambda: make_tiny_model(vocab_size=300, dtype="float64"),
            "dtype must be one of float32, bfloat16, float16, got 'float64'",
        ),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message
