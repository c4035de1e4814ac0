from __future__ import annotations

import threading

import pytest
import torch

from plugrl.data.batch import left_pad
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.rollout import SamplingParams
from plugrl.recipe import ModelConfig, Recipe, TrainerConfig
from plugrl_plugins.devices.cpu.device import CpuDevice
from plugrl_plugins.rollout.hf.config import HFRolloutConfig
from plugrl_plugins.rollout.hf.engine import HFRolloutEngine
from plugrl_plugins.rollout.hf.sampler import default_stop_token_ids

QUESTIONS = ["What is 12 + 34?", "What is 5 + 6? Show the columns.", "Hi", "What is 99 + 1?"]


def make_engine(model_dir, tokenizer, *, colocate=False, path="<dir>", **rollout):
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir) if path == "<dir>" else path, dtype="float32"),
        rollout=HFRolloutConfig(colocate=colocate, **rollout),
        trainer=TrainerConfig(seed=0),
    )
    return HFRolloutEngine(recipe, device=CpuDevice(), tokenizer=tokenizer)


def chat_prompts(tokenizer, questions=QUESTIONS) -> list[list[int]]:
    return [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]


def hf_generate(model, prompts, *, max_new_tokens, eos_token_id, pad_token_id) -> list[list[int]]:
    """Greedy ``model.generate`` on left-padded prompts; new tokens only, padding kept."""
    input_ids, mask = left_pad(prompts, pad_token_id)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
        )
    return output[:, input_ids.shape[1] :].tolist()


