"""The memory plan's estimates against the measured peaks of real phases, on the CPU.

Runs the phases a step is made of through plugrl's own parts, each configuration in a fresh
subprocess so that one peak cannot leak into the next:

* ``log-prob``: the fsdp2 actor's ``compute_log_prob`` over a batch (no gradient);
* ``update``: the fsdp2 actor's ``update_policy`` (forwards, backwards and the optimizer step
  of one mini-batch), measured on its second call, when the optimizer state exists already,
  as in every step of a run but the first;
* ``generate``: the hf engine generating the batch's responses with its own weights.

Each runs once unmeasured (lazy set-up, the optimizer's first step), then once measured. The
measurement is the peak of live tensor bytes (:mod:`live_bytes`: every storage counted once,
deterministic for a given model, batch and seed); the process's resident-set high-water mark
over the phase is printed beside it, never compared (the allocator and Python blur it).

Models, float32 on the CPU: ``tiny`` (:func:`plugrl.testing.save_tiny_model`'s defaults, 4M
parameters) and ``qwen2-45m`` (a Qwen2 of hidden 512, 8 layers, 32,000-token vocabulary: 45M
parameters), built from their configs with random weights. Configurations: plain, gradient
checkpointing, LoRA (rank 16 on every linear layer), both, and ``actor.param_offload`` (which
the fsdp2 backend ignores on the CPU, where the host memory is the device's: a check that the
estimate says the same). Batches are full length (every prompt and response as long as the
recipe allows), the shape an estimate plans for.

The estimate of each phase comes from :func:`plugrl.plan.plan_recipe` when that is installed,
else from :func:`first_principles`, this file's own sum of the terms (weights, gradients,
AdamW moments, gathered layers, saved activations, logits; weights, fused decode copies,
KV cache and logits for generation), which also breaks each measurement down for ``--terms``.

    python bench/bench_memory_plan.py [--models tiny,qwen2-45m] [--phases ...] [--terms]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
TARGET = 0.15
"""Estimates within this share of the measured peak are on target."""

MODELS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "qwen2-45m": {
        "vocab_size": 32000,
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    },
}
"""save_tiny_model options of each model (the tiny one is the function's defaults)."""

SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"rows": 8, "prompt": 32, "response": 48, "micro": 4},
    "qwen2-45m": {"rows": 8, "prompt": 64, "response": 128, "micro": 4},
}
"""Batch of each model: rows (one mini-batch), prompt and response lengths, micro-batch rows."""


@attrs.frozen
class Case:
    """One phase of one configuration."""

    model: str
    phase: str
    checkpointing: bool = False
    lora_rank: int = 0
    offload: bool = False

    @property
    def label(self) -> str:
        parts = [
            "ckpt" if self.checkpointing else "",
            f"lora{self.lora_rank}" if self.lora_rank else "",
            "offload" if self.offload else "",
        ]
        return "+".join(p for p in parts if p) or "plain"


def cases(models: list[str], phases: list[str]) -> list[Case]:
    out = []
    for model in models:
        if "log-prob" in phases:
            out += [Case(model, "log-prob"), Case(model, "log-prob", lora_rank=16)]
        if "update" in phases:
            out += [
                Case(model, "update"),
                Case(model, "update", checkpointing=True),
                Case(model, "update", lora_rank=16),
                Case(model, "update", checkpointing=True, lora_rank=16),
                Case(model, "update", offload=True),
            ]
        if "generate" in phases:
            out.append(Case(model, "generate"))
    return out


# ---------------------------------------------------------------------------- the recipe


def recipe_of(case: Case, model_path: Path) -> Any:
    """The recipe a run of ``case`` would have: the model, the actor's batch sizes and
    options, the hf engine, lengths that match the batch."""
    from plugrl.parts.backend import OptimConfig
    from plugrl.recipe import ClusterConfig, DataConfig, ModelConfig, Recipe, TrainerConfig
    from plugrl_fsdp2.config import FSDP2ActorConfig
    from plugrl_hf.config import HFRolloutConfig

    shape = SHAPES[case.model]
    lora = {"lora_rank": case.lora_rank, "lora_alpha": 2 * case.lora_rank} if case.lora_rank else {}
    return Recipe(
        model=ModelConfig(
            path=str(model_path),
            dtype="float32",
            enable_gradient_checkpointing=case.checkpointing,
            **lora,
        ),
        data=DataConfig(
            max_prompt_length=shape["prompt"], max_response_length=shape["response"]
        ),
        actor=FSDP2ActorConfig(
            optim=OptimConfig(lr=1e-4),
            ppo_mini_batch_size=shape["rows"],
            ppo_micro_batch_size_per_gpu=shape["micro"],
            log_prob_micro_batch_size_per_gpu=shape["micro"],
            param_offload=case.offload,
        ),
        rollout=HFRolloutConfig(dtype="float32", max_num_seqs=shape["rows"]),
        trainer=TrainerConfig(seed=0),
        cluster=ClusterConfig(mode="local", num_cpus=1),
    )


