"""Throughput of plugrl's sync GRPO step on one accelerator, in the units peers publish.

For each model shape (``--shapes``; by default random-weight models of Qwen2.5-0.5B's and
Qwen2.5-1.5B's configs, bfloat16, built here: nothing is downloaded) a run of a few GRPO steps
goes through ``run_recipe`` as ``plugrl run`` does it: the ``sync`` scheduler, the ``fsdp2``
backend on the device plugin (mixed precision: bfloat16 compute, float32 weights and Adam
state), the ``hf`` rollout engine colocated in the trainer's process (it generates from its own
bfloat16 copy of the trainer's weights, refreshed at every weight sync by ``bind_model``), the
naive reward manager. Each shape runs in a process of its own, so that one that fails (out of
memory, say) leaves the next one a clean device.

What it reports per shape, from the steps after ``--warmup`` (medians):

* generation: response tokens generated per second (``timing_s/gen``);
* log-prob: the old-log-prob forward's real tokens (prompt and response, no padding) per
  second and its MFU (the batch is two mini-batches, so the run computes old log-probs in a
  pass of their own, as GPU recipes with several optimizer steps per batch do);
* update: the actor update's real tokens per second (``timing_s/update_actor``) and its MFU;
* weight sync: seconds of ``timing_s/update_weights`` and GB/s of the engine's bfloat16 copy;
* step: seconds of a whole GRPO step (``timing_s/step``) and its tokens per second;
* peak device memory (``torch.cuda.max_memory_allocated``, reset before each) of the
  generate, log-prob, update and weight-sync phases.

Every figure is per device (one device). MFU follows NeMo-RL's definition, achieved model FLOPs
over the device's peak dense bfloat16 FLOP/s: ``6 * N * T`` for a forward and backward over
``T`` real tokens (``2 * N * T`` for a forward), ``N`` the parameters that take part in matrix
products (the tied embedding counted once, as the output head). ``mfu_attn`` adds the causal
attention's score and value products, ``6 * layers * heads * head_dim * sum(len**2) / 2`` per
forward and backward (the halving: causal). Gradient checkpointing (``--grad-ckpt``) recomputes
the forward; that is not counted (model FLOPs, not hardware FLOPs).

The data are random: prompts of words drawn from a fixed list, tokenized by a tiny tokenizer
built here (the models' 151,936-row embeddings are larger than its vocabulary, as Qwen pads its
own), and responses sampled from random weights (nearly flat logits: responses run to
``max_response_length``). The reward is a hash of each response's text (the smoke test's
``spread_reward``), so that the responses of a prompt score apart and every sequence trains;
only the speed means anything here.

    python bench/bench_gpu.py [--shapes qwen2.5-0.5b,qwen2.5-1.5b] [--budget-s 420]
    python bench/bench_gpu.py --device cpu --shapes tiny --no-smoke   # the same path, on a CPU

After the shapes it runs the device's smoke test (``python -m plugrl_cuda.smoke --ranks 1``)
unless ``--no-smoke``. Prints one table and PASS/FAIL/SKIP lines; writes ``gpu-bench.json``
and ``gpu-bench.txt`` to ``--out`` (default: ``$OUT``, else ``bench/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def qwen_config(name: str) -> dict[str, Any]:
    """The config fields of a public shape that ``plugrl plan`` ships (``plugrl.plan``'s
    ``shapes/NAME.json``), with the position and norm settings the Qwen2.5 releases use."""
    from plugrl.plan.shape import named_shapes, read_config_file

    config = read_config_file(named_shapes()[name])
    config.pop("model_type", None)
    return {
        **config,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
    }


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model config and the GRPO batch a step of it runs."""

    model: dict[str, Any]
    """Config fields of the random Qwen2 model (``plugrl.testing.save_tiny_model``)."""
    prompts: int
    """Prompts per step (``data.train_batch_size``); two mini-batches of half as many."""
    n: int
    prompt_tokens: int
    response_tokens: int
    token_budget: int
    """Tokens per micro-batch of the log-prob pass and the update (``use_dynamic_bsz``)."""


