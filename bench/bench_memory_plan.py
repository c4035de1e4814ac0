"""The memory plan's estimates against the measured peaks of real phases, on the CPU.

Runs the phases a step is made of through plugrl's own parts, each configuration in a fresh
subprocess so that one peak cannot leak into the next:

* ``log-prob``: the fsdp2 actor's ``compute_log_prob`` over a batch (no gradient), with the
  entropy as a run's old_log_prob pass asks for it, after an update, so that the optimizer
  state a run holds between steps is there;
* ``update``: the fsdp2 actor's ``update_policy`` (forwards, backwards and the optimizer step
  of one mini-batch), measured on its second call, when the optimizer state exists already,
  as in every step of a run but the first;
* ``generate``: the hf engine generating the batch's responses with its own weights.

Each runs once unmeasured (lazy set-up, the optimizer's first step), then once measured. The
measurement (:mod:`live_bytes`) is the tensor storage live when the phase starts plus the
most the CPU allocator held above that during it (every allocation, kernels' own temporaries
included); the peak of live tensor storage alone and the process's resident-set high-water
mark over the phase are printed beside it, the latter never compared (the allocator's page
cache and Python blur it).

Models, float32 on the CPU: ``tiny`` (:func:`plugrl.testing.save_tiny_model`'s defaults, 4M
parameters) and ``qwen2-45m`` (a Qwen2 of hidden 512, 8 layers, 32,000-token vocabulary: 45M
parameters), built from their configs with random weights. Configurations: plain, gradient
checkpointing, LoRA (rank 16 on every linear layer), both, ``actor.param_offload`` (which
the fsdp2 backend ignores on the CPU, where the host memory is the device's: a check that the
estimate says the same), packed rows (``actor.use_remove_padding``), and the update in
bfloat16 compute over float32 weights, padded and packed (the dtype of real runs, where the
head's output and its float32 copy differ in size). Batches are full length (every prompt and
response as long as the recipe allows), the shape an estimate plans for.

The estimate of each phase is :func:`plugrl.plan.plan_recipe`'s for the role that runs it (the
actor, or the engine), from the same recipe: the terms held through the phase plus those of
its worst instant. The table prints both sides split the same way: what is live when the
phase starts (weights, optimizer state, an engine's buffers) against the persistent terms,
and the rise to the peak against the worst instant's terms (``--terms`` lists them).

    python bench/bench_memory_plan.py [--models tiny,qwen2-45m] [--phases ...] [--terms]
        [--json FILE] [--measured FILE] [--by-origin]
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
    packed: bool = False
    """``actor.use_remove_padding``: the rows run packed."""
    dtype: str = "float32"
    """``model.dtype`` of the actor (bfloat16: float32 weights, bfloat16 compute)."""

    @property
    def label(self) -> str:
        parts = [
            "ckpt" if self.checkpointing else "",
            f"lora{self.lora_rank}" if self.lora_rank else "",
            "offload" if self.offload else "",
            "packed" if self.packed else "",
            "bf16" if self.dtype == "bfloat16" else "",
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
                Case(model, "update", packed=True),
                Case(model, "update", dtype="bfloat16"),
                Case(model, "update", packed=True, dtype="bfloat16"),
            ]
        if "generate" in phases:
            out.append(Case(model, "generate"))
    return out


# ---------------------------------------------------------------------------- the recipe


def recipe_of(case: Case, model_path: Path) -> Any:
    """The recipe a run of ``case`` would have: the model, the actor's batch sizes and
    options, the hf engine, lengths that match the batch."""
    from plugrl.parts.backend import OptimConfig
    from plugrl.parts.device import DeviceConfig
    from plugrl.recipe import ClusterConfig, DataConfig, ModelConfig, Recipe, TrainerConfig
    from plugrl_fsdp2.config import FSDP2ActorConfig
    from plugrl_hf.config import HFRolloutConfig

    shape = SHAPES[case.model]
    lora = {"lora_rank": case.lora_rank, "lora_alpha": 2 * case.lora_rank} if case.lora_rank else {}
    return Recipe(
        device=DeviceConfig(name="cpu"),
        model=ModelConfig(
            path=str(model_path),
            dtype=case.dtype,
            enable_gradient_checkpointing=case.checkpointing,
            **lora,
        ),
        data=DataConfig(
            train_batch_size=shape["rows"],
            max_prompt_length=shape["prompt"],
            max_response_length=shape["response"],
        ),
        actor=FSDP2ActorConfig(
            optim=OptimConfig(lr=1e-4),
            ppo_mini_batch_size=shape["rows"],
            ppo_micro_batch_size_per_gpu=shape["micro"],
            log_prob_micro_batch_size_per_gpu=shape["micro"],
            param_offload=case.offload,
            use_remove_padding=case.packed,
            # the measured update is given old log-probs: it never derives them (nor computes
            # the entropy the skipped pass would have reported), and the plan must know
            reuse_on_policy_log_prob=False,
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


def measure(
    case: Case, model_path: Path, *, own_tensors_only: bool = False, by_origin: bool = False
) -> dict[str, Any]:
    """Run ``case``'s phase twice in this process and measure the second run.

    ``own_tensors_only`` starts the count from the tensors the phase's part holds (its model,
    optimizer state and batch) instead of every tensor of the process: for a process that
    holds other work's tensors (a test session). The fsdp2 phases only. ``by_origin`` adds,
    under ``by_origin``, the bytes live at the peak per operation that made them."""
    import torch
    from live_bytes import AllocatorPeak, LiveBytes, rss_high_water

    torch.manual_seed(0)
    recipe = recipe_of(case, model_path)
    shape = SHAPES[case.model]
    held: Callable[[], list[torch.Tensor]] | None = None
    if case.phase == "generate":
        run = _generate_run(recipe, shape)
    else:
        run, held = _backend_run(case, recipe, shape)
    run()
    if own_tensors_only and held is None:
        raise ValueError(f"own_tensors_only measures the fsdp2 phases, not {case.phase}")
    start_from = held() if own_tensors_only and held is not None else None
    with (
        rss_high_water() as rss,
        LiveBytes(start_from=start_from, by_origin=by_origin) as live,
        AllocatorPeak() as allocator,
    ):
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
    return {
        "measured": live.at_entry + allocator.rise,
        "at_start": live.at_entry,
        "tensor_peak": live.peak,
        "peak_op": allocator.peak_op,
        "tensor_peak_op": live.peak_op,
        "peak_in_backward": live.peak_in_backward,
        "seconds": seconds,
        **rss,
        "by_origin": dict(sorted(live.peak_by_origin.items(), key=lambda item: -item[1])),
    }


def _backend_run(
    case: Case, recipe: Any, shape: dict[str, int]
) -> tuple[Callable[[], Any], Callable[[], list[Any]]]:
    """The phase as a call, and a function listing the tensors the actor holds between
    calls (weights, buffers, optimizer state) and the batch."""
    from bench_packed_update import Reinforce

    from plugrl.parts.context import DistInfo, PartContext
    from plugrl_cpu.device import CpuDevice
    from plugrl_fsdp2.backend import FSDP2Backend

    context = PartContext(recipe=recipe, role="actor", device=CpuDevice(), dist=DistInfo())
    backend = FSDP2Backend(recipe.actor, context)
    backend.setup(100)
    vocab = backend._hf_config.vocab_size
    batch = full_batch(shape["rows"], shape["prompt"], shape["response"], vocab, seed=0)
    objective = Reinforce()

    def held() -> list[Any]:
        assert backend.model is not None and backend.optimizer is not None
        tensors = [*backend.model.parameters(), *backend.model.buffers()]
        for state in backend.optimizer.state.values():
            tensors += [value for value in state.values() if hasattr(value, "untyped_storage")]
        return tensors + [batch[name] for name in batch]

    if case.phase == "log-prob":
        # the optimizer state exists from a run's second step on: make it before measuring
        backend.update_policy(batch.copy(), objective)
        return (lambda: backend.compute_log_prob(batch.copy(), calculate_entropy=True)), held
    return (lambda: backend.update_policy(batch.copy(), objective)), held


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


@attrs.frozen
class Estimate:
    """The plan's estimate of one role's phase: the terms held through it and those of its
    worst instant (name -> bytes)."""

    persistent: dict[str, int]
    instant: str | None
    instant_terms: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.persistent.values()) + sum(self.instant_terms.values())


def plan_estimate(case: Case, model_path: Path) -> Estimate:
    """:func:`plugrl.plan.plan_recipe`'s estimate of ``case``'s phase for the role that runs
    it alone here: the actor's log-prob pass and update, the engine's generation. Terms of
    other roles on the same device (a colocated engine's, the weight push's) are left out, as
    the measured process holds none of them."""
    from plugrl.plan import plan_recipe
    from plugrl.plugin.manager import get_plugin_manager

    plan = plan_recipe(recipe_of(case, model_path), None, get_plugin_manager())
    role = "rollout" if case.phase == "generate" else "actor"
    phase_name = case.phase.replace("-", "_")
    for phase in plan.phases:
        if phase.phase != phase_name or not any(t.role == role for t in phase.terms):
            continue
        instants = {
            name: {t.name: t.bytes for t in terms if t.role == role}
            for name, terms in phase.instants.items()
        }
        instants = {name: terms for name, terms in instants.items() if terms}
        worst = max(instants, key=lambda name: sum(instants[name].values()), default=None)
        return Estimate(
            persistent={t.name: t.bytes for t in phase.persistent if t.role == role},
            instant=worst,
            instant_terms=instants[worst] if worst else {},
        )
    raise LookupError(f"the plan has no {phase_name} phase with {role} terms")


# ---------------------------------------------------------------------------- the table


def build_models(folder: Path, names: list[str]) -> dict[str, Path]:
    from plugrl.testing import save_tiny_model

    return {name: save_tiny_model(folder / name, **MODELS[name]) for name in names}


def run_case(case: Case, model_path: Path, *, by_origin: bool = False) -> dict[str, Any]:
    """``case`` measured in a fresh subprocess."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        json.dumps({**attrs.asdict(case), "model_path": str(model_path)}),
        *(["--by-origin"] if by_origin else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, check=False)
    if done.returncode:
        raise RuntimeError(f"{case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mib(n: float, width: int) -> str:
    return f"{n / 2**20:{width}.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,qwen2-45m")
    parser.add_argument("--phases", default="log-prob,update,generate")
    parser.add_argument("--terms", action="store_true", help="print each estimate's terms")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument(
        "--measured",
        default=None,
        help="a --json file of an earlier run: its measurements are reused, only the "
        "estimates are made again (cases it lacks are measured)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--by-origin",
        action="store_true",
        help="print the bytes live at each peak per operation that made them (slower)",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.one:
        spec = json.loads(args.one)
        model_path = Path(spec.pop("model_path"))
        print(json.dumps(measure(Case(**spec), model_path, by_origin=args.by_origin)))
        return
    names = args.models.split(",")
    rows = []
    saved: dict[Case, dict[str, Any]] = {}
    if args.measured:
        # measurements are the same on every run: re-estimating them checks a new estimate
        for row in json.loads(Path(args.measured).read_text()):
            fields = attrs.fields(Case)
            case = Case(**{field.name: row.get(field.name, field.default) for field in fields})
            saved[case] = row
    with tempfile.TemporaryDirectory() as scratch:
        paths = build_models(Path(scratch), names)
        print(
            f"{'phase':<10}{'model':<11}{'config':<13}{'measured':>9}{'estimate':>9}{'ratio':>7}"
            f"   {'start':>7}{'est.':>7}   {'rise':>7}{'est.':>7}   {'tensors':>7}{'RSS':>7}"
            "  peak at"
        )
        for case in cases(names, args.phases.split(",")):
            path = paths[case.model]
            estimate = plan_estimate(case, path)
            result = saved.get(case) or run_case(case, path, by_origin=args.by_origin)
            measured, start = result["measured"], result["at_start"]
            ratio = estimate.total / measured
            where = result["peak_op"]
            print(
                f"{case.phase:<10}{case.model:<11}{case.label:<13}{_mib(measured, 9)}"
                f"{_mib(estimate.total, 9)}{ratio:7.2f}{' ' if abs(ratio - 1) <= TARGET else '!'}"
                f"  {_mib(start, 7)}{_mib(sum(estimate.persistent.values()), 7)}"
                f"   {_mib(measured - start, 7)}{_mib(sum(estimate.instant_terms.values()), 7)}"
                f"   {_mib(result['tensor_peak'], 7)}{_mib(result['rss_peak'], 7)}  {where}",
                flush=True,
            )
            if args.terms:
                for name, size in estimate.persistent.items():
                    print(f"{'':20}{_mib(size, 9)}  {name}")
                for name, size in estimate.instant_terms.items():
                    print(f"{'':20}{_mib(size, 9)}  {name} (instant: {estimate.instant})")
            if args.by_origin:
                print(f"{'':20}live at the peak, by the operation that made it:")
                for origin, size in list(result["by_origin"].items())[:12]:
                    print(f"{'':20}{_mib(size, 9)}  {origin}")
            rows.append(
                {
                    **attrs.asdict(case),
                    **result,
                    "estimate": estimate.total,
                    "estimate_terms": attrs.asdict(estimate),
                }
            )
    print(
        "MiB. measured: tensors live at the start plus the allocator's rise; start: live "
        "when the phase began; rise: peak - start; est.: the plan's persistent terms and its "
        "worst instant's; tensors: the peak of live tensor storage alone; RSS: "
        f"resident-set high-water over the phase (not compared). ! marks a ratio off by more "
        f"than {TARGET:.0%}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
