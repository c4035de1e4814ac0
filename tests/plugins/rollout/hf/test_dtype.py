"""``rollout.dtype`` in the hf engine, and its copy of a colocated trainer's weights."""

from __future__ import annotations

import asyncio
import copy
import logging

import attrs
import pytest
import torch

from plugrl.errors import PluginError, RecipeError
from plugrl.parts.context import PartContext
from plugrl.parts.device import Device
from plugrl.parts.rollout import RolloutConfig, SamplingParams
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ModelConfig, Recipe, TrainerConfig, load_recipe
from plugrl_cpu.device import BFLOAT16_ENV, CpuDevice
from plugrl_hf.config import HFRolloutConfig
from plugrl_hf.engine import HFRolloutEngine
from tests.plugins.rollout.hf.test_hf_engine import chat_prompts, push
from tests.plugins.rollout.hf.test_lean import Spy

BFLOAT16_TOLERANCE = 0.25
"""Per token, against Hugging Face's own bfloat16 forward: both round to 8 bits of mantissa,
in other orders (up to 0.13 apart for the tiny test model, whose logits are sharp)."""
BFLOAT16_MEAN_GAP = 0.15
"""Mean distance to the float32 log-probs (about 0.1 for the tiny test model, as far as
Hugging Face's own bfloat16 forward is from its float32 one)."""


def greedy(max_tokens: int = 10) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def own_engine(model_dir, tokenizer, dtype: str) -> HFRolloutEngine:
    """An engine that loads its own model (a float32 trainer's folder) in ``dtype``."""
    config = HFRolloutConfig(colocate=False, dtype=dtype)
    recipe = Recipe(
        model=ModelConfig(path=str(model_dir), dtype="float32"),
        rollout=config,
        trainer=TrainerConfig(seed=0),
    )
    return HFRolloutEngine(
        config, PartContext(recipe=recipe, device=CpuDevice(), tokenizer=tokenizer)
    )


def bound(model, tokenizer, **rollout) -> HFRolloutEngine:
    config = HFRolloutConfig(colocate=True, **rollout)
    recipe = Recipe(
        model=ModelConfig(path="", dtype="float32"), rollout=config, trainer=TrainerConfig(seed=0)
    )
    context = PartContext(
        recipe=recipe, device=CpuDevice(), tokenizer=tokenizer, model_from_trainer=True
    )
    engine = HFRolloutEngine(config, context)
    engine.bind_model(model, version=0)
    return engine