SHAPES: dict[str, Shape] = {
    # the same code path at a size a CPU runs in seconds; a vocabulary larger than the
    # tokenizer's, as the Qwen shapes have
    "tiny": Shape(
        model={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 2048,
            "tie_word_embeddings": True,
            "max_position_embeddings": 512,
        },
        prompts=4,
        n=4,
        prompt_tokens=32,
        response_tokens=32,
        token_budget=1024,
    ),
    "qwen2.5-0.5b": Shape(
        model=qwen_config("qwen2.5-0.5b"),
        prompts=32,
        n=8,
        prompt_tokens=256,
        response_tokens=256,
        token_budget=8192,
    ),
    "qwen2.5-1.5b": Shape(
        model=qwen_config("qwen2.5-1.5b"),
        prompts=32,
        n=8,
        prompt_tokens=256,
        response_tokens=256,
        # the logits of 151,936 rows take 2.4 GB per 4,096 tokens in float32: half the 0.5B's
        # budget keeps the update's peak well inside 80 GB without checkpointing
        token_budget=4096,
    ),
}
DEFAULT_SHAPES = "qwen2.5-0.5b,qwen2.5-1.5b"

PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    # dense bfloat16 tensor-core peaks from the vendor's data sheets; the first name that the
    # device's name contains wins, so the narrower names come first
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
)

GEN, LOG_PROB, UPDATE, SYNC = "generate", "log_prob", "update", "weight_sync"
PHASES = (GEN, LOG_PROB, UPDATE, SYNC)
SMOKE_MIN_S = 60.0


def peak_tflops(device_name: str) -> float | None:
    """Dense bfloat16 TFLOP/s of the device called ``device_name`` (``None``: not known)."""
    for part, tflops in PEAK_BF16_TFLOPS:
        if part.lower() in device_name.lower():
            return tflops
    return None


def matmul_parameters(config: Any, total: int) -> int:
    """Parameters that take part in a token's matrix products: all of them but an untied
    input embedding (a lookup); a tied one is counted once, as the output head."""
    if getattr(config, "tie_word_embeddings", False):
        return total
    return total - config.vocab_size * config.hidden_size


def attention_width(config: Any) -> int:
    """Query heads times head width: the inner size of the attention's score products."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_attention_heads * head_dim


def approximate_parameters(model: dict[str, Any]) -> int:
    """A Qwen2 config's parameters from its sizes, counted as ``plugrl plan`` counts them."""
    from plugrl.plan.shape import shape_from_config

    return shape_from_config({"model_type": "qwen2", **model}, "bench", "bench_gpu").parameters()


def model_flops(
    parameters: int, layers: int, width: int, lengths: Sequence[int], *, backward: bool
) -> tuple[float, float]:
    """``(dense, attention)`` FLOPs of a forward (and backward, 2x more, with ``backward``)
    over sequences of ``lengths`` real tokens: ``2 * N`` per token for the dense products, and
    the causal score and value products, ``2 * layers * width * len**2`` per sequence."""
    factor = 3 if backward else 1
    tokens = sum(lengths)
    dense = 2.0 * parameters * tokens * factor
    attention = 2.0 * layers * width * sum(length * length for length in lengths) * factor
    return dense, attention


# ------------------------------------------------------------------------------ the worker


def build_model(folder: Path, shape: Shape) -> Path:
    """The shape's random bfloat16 model and the tiny tokenizer under ``folder`` (reused)."""
    from plugrl.testing import save_tiny_model

    if (folder / "config.json").exists():
        return folder
    staging = folder.with_name(folder.name + ".tmp")
    save_tiny_model(staging, seed=0, dtype="bfloat16", **shape.model)
    staging.rename(folder)
    return folder


