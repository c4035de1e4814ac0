from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from plugrl.data.batch import left_pad
from plugrl.errors import PluginError, RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import (
    Capability,
    GenerationRequest,
    SamplingParams,
    WeightMeta,
    run_blocking,
)
from plugrl.recipe import ClusterConfig, ModelConfig, Recipe, TrainerConfig
from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from plugrl_hf.sampler import default_stop_token_ids

QUESTIONS = ["What is 12 + 34?", "What is 5 + 6? Show the columns.", "Hi", "What is 99 + 1?"]


def make_engine(
    model_dir,
    tokenizer,
    *,
    colocate=False,
    path="<dir>",
    dtype="float32",
    cluster="local",
    **rollout,
):
    config = HFRolloutConfig(colocate=colocate, **rollout)
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir) if path == "<dir>" else path, dtype=dtype),
        rollout=config,
        trainer=TrainerConfig(seed=0),
        cluster=ClusterConfig(mode=cluster),
    )
    context = PartContext(
        recipe=recipe, device=CpuDevice(), tokenizer=tokenizer, model_from_trainer=colocate
    )
    return HFRolloutEngine(config, context)


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


def assert_teacher_forced(model, prompt, completion, **kwargs):
    expected = teacher_forced_log_probs(model, prompt, completion.token_ids, **kwargs)
    assert torch.allclose(torch.tensor(completion.log_probs), expected, atol=1e-4)


def greedy(max_tokens=12, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)


def request(request_id, prompt, **params) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, prompt_ids=prompt, params=SamplingParams(**params)
    )


def alone(model_dir, tokenizer, req: GenerationRequest):
    """What ``req`` gives on a fresh engine with nothing beside it."""
    engine = make_engine(model_dir, tokenizer)
    return asyncio.run(engine.generate_request(req))


def perturbed_state(model, seed=1) -> dict[str, torch.Tensor]:
    """Other weights of the same architecture (``model`` is left as it is)."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 0.1 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in model.state_dict().items()
    }


def metas(weights: dict[str, torch.Tensor]) -> list[WeightMeta]:
    return [WeightMeta(name, tuple(t.shape), "float32") for name, t in weights.items()]


async def push(engine, weights: dict[str, torch.Tensor], version: int, bucket: int = 7):
    await engine.begin_weight_update(version, metas(weights))
    items = list(weights.items())
    for begin in range(0, len(items), bucket):
        await engine.load_weights(items[begin : begin + bucket])
    await engine.finish_weight_update()


class Forwards:
    """The model's forward calls: rows, columns fed, and the attention mask."""

    def __init__(self, model) -> None:
        self.calls: list[tuple[int, int, torch.Tensor]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        ids = kwargs["input_ids"]
        self.calls.append((ids.shape[0], ids.shape[1], kwargs["attention_mask"]))

    @property
    def decode_sizes(self) -> list[int]:
        return [rows for rows, columns, _ in self.calls if columns == 1]

    @property
    def prompt_passes(self) -> list[tuple[int, int]]:
        return [(rows, columns) for rows, columns, _ in self.calls if columns > 1]

    def close(self) -> None:
        self.handle.remove()


async def until(condition, limit=100_000):
    """Yield to the engine's decode loop until ``condition()`` holds."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


# ------------------------------------------------------------------------------ registration


def test_hf_is_registered_with_its_config_class_and_capabilities():
    from plugrl.plugin.manager import PluginManager

    manager = PluginManager(environ={})
    manager.load_entry_points()
    entry = manager.registry("rollout_engines").get("hf")
    assert entry.load() is HFRolloutEngine
    assert entry.load_config() is HFRolloutConfig
    assert HFRolloutEngine.capabilities == set(Capability)


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
    assert len({c.request_id for c in completions}) == 4, "one request per prompt"
    for completion, reference in zip(completions, expected, strict=True):
        assert completion.token_ids == reference[: len(completion.token_ids)]
        assert completion.token_versions == [0] * len(completion.token_ids)
        if completion.finish_reason == "length":
            assert len(completion.token_ids) == 16


def test_rows_that_finish_leave_the_batch_and_outputs_still_match_generate(
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
    forwards = Forwards(engine.model)
    try:
        completions = engine.generate(prompts, greedy(max_tokens=16, stop_token_ids=stop_ids))
    finally:
        forwards.close()
    lengths = [len(c.token_ids) for c in completions]
    assert len(set(lengths)) > 1, "the stop ids should end rows at different steps"
    assert {c.finish_reason for c in completions if len(c.token_ids) < 16} == {"stop"}
    # one prompt pass, then step k feeds exactly the rows that have not finished after k tokens
    assert [rows for rows, _ in forwards.prompt_passes] == [4]
    assert forwards.decode_sizes == [sum(n > k for n in lengths) for k in range(max(lengths))]
    # the model gets a ready 4D mask (additive: 0 where a row attends), and no column is
    # padding for every running row
    decode_masks = [mask for _, columns, mask in forwards.calls if columns == 1]
    assert all(mask.dim() == 4 and bool((mask[:, 0, 0, 0] == 0).any()) for mask in decode_masks)
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


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.9)]
)
def test_log_probs_equal_a_teacher_forced_forward(
    tiny_model_dir, tokenizer, temperature, top_k, top_p
):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(
        n=2, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=10, seed=5
    )
    completions = engine.generate(prompts, params)
    assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2, 3, 3]
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        if top_p < 1.0:
            # top-p keeps a renormalised part of the distribution: the log-probs are at least
            # the model's, and equal to it for the most likely token
            full = teacher_forced_log_probs(engine.model, prompt, completion.token_ids)
            assert all(
                lp >= f - 1e-4 for lp, f in zip(completion.log_probs, full.tolist(), strict=True)
            )
            assert any(
                lp > f + 1e-3 for lp, f in zip(completion.log_probs, full.tolist(), strict=True)
            )
        else:
            assert_teacher_forced(
                engine.model, prompt, completion, temperature=temperature, top_k=top_k
            )


def test_scored_tokens_get_the_unscaled_models_log_probs(tiny_model_dir, tokenizer):
    """A distillation teacher's scores: whatever a response was sampled with, score_tokens
    gives the model's own log-probs of its tokens (temperature 1, nothing filtered)."""
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=1, temperature=0.7, top_k=5, max_tokens=10, seed=5)
    for prompt, completion in zip(prompts, engine.generate(prompts, params), strict=True):
        scored = run_blocking(engine.score_tokens(prompt, completion.token_ids))
        expected = teacher_forced_log_probs(engine.model, prompt, completion.token_ids)
        assert scored == pytest.approx(expected.tolist(), abs=1e-5)
    assert run_blocking(engine.score_tokens(prompts[0], [])) == []
    with pytest.raises(ValueError, match="empty prompt"):
        run_blocking(engine.score_tokens([], [5]))


