"""The lean decode step: the same logits as the Hugging Face model, always its current weights."""

from __future__ import annotations

import pytest
import torch

from plugrl.data.batch import left_pad
from plugrl.parts.context import PartContext
from plugrl.parts.rollout import SamplingParams
from plugrl.recipe import ModelConfig, Recipe, TrainerConfig
from plugrl.testing import make_tiny_model
from plugrl_cpu.device import CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from plugrl_hf.kv import SlotKV
from plugrl_hf.lean import LeanDecoder, lean_unsupported

LOGIT_TOLERANCE = 1e-4
"""Float32: fused and separate matrix products may round differently in the last bits."""

PROMPTS = [[5, 17, 9, 33, 2, 8, 41], [12, 7, 7], [3] * 11 + [19, 25]]


def build(kind: str, vocab_size: int = 320, **extra):
    """A small model of ``kind`` with the features its family has: Qwen2's attention bias,
    Qwen3's per-head query/key norm and a head size other than hidden / heads, Llama's optional
    biases and llama3 RoPE scaling. Its weights have a large spread (varied, context-dependent
    tokens instead of near-flat logits) and no norm scale or bias sits at one or zero."""
    family: dict[str, dict] = {
        "qwen2": {},
        "qwen3": {"head_dim": 24},
        "llama": {
            "attention_bias": True,
            "mlp_bias": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    }
    model = make_tiny_model(
        model_type=kind,
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        weight_std=0.2,
        attn_implementation="sdpa",
        **{**family[kind], **extra},
    )
    return model.eval()


def full_forward_logits(model, sequence: list[int]) -> torch.Tensor:
    """The model's own forward over the whole sequence, no cache: logits per position."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([sequence])).logits[0]


class Spy:
    """Counts the lean decoder's steps (``decode``) or prompt passes (``prefill``)."""

    def __init__(self, lean: LeanDecoder, method: str = "decode") -> None:
        self.steps = 0
        self.call = getattr(lean, method)
        setattr(lean, method, self)

    def __call__(self, *args):
        self.steps += 1
        return self.call(*args)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_lean_steps_give_the_logits_of_the_models_own_forward(kind):
    model = build(kind)
    kv = SlotKV(model, device=torch.device("cpu"), pad_token_id=0, max_slots=8, prefill_tokens=512)
    assert kv.lean_unsupported is None
    assert kv.lean is not None
    spy = Spy(kv.lean)
    sequences = [list(prompt) for prompt in PROMPTS]
    steps = 40  # past the first buffer size (64 columns): the window moves once
    step_logits = []
    with torch.no_grad():
        kv.prefill(model, [s[:-1] for s in sequences], [1] * len(sequences))
        ids = torch.tensor([s[-1] for s in sequences])
        positions = torch.tensor([len(s) - 1 for s in sequences])
        for _ in range(steps):
            step_logits.append(kv.forward_step(model, ids, positions))
            ids = step_logits[-1].argmax(dim=-1)
            for sequence, token in zip(sequences, ids.tolist(), strict=True):
                sequence.append(token)
            positions = positions + 1
    assert spy.steps == steps
    for row, (prompt, sequence) in enumerate(zip(PROMPTS, sequences, strict=True)):
        expected = full_forward_logits(model, sequence[:-1])[len(prompt) - 1 :]
        got = torch.stack([logits[row] for logits in step_logits])
        assert (got - expected).abs().max() <= LOGIT_TOLERANCE
    # greedy tokens: what the model's own generate picks
    for prompt, sequence in zip(PROMPTS, sequences, strict=True):
        with torch.no_grad():
            reference = model.generate(
                input_ids=torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=steps,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert sequence == reference[0].tolist()


def slot_kv(model, *, lean: bool = True, prefill_tokens: int = 512) -> SlotKV:
    return SlotKV(
        model,
        device=torch.device("cpu"),
        pad_token_id=0,
        max_slots=8,
        prefill_tokens=prefill_tokens,
        lean_decode=lean,
    )


SHARED_START = [7, 3, 90, 14, 66, 2, 31, 8, 5, 12, 40, 9, 22, 17, 4, 28, 11]
"""A prompt start three prompts share: computed once for all of them ((3 - 1) x 17 tokens
saved, at least SHARE_MIN_TOKENS)."""


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("prefill_tokens", [512, 40])
def test_lean_prompt_passes_write_the_keys_and_values_of_the_models_own_pass(kind, prefill_tokens):
    """Prompts of different lengths (padding), a shared start, copies of one prompt, a second
    join into a running batch, and chunks of a few rows per pass (prefill_tokens 40)."""
    model = build(kind)
    lean_kv, module_kv = (
        slot_kv(model, prefill_tokens=prefill_tokens),
        slot_kv(model, lean=False, prefill_tokens=prefill_tokens),
    )
    assert lean_kv.lean is not None
    spy = Spy(lean_kv.lean, "prefill")
    first = [[*SHARED_START, 5, 6], [*SHARED_START, 70, 71, 72, 73, 74], [*SHARED_START, 9]]
    later = [[4, 4, 4], [61, 62, 63, 64, 65, 66, 67]]
    with torch.no_grad():
        for kv in (lean_kv, module_kv):
            kv.prefill(model, first, [1, 2, 1])
            kv.forward_step(model, torch.tensor([1, 2, 2, 3]), torch.tensor([19, 22, 22, 18]))
            kv.prefill(model, later, [1, 1])
    assert spy.steps >= 3  # the shared start, the suffixes, the later prompts
    assert lean_kv.spans == module_kv.spans
    assert (lean_kv.begin, lean_kv.end) == (module_kv.begin, module_kv.end)
    for lean_buffer, module_buffer in zip(
        lean_kv.keys + lean_kv.values, module_kv.keys + module_kv.values, strict=True
    ):
        assert lean_buffer is not None and module_buffer is not None
        used = (slice(0, lean_kv.size), slice(None), slice(lean_kv.begin, lean_kv.end))
        assert (lean_buffer[used] - module_buffer[used]).abs().max() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_decode_steps_after_lean_prompt_passes_give_the_models_logits(kind):
    model = build(kind)
    kv = slot_kv(model)
    prompts = [[*SHARED_START, 5, 6, 44], [*SHARED_START, 70, 71], [*SHARED_START, 9, 1, 2, 3]]
    sequences = [list(p) for p in prompts]
    counts = [2, 1, 1]
    with torch.no_grad():
        order = kv.prefill(model, [s[:-1] for s in sequences], counts)
        rows = [sequences[g] for g in order]
        ids = torch.tensor([row[-1] for row in rows])
        positions = torch.tensor([len(row) - 1 for row in rows])
        logits = kv.forward_step(model, ids, positions)
    for row, sequence in enumerate(rows):
        expected = full_forward_logits(model, sequence)[-1]
        assert (logits[row] - expected).abs().max() <= LOGIT_TOLERANCE


def bound_engine(model, tokenizer) -> HFRolloutEngine:
    config = HFRolloutConfig(colocate=True)
    recipe = Recipe(
        model=ModelConfig(path="", dtype="float32"), rollout=config, trainer=TrainerConfig(seed=0)
    )
    context = PartContext(
        recipe=recipe, device=CpuDevice(), tokenizer=tokenizer, model_from_trainer=True
    )
    engine = HFRolloutEngine(config, context)
    engine.bind_model(model, version=0)
    return engine


def teacher_forced_log_probs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    logits = full_forward_logits(model, list(prompt) + list(response))
    log_probs = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    return log_probs.gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_sampled_log_probs_are_those_of_a_teacher_forced_forward(kind, tokenizer):
    model = build(kind, vocab_size=len(tokenizer))
    engine = bound_engine(model, tokenizer)
    assert engine._batch is not None and engine._batch.kv.lean is not None
    spy = Spy(engine._batch.kv.lean)
    completions = engine.generate(
        PROMPTS, SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7)
    )
    assert spy.steps > 0
    for completion in completions:
        prompt = PROMPTS[completion.prompt_index]
        expected = teacher_forced_log_probs(model, prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.log_probs), expected, atol=LOGIT_TOLERANCE)