def prompt_texts(tokenizer: Any, count: int, max_tokens: int, seed: int) -> list[str]:
    """``count`` prompts of words from a fixed list, each as long as fits in ``max_tokens``
    once the chat template wraps it."""
    from plugrl.testing.tiny import GENERAL_TEXTS

    words = [word for text in GENERAL_TEXTS for word in text.split()]
    rng = random.Random(seed)

    def length(text: str) -> int:
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    texts = []
    for _ in range(count):
        chosen: list[str] = []
        step = 16
        while step:
            candidate = chosen + [rng.choice(words) for _ in range(step)]
            if length(" ".join(candidate)) <= max_tokens:
                chosen = candidate
            else:
                step //= 2
        texts.append(" ".join(chosen))
    return texts


def write_data(path: Path, tokenizer: Any, shape: Shape, steps: int) -> Path:
    """A parquet of ``steps`` batches of prompts in verl's schema."""
    from plugrl_tools.quickstart.arithmetic import verl_row, write_rows

    texts = prompt_texts(tokenizer, shape.prompts * steps, shape.prompt_tokens, seed=0)
    rows = [verl_row(text, 0, split="train", index=i) for i, text in enumerate(texts)]
    return write_rows(rows, path)


def recipe_dict(
    shape: Shape, model: Path, data: Path, run_dir: Path, device: str, steps: int, grad_ckpt: bool
) -> dict[str, Any]:
    from plugrl_tools.quickstart.untrained import SPREAD_REWARD_FILE

    return {
        "model": {
            "path": str(model),
            "dtype": "bfloat16",
            "enable_gradient_checkpointing": grad_ckpt,
        },
        "data": {
            "train_files": [str(data)],
            "val_files": [],
            "train_batch_size": shape.prompts,
            "max_prompt_length": shape.prompt_tokens,
            "max_response_length": shape.response_tokens,
        },
        "device": device,
        "actor": {
            "backend": "fsdp2",
            "ppo_mini_batch_size": max(shape.prompts // 2, 1),
            "ppo_epochs": 1,
            "use_dynamic_bsz": True,
            "ppo_max_token_len_per_gpu": shape.token_budget,
            # every sequence trains, whatever the hash gave: the tokens per step are fixed
            "skip_zero_advantage_rows": False,
            "loss_agg_mode": "token-mean",
            "optim": {"lr": 1.0e-6},
        },
        "rollout": {"engine": "hf", "n": shape.n, "temperature": 1.0, "dtype": "bfloat16"},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"manager": "naive", "custom_function": {"path": str(SPREAD_REWARD_FILE)}},
        "trainer": {
            "default_local_dir": str(run_dir),
            "total_training_steps": steps,
            "save_freq": -1,
            "test_freq": -1,
            "val_before_train": False,
            "export_hf": False,
            "logger": ["jsonl"],
            "seed": 0,
        },
        "cluster": "local",
    }