def test_greedy_log_probs_are_those_of_the_unscaled_model(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    for completion in engine.generate(prompts, greedy()):
        assert_teacher_forced(engine.model, prompts[completion.prompt_index], completion)


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


def test_a_token_of_probability_zero_is_never_sampled(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=8, temperature=1.0, top_k=3, max_tokens=12, seed=0)
    completions = engine.generate(prompts, params)
    for completion in completions:
        ids = torch.tensor([prompts[completion.prompt_index] + completion.token_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0, -len(completion.token_ids) - 1 : -1]
        top3 = torch.topk(logits, 3, dim=-1).indices
        assert all(t in row for t, row in zip(completion.token_ids, top3.tolist(), strict=True))


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


def test_n_samples_share_one_prompt_pass_and_are_seeded(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)[:3]
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=11)
    forwards = Forwards(engine.model)
    try:
        first = engine.generate(prompts, params)
    finally:
        forwards.close()
    assert forwards.prompt_passes[0][0] == 3, "one prompt pass row per prompt, not per sample"
    assert forwards.decode_sizes[0] == 12
    assert [c.prompt_index for c in first] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c.sample_index for c in first] == [0, 1, 2, 3] * 3
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


def test_unseeded_requests_follow_the_engine_generator(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=8)
    runs = []
    for _ in range(2):
        engine = make_engine(tiny_model_dir, tokenizer)
        runs.append([[c.token_ids for c in engine.generate(prompts, params)] for _ in range(2)])
    assert runs[0] == runs[1], "two engines with the same trainer.seed sample the same"
    assert runs[0][0] != runs[0][1], "consecutive calls draw new samples"


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