def greedy_generate(model, prompts, max_tokens: int, stop: list[int], pad: int) -> list[list[int]]:
    input_ids, mask = left_pad(prompts, pad)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_tokens,
            eos_token_id=stop,
            pad_token_id=pad,
        )
    responses = []
    for row in output[:, input_ids.shape[1] :].tolist():
        ends = [i for i, token in enumerate(row) if token in stop]
        responses.append(row[: ends[0] + 1] if ends else row)
    return responses


def test_a_bound_engine_follows_the_trainers_optimizer_steps(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from plugrl_hf.sampler import default_stop_token_ids

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    engine = bound_engine(model, tokenizer)
    stop = sorted(default_stop_token_ids(model, tokenizer))
    params = SamplingParams(temperature=0.0, max_tokens=12)

    def engine_tokens() -> list[list[int]]:
        return [c.token_ids for c in engine.generate(PROMPTS, params)]

    def reference() -> list[list[int]]:
        return greedy_generate(model.eval(), PROMPTS, 12, stop, engine.pad_token_id)

    before = engine_tokens()
    assert before == reference()
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    for version in (1, 2):
        # a training step on the live module: its weights change in place
        model.train()
        logits = model(input_ids=torch.tensor([PROMPTS[0]])).logits
        logits[0, :, before[0][0]].sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        engine.bind_model(model, version=version)
        after = engine_tokens()
        assert after == reference()
    assert after != before, "the optimizer steps should change what the model samples"
    # weights changed in place without a bind are seen too (their version counters moved)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.normal_(0.0, 0.3, generator=generator)
            layer.mlp.up_proj.weight.normal_(0.0, 0.3, generator=generator)
    changed = reference()
    assert changed != after, "the in-place change should change what the model samples"
    assert engine_tokens() == changed


def test_a_hooked_model_runs_its_own_forward(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = bound_engine(model, tokenizer)
    lean = engine._batch.kv.lean  # type: ignore[union-attr]
    assert lean is not None
    spy, prefill_spy = Spy(lean), Spy(lean, "prefill")
    decode_calls, prompt_passes = [], []

    def record(module, args, kwargs):
        if kwargs["input_ids"].shape[1] == 1:
            decode_calls.append(kwargs["input_ids"].shape[0])
        else:
            prompt_passes.append(kwargs["input_ids"].shape[0])

    # added after the engine was built: the hook still sees every decode step
    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        completions = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6))
    finally:
        handle.remove()
    assert spy.steps == 0 and prefill_spy.steps == 0
    assert len(decode_calls) == max(len(c.token_ids) for c in completions)
    assert sum(prompt_passes) == len(PROMPTS)
    assert lean_unsupported(model) is None  # the hook is gone: lean steps again
    engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3))
    assert spy.steps == 3
    assert prefill_spy.steps >= 1