class PhaseProbe:
    """Wraps the sync scheduler's phases: each ends with the device synchronized (so the
    step's timer holds the device's time) and records its peak memory and tokens; the phase
    running when a step fails is :attr:`current`."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.current: str | None = None
        self.steps: list[dict[str, Any]] = []
        self.record: dict[str, Any] = {}

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def wrap(self, phase: str, function: Callable[..., Any], count: Callable[..., None]) -> Any:
        def probed(*args: Any, **kwargs: Any) -> Any:
            self.current = phase
            if self.cuda:
                import torch

                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            result = function(*args, **kwargs)
            self._sync()
            if self.cuda:
                import torch

                self.record[f"{phase}_peak_gib"] = torch.cuda.max_memory_allocated() / 1024**3
            count(self.record, args, result)
            self.current = None
            return result

        return probed

    def install(self) -> None:
        import plugrl_sync.scheduler as scheduler
        from plugrl.compose.run_parts import RunParts

        def count_generated(record: dict[str, Any], args: Any, batch: Any) -> None:
            record["response_tokens"] = int(batch["response_mask"].sum())
            record["rows"] = len(batch)

        def count_batch(key: str) -> Callable[..., None]:
            def count(record: dict[str, Any], args: Any, result: Any) -> None:
                batch = args[1]
                record[key] = [int(n) for n in batch["attention_mask"].sum(-1).tolist()]

            return count

        scheduler.generate = self.wrap(GEN, scheduler.generate, count_generated)
        scheduler.compute_old_log_probs = self.wrap(
            LOG_PROB, scheduler.compute_old_log_probs, count_batch("log_prob_lengths")
        )
        scheduler.update_from_batch = self.wrap(
            UPDATE, scheduler.update_from_batch, count_batch("update_lengths")
        )
        RunParts.sync_weights = self.wrap(SYNC, RunParts.sync_weights, lambda *_: None)

    def step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self.record.update(
            step=step,
            timing={
                k.removeprefix("timing_s/"): float(v)
                for k, v in metrics.items()
                if k.startswith("timing_s/")
            },
            throughput=float(metrics.get("perf/throughput", 0.0)),
        )
        self.steps.append(self.record)
        self.record = {}


def summarize(
    steps: list[dict[str, Any]], warmup: int, model_info: dict[str, Any], peak: float | None
) -> dict[str, Any]:
    """The medians of the measured steps in this bench's units."""
    measured = steps[warmup:] or steps[-1:]
    parameters = model_info["matmul_parameters"]
    layers, width = model_info["layers"], model_info["attention_width"]

    def median(values: list[float]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def rate(key: str, timing: str, backward: bool) -> dict[str, Any]:
        tokens, per_s, mfu, mfu_attn = [], [], [], []
        for record in measured:
            lengths, seconds = record.get(key), record["timing"].get(timing)
            if not lengths or not seconds:
                continue
            dense, attention = model_flops(parameters, layers, width, lengths, backward=backward)
            tokens.append(sum(lengths))
            per_s.append(sum(lengths) / seconds)
            if peak:
                mfu.append(dense / seconds / (peak * 1e12))
                mfu_attn.append((dense + attention) / seconds / (peak * 1e12))
        return {
            "tokens": median(tokens),
            "seconds": median([r["timing"].get(timing) for r in measured]),
            "tokens_per_s": median(per_s),
            "mfu": median(mfu),
            "mfu_attn": median(mfu_attn),
        }

    gen_rates = [
        r["response_tokens"] / r["timing"]["gen"]
        for r in measured
        if r.get("response_tokens") and r["timing"].get("gen")
    ]
    sync_s = median([r["timing"].get("update_weights") for r in measured])
    sync_bytes = model_info["parameters"] * 2  # the engine's bfloat16 copy
    peaks = {
        phase: max(
            (r[f"{phase}_peak_gib"] for r in steps if f"{phase}_peak_gib" in r), default=None
        )
        for phase in PHASES
    }
    return {
        "measured_steps": len(measured),
        "generate": {
            "response_tokens": median([r.get("response_tokens") for r in measured]),
            "rows": median([r.get("rows") for r in measured]),
            "seconds": median([r["timing"].get("gen") for r in measured]),
            "tokens_per_s": median(gen_rates),
        },
        "log_prob": rate("log_prob_lengths", "old_log_prob", backward=False),
        "update": rate("update_lengths", "update_actor", backward=True),
        "weight_sync": {
            "seconds": sync_s,
            "gigabytes": sync_bytes / 1e9,
            "gb_per_s": sync_bytes / 1e9 / sync_s if sync_s else None,
            "path": "colocated hf engine: bind_model copies the fsdp2 module's weights into "
            "the engine's bfloat16 module",
        },
        "step": {
            "seconds": median([r["timing"].get("step") for r in measured]),
            "tokens_per_s": median([r.get("throughput") for r in measured]),
        },
        "max_memory_allocated_gib": peaks,
    }


def describe_model(folder: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    return {
        "parameters": total,
        "matmul_parameters": matmul_parameters(config, total),
        "layers": config.num_hidden_layers,
        "attention_width": attention_width(config),
        "config": {k: getattr(config, k, None) for k in SHAPES["qwen2.5-0.5b"].model},
    }


def run_shape(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build the shape's model and data, run its steps through ``run_recipe``, summarize."""
    shape = SHAPES[name]
    result: dict[str, Any] = {"shape": name, "status": "failed", "phase": "build"}
    workdir = Path(args.workdir) / name
    workdir.mkdir(parents=True, exist_ok=True)
    probe = PhaseProbe(args.device)
    try:
        import yaml
        from transformers import AutoTokenizer

        import plugrl
        from plugrl.plugin.manager import get_plugin_manager
        from plugrl.recipe import load_recipe
        from plugrl.run.runner import run_recipe

        start = time.perf_counter()
        model = build_model(workdir / "model", shape)
        result["build_s"] = time.perf_counter() - start
        result["model"] = describe_model(model)
        plugins = get_plugin_manager()
        raw = recipe_dict(
            shape,
            model,
            workdir / "train.parquet",
            workdir / "run",
            args.device,
            args.steps,
            args.grad_ckpt,
        )
        write_data(
            workdir / "train.parquet", AutoTokenizer.from_pretrained(model), shape, args.steps
        )
        recipe_file = workdir / "recipe.yaml"
        recipe_file.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        recipe = load_recipe(str(recipe_file), list(args.set), plugins)
        result["overrides"] = list(args.set)
        result["batch"] = {
            "prompts": shape.prompts,
            "n": shape.n,
            "max_prompt_length": shape.prompt_tokens,
            "max_response_length": shape.response_tokens,
            "token_budget": shape.token_budget,
            "mini_batches": 2 if shape.prompts > 1 else 1,
            "gradient_checkpointing": args.grad_ckpt,
        }
        result["device_name"], result["peak_tflops"] = device_and_peak(args)
        probe.install()

        class StepRecorder:
            @plugrl.hookimpl
            def on_step_end(self, step: int, metrics: Any) -> None:
                probe.step_end(step, dict(metrics))
                print(
                    f"[{name}] step {step}: {probe.steps[-1]['timing'].get('step', 0):.2f} s",
                    flush=True,
                )

        plugins.register(StepRecorder(), name="bench-gpu-steps")
        result["phase"] = "run"
        start = time.perf_counter()
        run_recipe(recipe, plugins)
        result["run_s"] = time.perf_counter() - start
        result["phase"] = None
        result["steps"] = probe.steps
        result.update(summarize(probe.steps, args.warmup, result["model"], result["peak_tflops"]))
        result["status"] = "passed"
    except BaseException as exc:
        phase = probe.current or result["phase"]
        result["phase"] = phase
        result["steps"] = probe.steps
        text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        out_of_memory = "out of memory" in str(exc).lower() or "OutOfMemory" in type(exc).__name__
        result["error"] = ("out of memory: " if out_of_memory else "") + text[:500]
        result["out_of_memory"] = out_of_memory
        traceback.print_exc()
    return result


def device_and_peak(args: argparse.Namespace) -> tuple[str, float | None]:
    if args.device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0)
    else:
        import platform

        name = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return name, args.peak_tflops or peak_tflops(name)


# ------------------------------------------------------------------------------ the driver


def run_worker(name: str, args: argparse.Namespace, timeout: float, logs: Path) -> dict[str, Any]:
    """Run one shape in a process of its own; its result, or why there is none."""
    result_file = Path(args.workdir) / f"{name}-result.json"
    result_file.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        name,
        "--result",
        str(result_file),
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--workdir",
        args.workdir,
    ]
    if args.peak_tflops:
        command += ["--peak-tflops", str(args.peak_tflops)]
    if args.grad_ckpt:
        command.append("--grad-ckpt")
    for override in args.set:
        command += ["--set", override]
    log = logs / f"gpu-bench-{name}.log"
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as output:
        try:
            returncode = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            returncode = None
    wall = time.perf_counter() - start
    if result_file.exists():
        result = json.loads(result_file.read_text(encoding="utf-8"))
    else:
        tail = log.read_text(encoding="utf-8", errors="replace")[-1500:]
        why = (
            f"ran past its {timeout:.0f} s of the budget"
            if returncode is None
            else f"its process exited {returncode} without a result"
        )
        out_of_memory = "out of memory" in tail.lower()
        result = {
            "shape": name,
            "status": "failed",
            "phase": None,
            "error": ("out of memory: " if out_of_memory else "") + why,
            "out_of_memory": out_of_memory,
            "log_tail": tail,
        }
    result["wall_s"] = wall
    result["log"] = log.name
    return result


def run_smoke(args: argparse.Namespace, timeout: float) -> dict[str, Any]:
    """The device's smoke test (``python -m plugrl_<device>.smoke --ranks 1``), captured."""
    command = [sys.executable, "-m", f"plugrl_{args.device}.smoke", "--ranks", "1"]
    if args.device == "cpu":
        command = [sys.executable, "-m", "plugrl_cuda.smoke", "--device", "cpu", "--ranks", "1"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = None
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    lines = [line for line in stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    return {
        "command": " ".join(command[1:]),
        "returncode": returncode,
        "seconds": time.perf_counter() - start,
        "passed": returncode == 0,
        "checks": lines,
        "stdout": stdout[-4000:],
        "stderr_tail": stderr[-3000:] if returncode != 0 else "",
    }


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: list[dict[str, Any]], device: str) -> str:
    header = (
        "| shape | params | gen tok/s | log-prob tok/s (MFU) | update tok/s | update MFU "
        "(+attn) | sync s (GB/s) | step s | step tok/s | peak GiB gen/lp/upd/sync |"
    )
    rows = [
        f"GRPO step on {device}, per device; random weights and data (speed only)",
        "",
        header,
        "|" + " --- |" * 10,
    ]
    for r in results:
        if r.get("status") != "passed":
            reason = r.get("error") or r.get("status")
            rows.append(f"| {r['shape']} | {r['status'].upper()}: {reason} |" + " |" * 8)
            continue
        g, lp, u, s, st = (r[k] for k in ("generate", "log_prob", "update", "weight_sync", "step"))
        peaks = r["max_memory_allocated_gib"]
        rows.append(
            f"| {r['shape']} | {r['model']['parameters'] / 1e9:.2f}B "
            f"| {fmt(g['tokens_per_s'], ',.0f')} "
            f"| {fmt(lp['tokens_per_s'], ',.0f')} ({fmt(lp['mfu'], '.1%')}) "
            f"| {fmt(u['tokens_per_s'], ',.0f')} "
            f"| {fmt(u['mfu'], '.1%')} ({fmt(u['mfu_attn'], '.1%')}) "
            f"| {fmt(s['seconds'], '.3f')} ({fmt(s['gb_per_s'], '.1f')}) "
            f"| {fmt(st['seconds'], '.2f')} | {fmt(st['tokens_per_s'], ',.0f')} "
            f"| {'/'.join(fmt(peaks[p], '.1f') for p in PHASES)} |"
        )
    return "\n".join(rows)


def verdict(result: dict[str, Any]) -> str:
    name = result["shape"]
    if result["status"] == "skipped":
        return f"SKIP {name}: {result['error']}"
    if result["status"] != "passed":
        where = f" ({result['phase']})" if result.get("phase") else ""
        return f"FAIL {name}{where}: {result.get('error')}"
    batch = result["batch"]
    return (
        f"PASS {name}: {result['measured_steps']} measured steps of {batch['prompts']} x "
        f"{batch['n']} rows, {result['wall_s']:.0f} s with the model's build"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when present)")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per shape")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="seconds for all shapes: a shape that would not finish in what is left is skipped",
    )
    parser.add_argument(
        "--total-s",
        type=float,
        default=470.0,
        help="seconds for everything: the smoke test runs in what the shapes left of this",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak")
    parser.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing")
    parser.add_argument("--no-smoke", action="store_true", help="skip the device's smoke test")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for every shape (model.lora_rank=32, say); repeatable",
    )
    parser.add_argument("--out", default=None, help="default: $OUT, else bench/results")
    parser.add_argument("--workdir", default=None, help="models and runs (default: a temp dir)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.worker:
        result = run_shape(args.worker, args)
        Path(args.result).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        return 0

    began = time.perf_counter()
    names = [name.strip() for name in args.shapes.split(",") if name.strip()]
    unknown = [name for name in names if name not in SHAPES]
    if unknown:
        raise SystemExit(f"--shapes: unknown {', '.join(unknown)}; choose of {', '.join(SHAPES)}")
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must be more than --warmup {args.warmup}")
    if args.device == "auto":
        try:
            import torch
        except ImportError:
            raise SystemExit("bench_gpu needs torch: pip install -e .") from None
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="plugrl-gpu-bench-")
    device_name, peak = device_and_peak(args)
    print(
        f"device: {device_name}; peak bf16 {fmt(peak, '.0f')} TFLOP/s; work in {args.workdir}",
        flush=True,
    )

    results: list[dict[str, Any]] = []
    last_wall, last_params = None, None
    for name in names:
        left = args.budget_s - (time.perf_counter() - began)
        params = approximate_parameters(SHAPES[name].model)
        # a larger shape takes about its size ratio times the last one's time, less as the
        # build, the imports and the decode loop's launches do not grow with it
        ratio = min(max(1.0, params / last_params), 2.5) if last_params else 1.0
        projected = last_wall * ratio if last_wall else 0.0
        if left < 30 or projected > left:
            results.append(
                {
                    "shape": name,
                    "status": "skipped",
                    "error": f"{left:.0f} s of --budget-s left, about {projected:.0f} needed",
                }
            )
        else:
            results.append(run_worker(name, args, left, out))
            last_wall, last_params = results[-1]["wall_s"], params
        print(verdict(results[-1]), flush=True)

    smoke = None
    if not args.no_smoke:
        left = args.total_s - (time.perf_counter() - began)
        if left >= SMOKE_MIN_S:
            smoke = run_smoke(args, left)
            for line in smoke["checks"]:
                print(f"  smoke {line}", flush=True)
            state = "PASS" if smoke["passed"] else "FAIL"
            extra = "" if smoke["returncode"] is not None else f" (ran past {left:.0f} s)"
            print(f"{state} smoke: {smoke['command']}{extra}, {smoke['seconds']:.0f} s", flush=True)
        else:
            smoke = {"passed": None, "skipped": f"{left:.0f} s of --total-s left"}
            print(f"SKIP smoke: only {left:.0f} s of --total-s left", flush=True)

    report = table(results, device_name)
    print("\n" + report, flush=True)
    notes = (
        "tok/s: real tokens (prompt + response, no padding) per second per device, but "
        "generation: response tokens generated per second. MFU: 6*N*T (update) or 2*N*T "
        "(log-prob) over the peak bf16 FLOP/s; +attn adds the causal attention products. "
        "Random weights, random prompts and a hash reward: only the speed means anything."
    )
    print(notes)
    document = {
        "device": device_name,
        "device_kind": args.device,
        "peak_tflops": peak,
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "budget_s": args.budget_s,
        "seconds": time.perf_counter() - began,
        "notes": notes,
        "shapes": results,
        "smoke": smoke,
    }
    (out / "gpu-bench.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    lines = [verdict(r) for r in results]
    if smoke and "checks" in smoke:
        lines += [f"smoke {line}" for line in smoke["checks"]]
    (out / "gpu-bench.txt").write_text(
        "\n".join([report, "", notes, "", *lines]) + "\n", encoding="utf-8"
    )
    print(f"wrote {out / 'gpu-bench.json'} and {out / 'gpu-bench.txt'}")
    failed = any(r["status"] == "failed" for r in results) or (smoke and smoke["passed"] is False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