def test_zero_max_tokens_returns_empty_responses(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    completions = engine.generate(chat_prompts(tokenizer)[:2], greedy(max_tokens=0))
    assert [(c.token_ids, c.finish_reason) for c in completions] == [([], "length")] * 2


def test_bad_sampling_parameters_and_empty_prompts(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(ValueError) as info:
        engine.generate([[1, 2]], SamplingParams(n=0, top_p=0.0, temperature=-1, top_k=-2))
    assert str(info.value) == (
        "bad sampling parameters: n must be >= 1, got 0; temperature must be >= 0, got -1; "
        "top_p must be in (0, 1], got 0.0; top_k must be -1 (off), 0 (off) or > 0, got -2"
    )
    with pytest.raises(ValueError) as info:
        asyncio.run(engine.generate_request(request("r", [1], n=1, max_tokens=-1)))
    assert str(info.value) == "bad sampling parameters: max_tokens must be >= 0, got -1"
    with pytest.raises(ValueError, match=r"^the prompt of request '\S+' is empty; every prompt"):
        engine.generate([[1, 2], []], greedy())
    with pytest.raises(ValueError) as info:
        asyncio.run(engine.generate_request(request("r7", [], n=1)))
    assert str(info.value) == (
        "the prompt of request 'r7' is empty; every prompt needs at least one token"
    )


# ------------------------------------------------------------------- continuous batching


def test_a_seeded_request_samples_the_same_alone_and_amid_others(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    target = request("target", prompts[1], n=3, temperature=1.0, top_k=40, max_tokens=20, seed=7)
    by_itself = alone(tiny_model_dir, tokenizer, target)

    async def crowded():
        # another engine, a small batch, different neighbours, and the target joins late
        engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=4)
        others = [
            engine.generate_request(request(f"o{i}", p, n=2, temperature=0.8, max_tokens=9 + i))
            for i, p in enumerate(prompts)
        ]
        first = asyncio.gather(*others)
        await asyncio.sleep(0)
        await until(lambda: engine._batch is not None and len(engine._batch.rows) == 4)
        for _ in range(3):
            await asyncio.sleep(0)
        result = await engine.generate_request(target)
        await first
        return result

    amid = asyncio.run(crowded())
    assert [c.token_ids for c in amid] == [c.token_ids for c in by_itself]
    for a, b in zip(amid, by_itself, strict=True):
        assert a.sample_index == b.sample_index
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)


def test_a_waiting_request_joins_as_soon_as_a_slot_frees(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    requests = [
        request(f"r{i}", prompts[i % 4], n=1 + i % 2, temperature=1.0, max_tokens=4 + 3 * i, seed=i)
        for i in range(6)
    ]
    engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=3)
    forwards = Forwards(engine.model)

    async def all_at_once():
        return await asyncio.gather(*(engine.generate_request(r) for r in requests))

    try:
        outputs = asyncio.run(all_at_once())
    finally:
        forwards.close()
    # replay the schedule: samples join in order the moment a slot frees
    queue = [len(c.token_ids) for completions in outputs for c in completions]
    running: list[int] = []
    sizes, joins = [], []
    while queue or running:
        joining = 0
        while queue and len(running) < 3:
            running.append(queue.pop(0))
            joining += 1
        if joining:
            joins.append(len(sizes))
        sizes.append(len(running))
        running = [left - 1 for left in running if left > 1]
    assert forwards.decode_sizes == sizes
    assert len(sizes) > 9 and sizes.count(3) > 5
    # a prompt pass right before each step where samples joined
    passes_before_step = []
    step = 0
    for _, columns, _ in forwards.calls:
        if columns == 1:
            step += 1
        elif not passes_before_step or passes_before_step[-1] != step:
            passes_before_step.append(step)
    assert passes_before_step == joins
    for req, completions in zip(requests, outputs, strict=True):
        assert [c.token_ids for c in completions] == [
            c.token_ids for c in alone(tiny_model_dir, tokenizer, req)
        ]
        assert all(c.request_id == req.request_id for c in completions)


def test_many_concurrent_requests_on_one_loop(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=16)
    requests = [
        request(
            f"r{i}",
            prompts[i % 4],
            n=1 + i % 3,
            temperature=[0.0, 1.0, 0.6][i % 3],
            top_k=[-1, 0, 50][i % 3],
            top_p=[1.0, 0.95, 1.0][i % 3],
            max_tokens=3 + i % 7,
            seed=100 + i,
        )
        for i in range(24)
    ]

    async def main():
        return await asyncio.gather(*(engine.generate_request(r) for r in requests))

    outputs = asyncio.run(main())
    assert engine._task is None or engine._task.done(), "the decode loop ends when idle"
    for req, completions in zip(requests, outputs, strict=True):
        assert [c.sample_index for c in completions] == list(range(req.params.n))
        assert all(1 <= len(c.token_ids) <= req.params.max_tokens for c in completions)
        if req.params.temperature == 0:
            assert_teacher_forced(engine.model, req.prompt_ids, completions[0])
    # the blocking form gives the same as requests sent one by one
    assert [[c.token_ids for c in completions] for completions in outputs[:4]] == [
        [c.token_ids for c in asyncio.run(engine.generate_request(r))] for r in requests[:4]
    ]


def test_two_batches_at_once_on_one_engine(tiny_model_dir, tokenizer):
    # generate_batch names its requests batch-0, batch-1, ...: two batches in flight reuse ids
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)

    async def main():
        return await asyncio.gather(
            engine.generate_batch(prompts[:2], greedy(max_tokens=6)),
            engine.generate_batch(prompts[2:], greedy(max_tokens=6)),
        )

    first, second = asyncio.run(main())
    expected = engine.generate(prompts, greedy(max_tokens=6))
    assert [c.token_ids for c in first + second] == [c.token_ids for c in expected]