def teacher_forced(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """The log-probs of ``response`` after ``prompt`` under ``model``'s own forward."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    log_probs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return log_probs.gather(1, torch.tensor(response)[:, None])[:, 0]


# ----------------------------------------------------------------------------- the option


def test_rollout_dtype_is_a_recipe_key_and_an_unknown_one_names_the_choices():
    plugins = get_plugin_manager()
    assert load_recipe(None, ["rollout.dtype=bfloat16"], plugins).rollout.dtype == "bfloat16"
    assert load_recipe(None, [], plugins).rollout.dtype == "auto"
    with pytest.raises(RecipeError) as info:
        load_recipe(None, ["rollout.dtype=fp8"], plugins)
    assert str(info.value) == (
        "rollout.dtype: must be one of auto, bfloat16, float16, float32, got 'fp8'"
    )


class _Device(CpuDevice):
    def __init__(self, fast: bool) -> None:
        super().__init__()
        self.fast = fast

    def fast_bfloat16(self) -> bool:
        return self.fast


def test_auto_is_bfloat16_where_the_device_says_it_is_fast():
    auto = RolloutConfig()
    assert auto.resolved_dtype(_Device(fast=True)) == "bfloat16"
    assert auto.resolved_dtype(_Device(fast=False)) == "float32"
    assert auto.resolved_dtype(None) == "float32"
    assert RolloutConfig(dtype="float16").resolved_dtype(_Device(fast=False)) == "float16"
    assert RolloutConfig(dtype="float32").resolved_dtype(_Device(fast=True)) == "float32"
    # accelerators have bfloat16 units: the interface's default
    assert Device.fast_bfloat16(_Device(fast=False)) is True


def test_the_cpu_goes_by_its_flags_unless_the_environment_says(monkeypatch):
    import plugrl_cpu.device as cpu

    monkeypatch.delenv(BFLOAT16_ENV, raising=False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert CpuDevice().fast_bfloat16() is torch.backends.mkldnn.is_available()
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert CpuDevice().fast_bfloat16() is False
    monkeypatch.setenv(BFLOAT16_ENV, "1")
    assert CpuDevice().fast_bfloat16() is True
    monkeypatch.setenv(BFLOAT16_ENV, "yes")
    with pytest.raises(ValueError) as info:
        CpuDevice().fast_bfloat16()
    assert str(info.value) == (
        "PLUGRL_CPU_BFLOAT16 is 'yes'; set it to 1 (bfloat16 is fast here) or 0 (it is not), "
        "or unset it to go by the CPU's flags"
    )


# --------------------------------------------------------------------- the engine's own model


def test_weights_are_cast_as_they_arrive_and_bfloat16_samples_near_float32(
    tiny_model_dir, tokenizer, model
):
    engine = own_engine(tiny_model_dir, tokenizer, "bfloat16")
    assert engine.dtype_name == "bfloat16"
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    trainer = {name: p.detach() for name, p in model.named_parameters()}
    asyncio.run(push(engine, trainer, version=1))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    engine_embedding = engine.model.model.embed_tokens.weight
    assert torch.equal(engine_embedding, model.model.embed_tokens.weight.to(torch.bfloat16))
    prompts = chat_prompts(tokenizer)
    completions = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=8, seed=3))
    assert all(1 <= len(c.token_ids) <= 8 for c in completions)
    vocab = model.config.vocab_size
    assert all(0 <= t < vocab for c in completions for t in c.token_ids)
    # Hugging Face's own bfloat16 forward gives about the same log-probs of the same tokens;
    # the trainer's float32 ones are near, not equal
    reference = copy.deepcopy(model).to(torch.bfloat16)
    sampled = torch.tensor([p for c in completions for p in c.log_probs])
    in_bfloat16 = torch.cat(
        [
            teacher_forced(reference, p, c.token_ids)
            for p, c in zip(prompts, completions, strict=True)
        ]
    )
    in_float32 = torch.cat(
        [teacher_forced(model, p, c.token_ids) for p, c in zip(prompts, completions, strict=True)]
    )
    torch.testing.assert_close(sampled, in_bfloat16, atol=BFLOAT16_TOLERANCE, rtol=0)
    assert (sampled - in_float32).abs().mean() < BFLOAT16_MEAN_GAP
    assert not torch.equal(sampled, in_float32)


# ------------------------------------------------------------------ a colocated engine's copy


def test_a_colocated_bfloat16_engine_generates_from_its_own_copy(model, tokenizer, caplog):
    with caplog.at_level(logging.DEBUG, logger="plugrl.rollout.hf"):
        engine = bound(model, tokenizer, dtype="bfloat16")
    assert engine.model is not model
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # said once, and only at debug level (plugrl run --verbose): not news at every start
    explained = [r for r in caplog.records if "copy of the trainer's weights" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in explained] == [
        (
            logging.DEBUG,
            "hf rollout engine: generates from its own bfloat16 copy of the trainer's weights, "
            "refreshed at each weight sync (rollout.copy_trainer_weights): the trainer's weights "
            "are float32, rollout.dtype bfloat16",
        )
    ]
    lean = engine._batch.kv.lean  # type: ignore[union-attr]
    assert lean is not None
    spy = Spy(lean)
    prompts = chat_prompts(tokenizer)
    before = engine.generate(prompts, greedy())
    assert spy.steps > 0, "the copy takes the lean path"
    # a training step changes the trainer's weights: the copy follows at the next sync only
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(-1.0)
    assert [c.token_ids for c in engine.generate(prompts, greedy())] == [
        c.token_ids for c in before
    ]
    copy = engine.model
    engine.bind_model(model, version=1)
    assert engine.model is copy, "the copy is refreshed in place"
    assert torch.equal(
        copy.model.embed_tokens.weight, model.model.embed_tokens.weight.to(torch.bfloat16)
    )
    after = engine.generate(prompts, greedy())
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert {c.weight_version for c in after} == {1}


def test_without_copies_a_dtype_other_than_the_trainers_is_an_error(model, tokenizer):
    shared = bound(model, tokenizer, copy_trainer_weights=False)
    assert shared.model is model
    with pytest.raises(RecipeError) as info:
        bound(model, tokenizer, dtype="bfloat16", copy_trainer_weights=False)
    assert str(info.value) == (
        "rollout.dtype: rollout.dtype is bfloat16, but the trainer's weights are float32 and "
        "rollout.copy_trainer_weights is false (the engine generates with them as they are); "
        "set rollout.dtype to float32 or auto, or rollout.copy_trainer_weights to true"
    )


def test_a_module_whose_weights_the_copy_cannot_find_is_an_error(model, tokenizer):
    # a module that lost a weight the architecture has (a wrapper that renames them would too)
    del model.model.norm.weight
    with pytest.raises(PluginError) as info:
        bound(model, tokenizer, dtype="bfloat16")
    assert str(info.value) == (
        "the trainer's module has no 'model.norm.weight', which the hf rollout engine's copy "
        "of its architecture (Qwen2ForCausalLM) has; hand bind_model the Hugging Face module "
        "itself, or set rollout.copy_trainer_weights to false"
    )


def test_an_fsdp_module_is_copied_and_samples_what_its_own_forward_does(tmp_path, tokenizer):
    """The trainer's module as the fsdp2 backend shares it (one rank): in float32 the copy on
    the lean path gives the tokens and log-probs of generating with the module itself, before
    and after an optimizer step."""
    from tests.plugins.backends.fsdp2.fsdp2_testing import (
        TokenMeanReinforce,
        make_backend,
        make_batch,
        make_recipe,
        save_tiny_qwen2,
    )

    backend = make_backend(make_recipe(save_tiny_qwen2(tmp_path / "model"), lr=1e-2))
    try:
        trainer_model = backend.rollout_model()
        copying = bound(trainer_model, tokenizer, dtype="float32")
        module = bound(trainer_model, tokenizer, dtype="float32", copy_trainer_weights=False)
        assert copying.model is not trainer_model and module.model is trainer_model
        lean = copying._batch.kv.lean  # type: ignore[union-attr]
        assert lean is not None and lean.usable()
        spy = Spy(lean)
        prompts = [[5, 17, 9, 33, 2, 8, 41], [12, 7, 7], [3] * 11 + [19, 25]]
        params = SamplingParams(n=2, temperature=1.0, max_tokens=10, seed=11)
        for version in (0, 1):
            if version:
                backend.update_policy(make_batch(8), TokenMeanReinforce())
                copying.bind_model(trainer_model, version)
                module.bind_model(trainer_model, version)
            copied = copying.generate(prompts, params)
            own = module.generate(prompts, params)
            assert [c.token_ids for c in copied] == [c.token_ids for c in own]
            for mine, theirs in zip(copied, own, strict=True):
                torch.testing.assert_close(mine.log_probs, theirs.log_probs, atol=1e-5, rtol=0)
        assert spy.steps > 0
    finally:
        backend.close()


def test_float16_is_honoured(model, tokenizer):
    engine = bound(model, tokenizer, dtype="float16")
    assert {p.dtype for p in engine.model.parameters()} == {torch.float16}
    assert attrs.asdict(engine.config)["dtype"] == "float16"