def test_why_a_model_gets_no_lean_steps():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert lean_unsupported(gpt2) == "model type 'gpt2' is not one of llama, qwen2, qwen3"
    gelu = build("llama", hidden_act="gelu")
    assert lean_unsupported(gelu) == "its activation 'gelu' is not silu"
    sliding = build("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert lean_unsupported(sliding) == "it has sliding-window layers"
    hooked = build("qwen2")
    hooked.model.layers[1].mlp.register_forward_hook(lambda *args: None)
    assert lean_unsupported(hooked) == (
        "its modules have forward hooks (FSDP, an adapter or instrumentation)"
    )
    adapted = build("qwen2")
    adapted.model.layers[0].self_attn.v_proj = torch.nn.Sequential(
        adapted.model.layers[0].self_attn.v_proj
    )
    assert lean_unsupported(adapted) == (
        "its projections are not plain nn.Linear layers (an adapter?)"
    )
    off = SlotKV(
        build("qwen2"),
        device=torch.device("cpu"),
        pad_token_id=0,
        max_slots=4,
        prefill_tokens=64,
        lean_decode=False,
    )
    assert off.lean is None and off.lean_unsupported == "lean_decode is off"


def test_the_engine_says_why_a_model_runs_its_own_forward(tokenizer, caplog):
    model = build("qwen2", vocab_size=len(tokenizer))
    model.model.layers[0].register_forward_pre_hook(lambda *args: None)
    # the trainer's model, bound: said at debug level (no news at every start of a run)
    with caplog.at_level("DEBUG", logger="plugrl.rollout.hf"):
        engine = bound_engine(model, tokenizer)
    assert engine._batch is not None and engine._batch.kv.lean is None
    assert (
        "hf rollout engine: decode steps and prompt passes run the model's own forward: its "
        "modules have forward hooks (FSDP, an adapter or instrumentation)"
    ) in caplog.text


def test_the_lean_module_imports_nothing_of_the_kv_store_that_builds_it():
    import ast
    import inspect

    import plugrl_hf.lean

    tree = ast.parse(inspect.getsource(plugrl_hf.lean))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not {name for name in imported if name.startswith("plugrl_hf")}