def teacher_forced_log_probs(model, prompt, response, temperature=1.0, top_k=0):
    """Log-probs of ``response`` after ``prompt`` from one plain forward pass (no cache, no
    padding), under the temperature-scaled (and top-k filtered) distribution."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def greedy(max_tokens=12, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)


# ------------------------------------------------------------------------------ registration


def test_hf_is_registered_with_its_config_class():
    from plugrl.plugins import PluginManager

    manager = PluginManager(environ={})
    manager.load_entry_points()
    entry = manager.registry("rollout_engines").get("hf")
    assert entry.load() is HFRolloutEngine
    assert entry.load_config() is HFRolloutConfig
    assert HFRolloutEngine.supports_interrupt


# ---------------------------------------------------------------------------------- sampling


def test_greedy_matches_model_generate(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    completions = engine.generate(prompts, greedy(max_tokens=16))
    expected = hf_generate(
        engine.model,
        prompts,
        max_new_tokens=16,
        eos_token_id=sorted(default_stop_token_ids(engine.model, tokenizer)),
        pad_token_id=engine.pad_token_id,
    )
    assert [c.prompt_index for c in completions] == [0, 1, 2, 3]
    for completion, reference in zip(completions, expected, strict=True):
        assert completion.token_ids == reference[: len(completion.token_ids)]
        if completion.finish_reason == "length":
            assert len(completion.token_ids) == 16


def test_rows_that_finish_early_leave_the_batch_and_outputs_still_match_generate(
    tiny_model_dir, tokenizer
):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    free_run = engine.generate(prompts, greedy(max_tokens=16))
    # stop at tokens the rows produce at different steps, so rows finish one after another
    stop_ids = sorted(
        {
            c.token_ids[min(step, len(c.token_ids) - 1)]
            for step, c in zip([1, 4, 7, 10], free_run, strict=True)
        }
    )
    calls: list[tuple[int, torch.Tensor]] = []

    def record(module, args, kwargs):
        calls.append((kwargs["input_ids"].shape[0], kwargs["attention_mask"].clone()))

    handle = engine.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        completions = engine.generate(prompts, greedy(max_tokens=16, stop_token_ids=stop_ids))
    finally:
        handle.remove()
    lengths = [len(c.token_ids) for c in completions]
    assert len(set(lengths)) > 1, "the stop ids should end rows at different steps"
    assert {c.finish_reason for c in completions if len(c.token_ids) < 16} == {"stop"}
    # forward k (k >= 1) feeds exactly the rows still running after k tokens
    assert [size for size, _ in calls] == [4] + [
        sum(length > k for length in lengths) for k in range(1, max(lengths))
    ]
    # no cache column is padding for every running row
    assert all(bool(mask[:, 0].any()) for _, mask in calls[1:])
    expected = hf_generate(
        engine.model,
        prompts,
        max_new_tokens=16,
        eos_token_id=sorted(default_stop_token_ids(engine.model, tokenizer) | set(stop_ids)),
        pad_token_id=engine.pad_token_id,
    )
    for completion, reference in zip(completions, expected, strict=True):
        assert completion.token_ids == reference[: len(completion.token_ids)]
        assert completion.token_ids[-1] in stop_ids or len(completion.token_ids) == 16


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.7, 0), (1.3, 20)])
def test_log_probs_equal_a_teacher_forced_forward(tiny_model_dir, tokenizer, temperature, top_k):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=temperature, top_k=top_k, max_tokens=10, seed=5)
    completions = engine.generate(prompts, params)
    assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2, 3, 3]
    for completion in completions:
        expected = teacher_forced_log_probs(
            engine.model,
            prompts[completion.prompt_index],
            completion.token_ids,
            temperature=temperature,
            top_k=top_k,
        )
        assert torch.allclose(torch.tensor(completion.log_probs), expected, atol=1e-4)


def test_greedy_log_probs_are_those_of_the_unscaled_model(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    for completion in engine.generate(prompts, greedy()):
        expected = teacher_forced_log_probs(
            engine.model, prompts[completion.prompt_index], completion.token_ids
        )
        assert torch.allclose(torch.tensor(completion.log_probs), expected, atol=1e-4)


def test_top_k_one_and_tiny_top_p_are_greedy(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    reference = [c.token_ids for c in engine.generate(prompts, greedy())]
    top_k = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, max_tokens=12))
    top_p = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=12))
    assert [c.token_ids for c in top_k] == reference
    assert [c.token_ids for c in top_p] == reference
    # a point mass: every sampled token had probability 1
    assert all(lp == pytest.approx(0.0, abs=1e-6) for c in top_k for lp in c.log_probs)


def test_stop_string_ends_the_response_at_the_token_that_completes_it(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)[:1]
    tokens = engine.generate(prompts, greedy(max_tokens=16))[0].token_ids
    decode = tokenizer.decode
    # a stop string spanning two tokens in the middle of the response
    stop = next(
        text
        for i in range(3, len(tokens))
        if (text := decode(tokens[i - 1 : i + 1])).strip() and "\ufffd" not in text
    )
    end = next(j for j in range(len(tokens)) if stop in decode(tokens[: j + 1]))
    completion = engine.generate(prompts, greedy(max_tokens=16, stop=[stop]))[0]
    assert completion.finish_reason == "stop"
    assert completion.token_ids == tokens[: end + 1]
    assert stop in decode(completion.token_ids)


def test_stop_token_is_kept_as_the_last_token(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)[:1]
    tokens = engine.generate(prompts, greedy(max_tokens=16))[0].token_ids
    first = tokens.index(tokens[5])
    completion = engine.generate(prompts, greedy(max_tokens=16, stop_token_ids=[tokens[5]]))[0]
    assert completion.token_ids == tokens[: first + 1]
    assert completion.finish_reason == "stop"


def test_n_samples_are_grouped_by_prompt_and_seeded(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)[:3]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=11)
    first = engine.generate(prompts, params)
    assert [c.prompt_index for c in first] == [0] * 4 + [1] * 4 + [2] * 4
    assert len({tuple(c.token_ids) for c in first[:4]}) > 1, "samples of a group should differ"
    again = engine.generate(prompts, params)
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    other_seed = engine.generate(
        prompts, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=12)
    )
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in first]
    # greedy samples of one prompt are all the same
    greedy_groups = engine.generate(prompts, SamplingParams(n=3, temperature=0.0, max_tokens=8))
    for group in range(3):
        assert len({tuple(c.token_ids) for c in greedy_groups[3 * group : 3 * group + 3]}) == 1


def test_unseeded_calls_follow_the_engine_generator(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8)
    runs = []
    for _ in range(2):
        engine = make_engine(tiny_model_dir, tokenizer)
        runs.append([[c.token_ids for c in engine.generate(prompts, params)] for _ in range(2)])
    assert runs[0] == runs[1], "two engines with the same trainer.seed sample the same"
    assert runs[0][0] != runs[0][1], "consecutive calls draw new samples"


def test_waves_of_max_num_seqs_give_the_same_result(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    one_wave = make_engine(tiny_model_dir, tokenizer).generate(prompts, greedy())
    small_waves = make_engine(tiny_model_dir, tokenizer, max_num_seqs=3).generate(
        prompts, SamplingParams(n=2, temperature=0.0, max_tokens=12)
    )
    assert [c.token_ids for c in small_waves] == [c.token_ids for c in one_wave for _ in range(2)]


def test_zero_max_tokens_returns_empty_responses(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    completions = engine.generate(chat_prompts(tokenizer)[:2], greedy(max_tokens=0))
    assert [(c.token_ids, c.finish_reason) for c in completions] == [([], "length")] * 2


def test_bad_sampling_parameters(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(ValueError) as info:
        engine.generate([[1, 2]], SamplingParams(n=0, top_p=0.0, temperature=-1))
    assert str(info.value) == (
        "bad sampling parameters: n must be >= 1, got 0; temperature must be >= 0, got -1; "
        "top_p must be in (0, 1], got 0.0"
    )
    with pytest.raises(ValueError, match=r"^prompt 1 is empty; every prompt needs at least one"):
        engine.generate([[1, 2], []], greedy())


# --------------------------------------------------------------------------------- interrupt


def test_interrupt_returns_what_in_flight_generation_has(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    started, interrupted = threading.Event(), threading.Event()
    forwards = 0

    def pause_after_three_steps(module, args, kwargs):
        nonlocal forwards
        forwards += 1
        if forwards == 3:
            started.set()
            interrupted.wait(timeout=10)

    handle = engine.model.register_forward_pre_hook(pause_after_three_steps, with_kwargs=True)
    result: list = []
    worker = threading.Thread(
        target=lambda: result.extend(
            engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_tokens=200, seed=1))
        )
    )
    try:
        worker.start()
        assert started.wait(timeout=10)
        engine.interrupt()
        interrupted.set()
        worker.join(timeout=10)
    finally:
        handle.remove()
    assert not worker.is_alive()
    assert len(result) == 8
    aborted = [c for c in result if c.finish_reason == "aborted"]
    assert aborted, "rows still running at the interrupt end as aborted"
    # three forward passes produced three tokens per running row before the flag was seen
    assert {len(c.token_ids) for c in aborted} == {3}
    assert all(len(c.log_probs) == len(c.token_ids) for c in result)
    # rows that met eos before the interrupt keep their own ending
    assert all(
        c.finish_reason == "stop" and len(c.token_ids) <= 3 for c in result if c not in aborted
    )
    # the flag does not outlive the interrupted call
    after = engine.generate(prompts, greedy(max_tokens=5))
    assert "aborted" not in {c.finish_reason for c in after}


def test_interrupt_with_nothing_in_flight_is_ignored(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    engine.interrupt()
    completions = engine.generate(chat_prompts(tokenizer), greedy(max_tokens=4))
    assert "aborted" not in {c.finish_reason for c in completions}


# ------------------------------------------------------------------------------------ weights


def test_update_weights_changes_outputs_and_sets_the_version(tiny_model_dir, tokenizer):
    from plugrl.quickstart.model import build_tiny_model

    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    before = [c.token_ids for c in engine.generate(prompts, greedy())]
    other = build_tiny_model(tokenizer, seed=1).eval()
    # named_parameters lists the tied lm_head once, under the embedding's name
    engine.update_weights(other.named_parameters(), version=3)
    assert engine.weight_version == 3
    after = engine.generate(prompts, greedy())
    assert [c.token_ids for c in after] != before
    assert {c.weight_version for c in after} == {3}
    expected = hf_generate(
        other,
        prompts,
        max_new_tokens=12,
        eos_token_id=sorted(default_stop_token_ids(other, tokenizer)),
        pad_token_id=engine.pad_token_id,
    )
    for completion, reference in zip(after, expected, strict=True):
        assert completion.token_ids == reference[: len(completion.token_ids)]
    assert engine.model is not other


def test_update_weights_rejects_unknown_names(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(PluginError) as info:
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))], version=1)
    assert str(info.value) == (
        f"update_weights got 'model.layers.9.mlp.up_proj.weight', which the rollout model of "
        f"{tiny_model_dir} does not have; push weights under Hugging Face names of the same "
        "architecture"
    )
    assert engine.weight_version == 0


def test_update_weights_rejects_wrong_shapes(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(PluginError) as info:
        engine.update_weights([("model.norm.weight", torch.zeros(128))], version=1)
    assert str(info.value) == (
        "update_weights got 'model.norm.weight' of shape (128,), the rollout model's is (256,); "
        "push full (unsharded) weights"
    )


def test_update_weights_rejects_a_partial_set(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(PluginError) as info:
        engine.update_weights([("model.norm.weight", torch.ones(256))], version=1)
    message = str(info.value)
    assert message.startswith("update_weights got 1 of ")
    assert message.endswith("more; push every weight with each version")
    assert engine.weight_version == 0


def test_separate_engine_needs_a_model_folder(tokenizer, tmp_path):
    with pytest.raises(RecipeError) as info:
        make_engine(None, tokenizer, path=None)
    assert str(info.value) == (
        "model.path: the hf rollout engine needs a model folder when rollout.colocate is false; "
        "set model.path"
    )
    missing = tmp_path / "missing"
    with pytest.raises(RecipeError) as info:
        make_engine(missing, tokenizer)
    assert str(info.value) == (
        f"model.path: {missing} is not a folder; set a local Hugging Face model folder"
    )


def test_model_dtype_comes_from_the_recipe(tiny_model_dir, tokenizer):
    recipe = Recipe(
        model=ModelConfig(path=str(tiny_model_dir), dtype="bfloat16"),
        rollout=HFRolloutConfig(colocate=False),
    )
    engine = HFRolloutEngine(recipe, device=CpuDevice(), tokenizer=tokenizer)
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    completions = engine.generate(chat_prompts(tokenizer)[:2], greedy(max_tokens=3))
    assert all(1 <= len(c.token_ids) <= 3 for c in completions)
    assert all(c.finish_reason in ("stop", "length") for c in completions)


# ----------------------------------------------------------------------------------- colocated


def test_bind_model_shares_the_live_module(tiny_model_dir, tokenizer, model):
    engine = make_engine(tiny_model_dir, tokenizer, colocate=True)
    assert engine.model is None
    with pytest.raises(RuntimeError, match=r"call bind_model\(model, version\) first"):
        engine.generate([[1, 2]], greedy())
    engine.bind_model(model, version=5)
    assert engine.model is model
    prompts = chat_prompts(tokenizer)
    model.train()
    before = engine.generate(prompts, greedy())
    assert model.training, "the trainer's mode is restored after generation"
    assert {c.weight_version for c in before} == {5}
    # a change made by the trainer, in place, is what the next generation sees
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(-1.0)
    after = engine.generate(prompts, greedy())
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    with pytest.raises(RuntimeError, match=r"there are no weights to push"):
        engine.update_weights(model.named_parameters(), version=6)
    engine.bind_model(model, version=6)
    assert engine.weight_version == 6


def test_rng_state_lets_a_resumed_engine_sample_the_same(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=6)
    original = make_engine(tiny_model_dir, tokenizer)
    original.generate(prompts, params)
    state = original.rng_state()
    expected = [c.token_ids for c in original.generate(prompts, params)]
    resumed = make_engine(tiny_model_dir, tokenizer)
    resumed.set_rng_state(state)
    assert [c.token_ids for c in resumed.generate(prompts, params)] == expected