def test_common_prompt_start_is_computed_once_for_rows_joining_together(tiny_model_dir, tokenizer):
    # twelve prompts sharing a long start (the chat template and a system message)
    system = "You are a careful assistant. Work column by column and end with the answer."
    questions = [f"What is {a} + {b}?" for a, b in zip(range(10, 22), range(40, 52), strict=True)]
    prompts = [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": system}, {"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=False,
            ),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]
    params = SamplingParams(temperature=1.0, max_tokens=6, seed=3)
    engine = make_engine(tiny_model_dir, tokenizer)
    forwards = Forwards(engine.model)
    try:
        together = engine.generate(prompts, params)
    finally:
        forwards.close()
    common = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    longest = max(map(len, prompts))
    # one row for the shared start, then the rest of every prompt but its last token
    assert forwards.prompt_passes == [(1, common), (12, longest - common - 1)]
    one_by_one = make_engine(tiny_model_dir, tokenizer, max_num_seqs=1).generate(prompts, params)
    assert [c.token_ids for c in together] == [c.token_ids for c in one_by_one]
    for completion in together:
        assert_teacher_forced(engine.model, prompts[completion.prompt_index], completion)


# --------------------------------------------------------------------- abort, pause, resume


def test_abort_ends_some_requests_while_others_finish(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    requests = [
        request(f"r{i}", prompts[i], n=2, temperature=1.0, max_tokens=25, seed=i) for i in range(4)
    ]
    engine = make_engine(tiny_model_dir, tokenizer)
    forwards = Forwards(engine.model)

    async def main():
        tasks = [asyncio.ensure_future(engine.generate_request(r)) for r in requests]
        await until(lambda: len(forwards.decode_sizes) == 5)
        await engine.abort(["r1", "r3", "unknown"])
        return await asyncio.gather(*tasks)

    try:
        outputs = asyncio.run(main())
    finally:
        forwards.close()
    for i, (req, completions) in enumerate(zip(requests, outputs, strict=True)):
        reference = alone(tiny_model_dir, tokenizer, req)
        for completion, expected in zip(completions, reference, strict=True):
            assert_teacher_forced(engine.model, req.prompt_ids, completion)
            if i in (1, 3) and len(expected.token_ids) > 5:
                assert completion.finish_reason == "aborted"
                assert completion.token_ids == expected.token_ids[:5]
            else:
                assert completion.token_ids == expected.token_ids
                assert completion.finish_reason == expected.finish_reason != "aborted"
    assert any(c.finish_reason == "aborted" for c in outputs[1] + outputs[3])
    assert not engine._in_flight and not engine._batch.rows


def test_abort_of_a_request_that_has_not_joined_yet(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=2)

    async def main():
        running = asyncio.ensure_future(
            engine.generate_request(request("a", prompts[0], n=2, temperature=1.0, max_tokens=20))
        )
        waiting = asyncio.ensure_future(
            engine.generate_request(request("b", prompts[1], n=3, max_tokens=20))
        )
        await until(lambda: engine._batch is not None and len(engine._batch.rows) == 2)
        await engine.abort(["b"])
        return await running, await waiting

    running, waiting = asyncio.run(main())
    assert [(c.token_ids, c.finish_reason, c.sample_index) for c in waiting] == [
        ([], "aborted", 0),
        ([], "aborted", 1),
        ([], "aborted", 2),
    ]
    assert all(c.finish_reason != "aborted" for c in running)


def test_pause_abort_ends_everything_in_flight_and_later_requests_wait(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    engine = make_engine(tiny_model_dir, tokenizer, max_num_seqs=2)
    forwards = Forwards(engine.model)

    async def main():
        first = asyncio.ensure_future(
            engine.generate_request(request("a", prompts[0], n=2, temperature=1.0, max_tokens=30))
        )
        queued = asyncio.ensure_future(
            engine.generate_request(request("b", prompts[1], max_tokens=30))
        )
        await until(lambda: len(forwards.decode_sizes) == 3)
        await engine.pause("abort")
        ended = await asyncio.gather(first, queued)
        later = asyncio.ensure_future(
            engine.generate_request(request("c", prompts[2], max_tokens=4))
        )
        for _ in range(20):
            await asyncio.sleep(0)
        assert not later.done() and len(forwards.decode_sizes) == 3, "nothing runs while paused"
        await engine.resume()
        return ended, await later

    try:
        (first, queued), later = asyncio.run(main())
    finally:
        forwards.close()
    assert [(len(c.token_ids), c.finish_reason) for c in first] == [(3, "aborted")] * 2
    assert [(c.token_ids, c.finish_reason) for c in queued] == [([], "aborted")]
    assert later[0].finish_reason in ("stop", "length") and later[0].token_ids


def test_pause_keep_holds_rows_and_resume_continues_them(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    requests = [
        request(f"r{i}", p, n=2, temperature=1.0, max_tokens=15, seed=i)
        for i, p in enumerate(prompts)
    ]
    engine = make_engine(tiny_model_dir, tokenizer)
    forwards = Forwards(engine.model)

    async def main():
        tasks = asyncio.gather(*(engine.generate_request(r) for r in requests))
        await until(lambda: len(forwards.decode_sizes) == 4)
        await engine.pause("keep")
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(forwards.decode_sizes) == 4, "no step while paused"
        # a request sent while paused waits, then joins
        late = asyncio.ensure_future(
            engine.generate_request(request("late", prompts[0], max_tokens=5))
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert not late.done()
        await engine.resume()
        return await tasks, await late

    try:
        outputs, late = asyncio.run(main())
    finally:
        forwards.close()
    for req, completions in zip(requests, outputs, strict=True):
        assert [c.token_ids for c in completions] == [
            c.token_ids for c in alone(tiny_model_dir, tokenizer, req)
        ]
    assert late[0].token_ids


def test_a_caller_that_gives_up_takes_its_request_out(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    engine = make_engine(tiny_model_dir, tokenizer)
    forwards = Forwards(engine.model)

    async def main():
        running = asyncio.ensure_future(
            engine.generate_request(request("running", prompts[0], max_tokens=50))
        )
        await until(lambda: len(forwards.decode_sizes) == 2)
        running.cancel()
        await asyncio.sleep(0)
        assert running.cancelled()
        assert not engine._in_flight and not engine._batch.rows
        await engine.pause()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                engine.generate_request(request("waiting", prompts[0], max_tokens=5)), 0.01
            )
        assert not engine._in_flight and not engine._waiting
        await engine.resume()
        return await engine.generate_request(request("next", prompts[1], max_tokens=3))

    try:
        assert len(asyncio.run(main())[0].token_ids) <= 3
    finally:
        forwards.close()


def test_requests_left_on_a_closed_loop_do_not_break_the_next_loop(tiny_model_dir, tokenizer):
    prompts = chat_prompts(tokenizer)
    engine = make_engine(tiny_model_dir, tokenizer)
    longest = max(engine.generate(prompts, greedy(max_tokens=8)), key=lambda c: len(c.token_ids))
    later = [prompts[longest.prompt_index]]
    reference = engine.generate(later, greedy(max_tokens=8))
    forwards = Forwards(engine.model)
    loop = asyncio.new_event_loop()

    async def start():
        task = asyncio.ensure_future(
            engine.generate_request(request("old", prompts[0], max_tokens=4))
        )
        await until(lambda: len(forwards.decode_sizes) == 2)
        return task

    try:
        abandoned = loop.run_until_complete(start())
        loop.close()  # without finishing (or cancelling) the request's task
        after = engine.generate(later, greedy(max_tokens=8))
    finally:
        forwards.close()
    assert not abandoned.done()
    # the new request outlives the old one, which ends on the new loop
    assert len(reference[0].token_ids) > 2
    assert [c.token_ids for c in after] == [c.token_ids for c in reference]
    assert not engine._in_flight


def test_a_failing_forward_fails_the_requests_and_the_engine_carries_on(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)

    def broken(module, args, kwargs):
        raise RuntimeError("out of memory (simulated)")

    handle = engine.model.register_forward_pre_hook(broken, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match=r"out of memory \(simulated\)"):
            asyncio.run(asyncio.wait_for(engine.generate_batch(prompts, greedy()), 30))
    finally:
        handle.remove()
    assert not engine._in_flight
    assert len(engine.generate(prompts, greedy(max_tokens=3))) == 4


# ------------------------------------------------------------------------------------ weights


def test_weight_update_changes_outputs_and_sets_the_version(tiny_model_dir, tokenizer, model):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    before = [c.token_ids for c in engine.generate(prompts, greedy())]
    other = model
    other.load_state_dict(perturbed_state(model))
    # named_parameters lists the tied lm_head once, under the embedding's name
    weights = {name: p.detach() for name, p in other.named_parameters()}
    asyncio.run(push(engine, weights, version=3))
    assert engine.weight_version == 3
    after = engine.generate(prompts, greedy())
    assert [c.token_ids for c in after] != before
    assert {c.weight_version for c in after} == {3}
    assert all(c.token_versions == [3] * len(c.token_ids) for c in after)
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
    assert (
        engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    )


def test_partial_rollout_continues_rows_with_the_new_weights(tiny_model_dir, tokenizer, model):
    prompts = chat_prompts(tokenizer)
    requests = [
        request(f"r{i}", p, n=2, temperature=1.0, max_tokens=24, seed=i)
        for i, p in enumerate(prompts)
    ]
    engine = make_engine(tiny_model_dir, tokenizer)
    old = model
    new_weights = perturbed_state(model, seed=4)
    forwards = Forwards(engine.model)
    switch = 6

    async def main():
        tasks = asyncio.gather(*(engine.generate_request(r) for r in requests))
        await until(lambda: len(forwards.decode_sizes) == switch)
        await engine.pause("keep")
        # every weight, including both names of the tied embedding, in several buckets
        await push(engine, new_weights, version=1, bucket=5)
        assert len(forwards.decode_sizes) == switch, "no token while the weights change"
        await engine.resume()
        return await tasks

    try:
        outputs = asyncio.run(main())
    finally:
        forwards.close()
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    new.load_state_dict(new_weights)
    continued = 0
    for req, completions in zip(requests, outputs, strict=True):
        for c in completions:
            prompt = list(req.prompt_ids)
            if len(c.token_ids) <= switch:
                assert c.token_versions == [0] * len(c.token_ids)
                continue
            continued += 1
            assert c.token_versions == [0] * switch + [1] * (len(c.token_ids) - switch)
            assert c.weight_version == 1
            before = teacher_forced_log_probs(old, prompt, c.token_ids[:switch])
            after = teacher_forced_log_probs(new, prompt, c.token_ids)[switch:]
            assert torch.allclose(torch.tensor(c.log_probs[:switch]), before, atol=1e-4)
            assert torch.allclose(torch.tensor(c.log_probs[switch:]), after, atol=1e-4)
            # and not the other way round: the weights really changed at the switch
            assert not torch.allclose(
                torch.tensor(c.log_probs[switch:]),
                teacher_forced_log_probs(old, prompt, c.token_ids)[switch:],
                atol=1e-2,
            )
    assert continued >= 4


def test_weight_update_without_pause_waits_between_tokens(tiny_model_dir, tokenizer, model):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    forwards = Forwards(engine.model)
    new_weights = perturbed_state(model, seed=5)

    async def main():
        task = asyncio.ensure_future(
            engine.generate_request(
                request("r", prompts[0], temperature=1.0, max_tokens=20, seed=1)
            )
        )
        await until(lambda: len(forwards.decode_sizes) == 3)
        await engine.begin_weight_update(2, metas(new_weights))
        await engine.load_weights(list(new_weights.items())[:4])
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(forwards.decode_sizes) == 3, "generation waits for finish_weight_update"
        await engine.load_weights(list(new_weights.items())[4:])
        await engine.finish_weight_update()
        return await task

    try:
        (completion,) = asyncio.run(main())
    finally:
        forwards.close()
    n = len(completion.token_ids)
    assert n > 3
    assert completion.token_versions == [0] * 3 + [2] * (n - 3)


def test_begin_weight_update_rejects_unknown_names(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    bad = [WeightMeta("model.layers.9.mlp.up_proj.weight", (1,), "float32")]
    with pytest.raises(PluginError) as info:
        asyncio.run(engine.begin_weight_update(1, bad))
    assert str(info.value) == (
        "begin_weight_update announced 'model.layers.9.mlp.up_proj.weight', which the rollout "
        f"model of {tiny_model_dir} does not have; push weights under Hugging Face names of the "
        "same architecture"
    )
    assert engine.weight_version == 0
    assert engine.generate(chat_prompts(tokenizer)[:1], greedy(max_tokens=2))


def test_begin_weight_update_rejects_wrong_shapes(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(PluginError) as info:
        asyncio.run(
            engine.begin_weight_update(1, [WeightMeta("model.norm.weight", (128,), "float32")])
        )
    assert str(info.value) == (
        "begin_weight_update announced 'model.norm.weight' of shape (128,), the rollout model's "
        "is (256,); push full (unsharded) weights"
    )


def test_begin_weight_update_rejects_a_partial_set(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    with pytest.raises(PluginError) as info:
        asyncio.run(
            engine.begin_weight_update(1, [WeightMeta("model.norm.weight", (256,), "float32")])
        )
    message = str(info.value)
    assert message.startswith("begin_weight_update announced 1 of ")
    assert message.endswith("more; push every weight with each version")
    assert engine.weight_version == 0


def test_weights_that_do_not_arrive_are_an_error_and_block_generation(
    tiny_model_dir, tokenizer, model
):
    engine = make_engine(tiny_model_dir, tokenizer)
    weights = {name: p.detach() for name, p in model.named_parameters()}
    prompts = chat_prompts(tokenizer)[:1]

    async def incomplete():
        await engine.begin_weight_update(1, metas(weights))
        with pytest.raises(PluginError) as info:
            await engine.load_weights(
                [("model.norm.weight", torch.ones(256)), ("x", torch.ones(1))]
            )
        assert str(info.value) == (
            "load_weights got 'x', which begin_weight_update did not announce; announce every "
            "weight of the version"
        )
        with pytest.raises(PluginError) as info:
            await engine.load_weights([("model.norm.weight", torch.ones(3))])
        assert str(info.value) == (
            "load_weights got 'model.norm.weight' of shape (3,), the rollout model's is (256,); "
            "push full (unsharded) weights"
        )
        with pytest.raises(PluginError) as info:
            await engine.finish_weight_update()
        assert str(info.value).startswith(
            f"finish_weight_update: 1 of {len(weights)} announced weights arrived; missing "
        )

    asyncio.run(incomplete())
    assert engine.weight_version == 0
    with pytest.raises(RuntimeError, match=r"^the last weight update did not finish; load new"):
        engine.generate(prompts, greedy())
    with pytest.raises(RuntimeError, match=r"^load_weights without begin_weight_update"):
        asyncio.run(engine.load_weights([]))
    asyncio.run(push(engine, weights, version=2))
    assert engine.weight_version == 2
    assert engine.generate(prompts, greedy(max_tokens=2))[0].token_versions in ([2], [2, 2])


def test_separate_engine_needs_a_model_folder(tokenizer, tmp_path):
    with pytest.raises(RecipeError) as info:
        make_engine(None, tokenizer, path=None)
    assert str(info.value) == (
        "model.path: the hf rollout engine needs a model folder to load its own model; set "
        "model.path"
    )
    missing = tmp_path / "missing"
    with pytest.raises(RecipeError) as info:
        make_engine(missing, tokenizer)
    assert str(info.value) == (
        f"model.path: {missing} is not a folder; set a local Hugging Face model folder"
    )


def test_the_engine_runs_in_rollout_dtype_whatever_the_trainers(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer, dtype="bfloat16")
    # rollout.dtype auto is float32 on the CPUs the tests run on (tests/conftest.py)
    assert next(engine.model.parameters()).dtype == torch.float32
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
    weights = {name: p.detach() for name, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match=r"there are no weights to push"):
        asyncio.run(engine.begin_weight_update(6, metas(weights)))
    engine.bind_model(model, version=6)
    assert engine.weight_version == 6
    assert {c.weight_version for c in engine.generate(prompts[:1], greedy(max_tokens=2))} == {6}


# ------------------------------------------------------------------------------------- sleep


def test_sleep_is_a_no_op_on_cpu(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer)
    prompts = chat_prompts(tokenizer)
    reference = engine.generate(prompts, greedy())

    async def main():
        await engine.sleep(2)
        result = await engine.generate_batch(prompts, greedy())
        await engine.wake_up()
        return result

    assert [c.token_ids for c in asyncio.run(main())] == [c.token_ids for c in reference]


def test_sleep_level_one_keeps_rows_in_flight(tiny_model_dir, tokenizer):
    # the device path, with the CPU standing in for the device
    engine = make_engine(tiny_model_dir, tokenizer)
    engine._sleeps = True
    prompts = chat_prompts(tokenizer)
    requests = [
        request(f"r{i}", p, n=2, temperature=1.0, max_tokens=12, seed=i)
        for i, p in enumerate(prompts)
    ]
    forwards = Forwards(engine.model)
    passes = []

    async def main():
        tasks = asyncio.gather(*(engine.generate_request(r) for r in requests))
        await until(lambda: len(forwards.decode_sizes) == 4)
        await engine.pause("keep")
        passes.append(len(forwards.prompt_passes))
        await engine.sleep(1)
        assert all(buffer is None for buffer in engine._batch.kv.keys), "the cache is freed"
        await engine.resume()
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(forwards.decode_sizes) == 4, "nothing runs while asleep"
        await engine.wake_up(["weights"])
        await engine.wake_up(["kv_cache"])
        return await tasks

    try:
        outputs = asyncio.run(main())
    finally:
        forwards.close()
    # the rows' caches were recomputed after the wake-up
    assert len(forwards.prompt_passes) > passes[0]
    for req, completions in zip(requests, outputs, strict=True):
        assert [c.token_ids for c in completions] == [
            c.token_ids for c in alone(tiny_model_dir, tokenizer, req)
        ]
        for c in completions:
            assert_teacher_forced(engine.model, req.prompt_ids, c)


def test_sleep_level_two_drops_the_weights_until_an_update(tiny_model_dir, tokenizer, model):
    engine = make_engine(tiny_model_dir, tokenizer)
    engine._sleeps = True
    prompts = chat_prompts(tokenizer)
    reference = [c.token_ids for c in engine.generate(prompts, greedy())]
    weights = {name: p.detach().clone() for name, p in model.state_dict().items()}

    async def main():
        await engine.sleep(2)
        assert all(p.numel() == 0 for p in engine.model.parameters())
        with pytest.raises(RuntimeError) as info:
            await engine.generate_request(request("r", prompts[0]))
        assert str(info.value) == (
            "the hf rollout engine dropped its weights in sleep(level=2); load new weights "
            "(begin_weight_update, load_weights, finish_weight_update) before generating"
        )
        with pytest.raises(RuntimeError, match=r"wake_up\(tags=\['weights'\]\) before"):
            await engine.begin_weight_update(1, metas(weights))
        await engine.wake_up()
        with pytest.raises(RuntimeError, match=r"dropped its weights in sleep\(level=2\)"):
            await engine.generate_request(request("r", prompts[0]))
        await push(engine, weights, version=1)
        return await engine.generate_batch(prompts, greedy())

    after = asyncio.run(main())
    assert [c.token_ids for c in after] == reference
    assert (
        engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    )


# --------------------------------------------------------------------- other cache layouts


def _variant_model_dir(tiny_model_dir, tmp_path, **config_changes):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for name, value in config_changes.items():
        setattr(model.config, name, value)
    model.save_pretrained(tmp_path)
    return tmp_path


def test_eager_attention_gets_an_additive_mask(tiny_model_dir, tokenizer):
    engine = make_engine(tiny_model_dir, tokenizer, attn_implementation="eager")
    assert engine.model.config._attn_implementation == "eager"
    prompts = chat_prompts(tokenizer)
    completions = engine.generate(prompts, SamplingParams(n=2, max_tokens=10, seed=2))
    for completion in completions:
        assert_teacher_forced(engine.model, prompts[completion.prompt_index], completion)
    sdpa = make_engine(tiny_model_dir, tokenizer).generate(prompts, greedy())
    assert [c.token_ids for c in engine.generate(prompts, greedy())] == [c.token_ids for c in sdpa]


def test_sliding_window_models_fall_back_to_joining_an_empty_batch(
    tiny_model_dir, tokenizer, tmp_path, caplog
):
    folder = _variant_model_dir(
        tiny_model_dir,
        tmp_path,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=0,
        layer_types=["sliding_attention"] * 4,
    )
    with caplog.at_level(logging.INFO, logger="plugrl.rollout.hf"):
        engine = make_engine(folder, tokenizer, max_num_seqs=3)
    assert (
        "DynamicSlidingWindowLayer layers, so requests join only when the running batch is empty"
        in caplog.text
    )
    prompts = chat_prompts(tokenizer)
    limits = [4, 9, 6, 5]
    forwards = Forwards(engine.model)

    async def main():
        return await asyncio.gather(
            *(
                engine.generate_request(request(f"r{i}", p, temperature=0.0, max_tokens=limit))
                for i, (p, limit) in enumerate(zip(prompts, limits, strict=True))
            )
        )

    try:
        completions = [c for (c,) in asyncio.run(main())]
    finally:
        forwards.close()
    # three rows; the fourth joins only once all three have finished, not when the first does
    assert [rows for rows, _ in forwards.prompt_passes] == [3, 1]
    second_pass = [i for i, (_, columns, _) in enumerate(forwards.calls) if columns > 1][1]
    first_wave = [rows for rows, columns, _ in forwards.calls[:second_pass] if columns == 1]
    assert sum(first_wave) == sum(len(c.token_ids) for c in completions[:3])
    assert first_wave[-1] == 1
    for completion, prompt, limit in zip(completions, prompts, limits, strict=True):
        (reference,) = hf_generate(
            engine.model,
            [prompt],
            max_new_tokens=limit,
            eos_token_id=sorted(default_stop_token_ids(engine.model, tokenizer)),
            pad_token_id=engine.pad_token_id,
        )
        assert completion.token_ids == reference[: len(completion.token_ids)]
    sampled = engine.generate(prompts, SamplingParams(n=2, max_tokens=10, seed=1))
    for completion in sampled:
        assert_teacher_forced(engine.model, prompts[completion.prompt_index], completion)


# ------------------------------------------------------------------------------- start-up noise


def test_the_cache_goes_by_the_keyword_the_models_forward_takes(tiny_model_dir, tokenizer):
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` and warns at every start of
    a run that passes the old name; older versions know only ``past_key_values``."""
    import inspect
    import warnings

    from plugrl_hf.kv import _cache_keyword

    engine = make_engine(tiny_model_dir, tokenizer, lean_decode=False)  # the model's forward
    takes = inspect.signature(type(engine.model).forward).parameters
    assert _cache_keyword(type(engine.model)) == (
        "cache" if "cache" in takes else "past_key_values"
    )

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            pass

    assert _cache_keyword(Old) == "past_key_values"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate(chat_prompts(tokenizer), greedy(max_tokens=4))
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_a_shared_model_the_lean_step_cannot_serve_is_not_news(
    tiny_model_dir, tokenizer, model, caplog
):
    """The trainer's model handed over by bind_model (FSDP's, with DTensor weights and hooks)
    always runs its own forward: said at debug level; an engine's own model that the lean
    step cannot serve is still said at info level."""
    model.model.layers[0].register_forward_hook(lambda *args: None)  # as FSDP's are
    engine = make_engine(tiny_model_dir, tokenizer, colocate=True)
    with caplog.at_level(logging.DEBUG, logger="plugrl.rollout.hf"):
        engine.bind_model(model, version=1)
        engine._use_model(model, owns=True)
    line = (
        "hf rollout engine: decode steps and prompt passes run the model's own forward: its "
        "modules have forward hooks (FSDP, an adapter or instrumentation)"
    )
    shown = [(r.levelname, r.getMessage()) for r in caplog.records if "own forward" in r.message]
    assert shown == [("DEBUG", line), ("INFO", line)]