def full_batch(rows: int, prompt: int, response: int, vocab: int, seed: int) -> Any:
    """A GRPO-shaped batch whose every prompt and response is as long as allowed."""
    import torch

    from plugrl.data.batch import Batch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=generator)
    mask = torch.ones_like(ids)
    response_mask = mask[:, prompt:].clone()
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:].clone(),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response, generator=generator),
            "old_log_probs": torch.zeros(rows, response),
        }
    )


# ---------------------------------------------------------------------------- measuring


def measure(case: Case, model_path: Path) -> dict[str, Any]:
    """Run ``case``'s phase twice in this process and measure the second run."""
    import torch

    from live_bytes import LiveBytes, rss_high_water

    torch.manual_seed(0)
    recipe = recipe_of(case, model_path)
    shape = SHAPES[case.model]
    run: Callable[[], Any]
    if case.phase == "generate":
        run = _generate_run(recipe, shape)
    else:
        run = _backend_run(case, recipe, shape)
    run()
    with rss_high_water() as rss, LiveBytes() as live:
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
    return {
        "measured": live.peak,
        "at_start": live.at_entry,
        "peak_op": live.peak_op,
        "peak_in_backward": live.peak_in_backward,
        "seconds": seconds,
        **rss,
    }


def _backend_run(case: Case, recipe: Any, shape: dict[str, int]) -> Callable[[], Any]:
    from bench_packed_update import Reinforce

    from plugrl.parts.context import DistInfo, PartContext
    from plugrl_cpu.device import CpuDevice
    from plugrl_fsdp2.backend import FSDP2Backend

    context = PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo())
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(100)
    vocab = backend._hf_config.vocab_size
    batch = full_batch(shape["rows"], shape["prompt"], shape["response"], vocab, seed=0)
    if case.phase == "log-prob":
        return lambda: backend.compute_log_prob(batch.copy())
    objective = Reinforce()
    return lambda: backend.update_policy(batch.copy(), objective)


def _generate_run(recipe: Any, shape: dict[str, int]) -> Callable[[], Any]:
    import torch
    from transformers import AutoTokenizer

    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import SamplingParams
    from plugrl_cpu.device import CpuDevice
    from plugrl_hf.engine import HFRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(recipe.model.path)
    engine = HFRolloutEngine(
        recipe.rollout, PartContext(recipe=recipe, device=CpuDevice(), tokenizer=tokenizer)
    )
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, len(tokenizer) - 1, (shape["prompt"],), generator=generator).tolist()
        for _ in range(shape["rows"])
    ]
    # no stop token: every response runs to the length limit, the case a plan sizes for
    params = SamplingParams(n=1, max_tokens=shape["response"], seed=0, stop_token_ids=[])
    engine._default_stop_ids = frozenset()

    def run() -> int:
        return sum(len(c.token_ids) for c in engine.generate(prompts, params))

    return run


# ---------------------------------------------------------------------------- estimating


def first_principles(case: Case, model_path: Path) -> dict[str, int]:
    """This file's own estimate of ``case``'s peak, term by term (bytes), from the model's
    config.json and the batch shape; the sum is the estimate."""
    config = json.loads((model_path / "config.json").read_text())
    h = config["hidden_size"]
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    vocab = config["vocab_size"]
    tied = config.get("tie_word_embeddings", True)
    kv = kv_heads * head_dim
    q = heads * head_dim
    layer_params = h * (q + 2 * kv) + q * h + 3 * h * inter + (q + 2 * kv) + 2 * h
    embed = vocab * h * (1 if tied else 2)
    params = layers * layer_params + embed + h
    lora_params = 0
    if case.lora_rank:
        r = case.lora_rank
        shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
        lora_params = layers * sum(r * (a + b) for a, b in shapes)
    trained = lora_params or params
    f32 = 4
    shape = SHAPES[case.model]
    rows, seq, response = shape["rows"], shape["prompt"] + shape["response"], shape["response"]
    micro = shape["micro"]
    terms: dict[str, int] = {}
    if case.phase == "generate":
        terms["weights"] = params * f32
        # the lean decoder's fused q|k|v and gate|up copies
        terms["fused decode weights"] = layers * h * (q + 2 * kv + 2 * inter) * f32
        columns = seq
        terms["kv cache"] = 2 * layers * rows * kv * columns * f32
        terms["prompt logits"] = rows * vocab * f32
        return terms
    terms["weights"] = (params + lora_params) * f32
    tokens = micro * seq
    logits = micro * response * vocab * f32
    if case.phase == "log-prob":
        terms["logits (forward + gathered copy)"] = 2 * logits
        terms["layer activations (one layer at a time)"] = tokens * (4 * h + 2 * inter) * f32
        terms["batch"] = rows * seq * 8 * 4
        return terms
    terms["adamw moments"] = 2 * trained * f32
    terms["gradients"] = trained * f32
    per_layer = tokens * (12 * h + 4 * inter) * f32
    if case.checkpointing:
        terms["layer inputs kept (checkpointing)"] = layers * tokens * h * f32
        terms["one layer recomputed"] = per_layer
    else:
        terms["saved activations"] = layers * per_layer
    terms["logits (output, gathered copy, gradient)"] = 3 * logits
    return terms


def plan_estimate(case: Case, model_path: Path) -> dict[str, int] | None:
    """The terms :mod:`plugrl.plan` gives for ``case``'s phase of the actor (bytes), or None
    while that package is not installed."""
    try:
        from plugrl.plan import plan_recipe
    except ImportError:
        return None
    plan = plan_recipe(recipe_of(case, model_path))
    return plan_terms(plan, case)


def plan_terms(plan: Any, case: Case) -> dict[str, int]:
    """The actor's (or the rollout's, for generation) terms of ``case.phase`` in ``plan``."""
    role = "rollout" if case.phase == "generate" else "actor"
    for phase in plan.phases:
        if phase.role == role and phase.name == case.phase:
            return {term.name: int(term.bytes) for term in phase.terms}
    raise LookupError(f"the plan has no {case.phase} phase for the {role}")


# ---------------------------------------------------------------------------- the table


def build_models(folder: Path, names: list[str]) -> dict[str, Path]:
    from plugrl.testing import save_tiny_model

    return {name: save_tiny_model(folder / name, **MODELS[name]) for name in names}


def run_case(case: Case, model_path: Path) -> dict[str, Any]:
    """``case`` measured in a fresh subprocess."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        json.dumps({**attrs.asdict(case), "model_path": str(model_path)}),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, check=False)
    if done.returncode:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float) -> str:
    return f"{n / 2**20:9.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,qwen2-45m")
    parser.add_argument("--phases", default="log-prob,update,generate")
    parser.add_argument("--terms", action="store_true", help="print each estimate's terms")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.one:
        spec = json.loads(args.one)
        model_path = Path(spec.pop("model_path"))
        print(json.dumps(measure(Case(**spec), model_path)))
        return
    names = args.models.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        paths = build_models(Path(scratch), names)
        source = "plugrl.plan"
        print(
            f"{'phase':<10}{'model':<11}{'config':<14}{'measured':>9}{'estimate':>9}"
            f"{'ratio':>7}  {'at start':>9}{'RSS peak':>9}  peak at"
        )
        for case in cases(names, args.phases.split(",")):
            path = paths[case.model]
            terms = plan_estimate(case, path)
            if terms is None:
                terms, source = first_principles(case, path), "first principles (this bench)"
            result = run_case(case, path)
            estimate = sum(terms.values())
            ratio = estimate / result["measured"]
            where = f"{result['peak_op']}{' (backward)' if result['peak_in_backward'] else ''}"
            print(
                f"{case.phase:<10}{case.model:<11}{case.label:<14}{_mib(result['measured'])}"
                f"{_mib(estimate)}{ratio:7.2f}{'' if abs(ratio - 1) <= TARGET else ' !'}"
                f" {_mib(result['at_start'])}{_mib(result['rss_peak'])}  {where}",
                flush=True,
            )
            if args.terms:
                for name, size in terms.items():
                    print(f"{'':35}{_mib(size)}  {name}")
            rows.append({**attrs.asdict(case), **result, "estimate": estimate, "terms": terms})
    print(f"MiB; estimates from {source}; ! marks a ratio off by more than {TARGET:.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
