"""plugrl's sync GRPO step against TRL's ``GRPOTrainer`` on the same model, data and batch.

Both train the quickstart model (tiny Qwen2, float32, CPU) on the quickstart's arithmetic task:
32 prompts per step, 8 samples per prompt, at most 48 response tokens, temperature 1, AdamW at
lr 1e-4 (weight decay 0.01, constant schedule, gradient-norm clip 1.0), one optimizer step
over all 256 samples per batch, no KL term, no gradient checkpointing, and the same reward:
plugrl's ``plugrl/arithmetic`` scorer, which TRL calls through a reward-function wrapper.
Every step both see the same prompts (TRL's dataset is laid out in the order plugrl's loader
draws them, and the bench checks that TRL's prompt token ids equal plugrl's each step).

* plugrl runs as ``plugrl run`` does (``run_recipe``: sync scheduler, fsdp2, hf engine,
  naive reward manager, its default console and jsonl loggers).
* TRL runs ``GRPOTrainer.train()`` with its own defaults where they are fair: generation by
  ``model.generate`` with the KV cache, the fused AdamW kernel, ``loss_type="dapo"`` (plugrl's
  ``token-mean``), group-normalised advantages, and no old-log-prob pass (on-policy with one
  optimizer step per batch, both reuse the detached log-probs of the update's forward). Set for
  the comparison: ``use_cpu``, ``bf16=False``, ``activation_checkpointing=False`` (TRL turns
  gradient checkpointing on by default; plugrl leaves it off), ``beta=0``,
  ``lr_scheduler_type="constant"``, ``weight_decay=0.01`` (TRL exempts biases and norm weights
  from it, plugrl does not: same cost), ``top_k=0``, ``shuffle_dataset=False``,
  ``logging_steps=1``, ``report_to="none"``, ``disable_tqdm=True``.

Each framework runs in its own process (spawned, with the same torch thread count). The two
step in lock-step: the driver lets one take a step while the other waits, alternating which
goes first, so both see the same machine load. A step's time is the wall time of one loop
iteration of the real runner, from the driver's "go" to the step-end callback. The first
``--warmup`` steps (set-up included in the first) are dropped; the table shows medians over
the measured steps and the phase breakdown each framework reports.

Set-up (TRL is a bench-only dependency, never one of plugrl's):

    python3 -m venv .venv-bench
    .venv-bench/bin/pip install -c constraints/cpu.txt -e . "trl==1.16.0"
    .venv-bench/bin/python bench/bench_grpo_vs_trl.py [--steps 8] [--warmup 2] [--threads 2]

trl 1.16.0 installs with transformers 5.23.0 and the CPU build of torch 2.13.0 (it brings
accelerate 1.15 and datasets 5.2).

Batching (always one optimizer step per batch): ``--batching budget`` (default) runs plugrl
as recipes/quickstart.yaml ships, with token-budget micro-batches of 4096 tokens, and TRL with
micro-batches of 64 samples, about as many tokens; ``--batching whole`` gives both one
forward/backward over all 256 samples.

Measured on the 2-core development machine (``--threads 2``, 8 measured steps after 2 warm-up
steps, runs started while the machine was quiet; both at 26.5-26.6 mean response tokens):

    batching                          plugrl s/step   TRL s/step   plugrl/TRL   paired per step
      budget, run 1                   2.80            4.28         0.65x        0.66x (0.63-0.76)
      budget, run 2                   2.98            4.51         0.66x        0.66x (0.64-0.76)
      budget, run 3                   2.65            4.01         0.66x        0.65x (0.62-0.75)
      whole, run 1                    3.56            4.37         0.81x        0.84x (0.79-0.96)
      whole, run 2                    3.55            4.55         0.78x        0.78x (0.69-0.93)
      whole, run 3                    3.71            4.19         0.89x        0.90x (0.80-1.00)

    median phases, budget (s)     gen        reward  old_log_prob  adv   update
      plugrl                      0.64-0.80  0.01    (skipped)     0.00  1.99-2.19
      TRL                         1.23-1.43  0.002   (skipped)     0.01  2.76-3.02

plugrl generates in half TRL's time (its engine drops finished rows from the batch and the KV
cache; ``model.generate`` keeps all 256 rows running to the longest). Neither runs an
old-log-prob pass: the update is exactly on-policy, so both take old log-probs from its own
forward. In micro-batches plugrl's update is about 0.7x TRL's (length-grouped rows carry little
padding); over the whole batch the update is the same work on both sides.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SETUP_COMMAND = (
    "python3 -m venv .venv-bench && "
    '.venv-bench/bin/pip install -c constraints/cpu.txt -e . "trl==1.16.0"'
)
PLUGRL_PHASES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")
# recipes/quickstart.yaml's micro-batching (checked against the recipe at start), and TRL's
# micro-batch of about as many tokens (64 rows of at most 32 + 48 tokens)
QUICKSTART_TOKEN_BUDGET = 4096
TRL_MICRO_BATCH = 64
STEP_TIMEOUT_S = 900.0


class StopBench(Exception):
    """Raised in a worker's step-end callback to end its run once the driver has enough."""


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """What both sides train on and how; passed to the worker processes."""

    model_path: str
    train_file: str
    run_dir: str
    threads: int
    total_steps: int
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_prompt_length: int = 32
    max_response_length: int = 48
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    clip_ratio: float = 0.2
    temperature: float = 1.0
    seed: int = 42
    token_budget: int | None = QUICKSTART_TOKEN_BUDGET
    """plugrl's tokens per forward/backward (``use_dynamic_bsz``); ``None``: the whole batch."""
    trl_micro_batch: int | None = TRL_MICRO_BATCH
    """TRL's samples per forward/backward; ``None``: the whole batch."""
    extra_plugrl_overrides: tuple[str, ...] = ()
    dtype: str = "float32"
    """float32 on both sides, or bfloat16: plugrl's mixed precision (float32 weights and
    optimizer, bfloat16 compute; ``model.dtype`` and ``rollout.dtype``) against TRL's
    ``bf16=True`` (float32 weights under bfloat16 autocast)."""

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    def plugrl_overrides(self) -> list[str]:
        """The recipe of the plugrl side, as ``plugrl run`` overrides."""
        return [
            f"model.path={self.model_path}",
            f"model.dtype={self.dtype}",
            f"rollout.dtype={self.dtype}",
            f"data.train_files=[{self.train_file}]",
            f"data.train_batch_size={self.prompts_per_step}",
            f"data.max_prompt_length={self.max_prompt_length}",
            f"data.max_response_length={self.max_response_length}",
            "device=cpu",
            "actor.backend=fsdp2",
            f"actor.ppo_mini_batch_size={self.prompts_per_step}",
            f"actor.optim.lr={self.learning_rate}",
            f"actor.optim.weight_decay={self.weight_decay}",
            f"actor.grad_clip={self.grad_clip}",
            f"actor.clip_ratio={self.clip_ratio}",
            "rollout.engine=hf",
            f"rollout.n={self.samples_per_prompt}",
            f"rollout.temperature={self.temperature}",
            "algorithm.adv_estimator=grpo",
            "reward.manager=naive",
            # one more step than the driver asks for, so the final checkpoint is never written
            f"trainer.total_training_steps={self.total_steps + 1}",
            f"trainer.default_local_dir={Path(self.run_dir) / 'plugrl'}",
            f"trainer.seed={self.seed}",
            *(
                [
                    "actor.use_dynamic_bsz=true",
                    f"actor.ppo_max_token_len_per_gpu={self.token_budget}",
                ]
                if self.token_budget
                else []
            ),
            *self.extra_plugrl_overrides,
        ]


# ------------------------------------------------------------------------------------ workers


def _start_worker(settings: BenchSettings, name: str) -> None:
    """Send this process's output to its log file and fix its torch thread count."""
    log = open(Path(settings.run_dir) / f"{name}.log", "w", buffering=1)  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    import torch

    torch.set_num_threads(settings.threads)


def _send_step(conn: Any, step: int, phases: dict[str, float], response_length: float) -> None:
    """Report a finished step, then wait for the driver's next word."""
    conn.send(("step", step, phases, response_length))
    if conn.recv() == "stop":
        raise StopBench


def plugrl_worker(conn: Any, settings: BenchSettings) -> None:
    """Run plugrl's sync GRPO loop through ``run_recipe``, one step per driver "go"."""
    _start_worker(settings, "plugrl")
    import plugrl
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl.run.runner import run_recipe

    class LockStep:
        @plugrl.hookimpl
        def on_step_end(self, step: int, metrics: Any) -> None:
            phases = {
                name: float(metrics[f"timing_s/{name}"])
                for name in (*PLUGRL_PHASES, "step")
                if f"timing_s/{name}" in metrics
            }
            _send_step(conn, step, phases, float(metrics["response_length/mean"]))

    plugins = get_plugin_manager()
    plugins.register(LockStep(), name="bench-lockstep")
    recipe = load_recipe(None, settings.plugrl_overrides(), plugins)
    try:
        run_recipe(recipe, plugins)
    except StopBench:
        pass
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def _trl_rows(settings: BenchSettings) -> tuple[list[dict[str, Any]], list[list[list[int]]]]:
    """TRL's training rows, in the order plugrl's loader draws the prompts, and for each step
    the prompt token ids plugrl generates from (each repeated once per sample)."""
    import pyarrow.parquet as pq

    from plugrl.data.dataset import PromptDataset, PromptLoader, load_tokenizer, pad_token_id_of
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe

    recipe = load_recipe(None, settings.plugrl_overrides(), get_plugin_manager())
    tokenizer = load_tokenizer(recipe.model)
    dataset = PromptDataset.train(recipe.data, tokenizer)
    messages = pq.read_table(settings.train_file, columns=["prompt"]).column("prompt").to_pylist()
    if len(dataset) != len(messages):
        raise RuntimeError("plugrl dropped prompts from the training file; indices would not match")
    loader = PromptLoader.for_training(dataset, recipe.data, pad_token_id_of(tokenizer))
    rows: list[dict[str, Any]] = []
    prompt_ids: list[list[list[int]]] = []
    for _ in range(settings.total_steps + 1):
        batch = loader.next_batch()
        for row in range(len(batch)):
            rows.append(
                {
                    "prompt": messages[batch["index"][row]],
                    "data_source": batch["data_source"][row],
                    "ground_truth": batch["ground_truth"][row],
                    "extra_info": batch["extra_info"][row],
                }
            )
        prompt_ids.append(
            [
                list(ids)
                for ids in batch["raw_prompt_ids"]
                for _ in range(settings.samples_per_prompt)
            ]
        )
    return rows, prompt_ids


def _plugrl_reward_function(settings: BenchSettings) -> Any:
    """plugrl's scorer for each row's data source, as a TRL reward function."""
    from plugrl.parts.scoring import make_resolver
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe

    plugins = get_plugin_manager()
    resolve = make_resolver(load_recipe(None, settings.plugrl_overrides(), plugins), plugins)

    def plugrl_scorer(
        prompts: list[Any],
        completions: list[Any],
        data_source: list[str],
        ground_truth: list[Any],
        extra_info: list[Any],
        **_: Any,
    ) -> list[float]:
        scores = []
        for completion, source, truth, extra in zip(
            completions, data_source, ground_truth, extra_info, strict=True
        ):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            score, _extras = resolve(source).score_sample(
                data_source=source, solution_str=text, ground_truth=truth, extra_info=extra
            )
            scores.append(score)
        return scores

    return plugrl_scorer


def trl_worker(conn: Any, settings: BenchSettings) -> None:
    """Run TRL's ``GRPOTrainer.train()``, one step per driver "go", timing its phases."""
    _start_worker(settings, "trl")
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows, expected_prompt_ids = _trl_rows(settings)

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with timers around its phases; behaviour unchanged."""

        phases: dict[str, float]
        marks: dict[str, float]

        def _timed(self, name: str, method: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

        def _tokenize_prompts(self, prompts: list) -> Any:
            prompt_ids, *rest = super()._tokenize_prompts(prompts)
            expected = expected_prompt_ids[self.state.global_step]
            if [list(ids) for ids in prompt_ids] != expected:
                raise RuntimeError(
                    f"step {self.state.global_step + 1}: TRL's prompt token ids differ from "
                    "plugrl's; the two would not train on the same prompts"
                )
            return (prompt_ids, *rest)

        def _generate(self, prompts: list) -> Any:
            return self._timed("gen", super()._generate, prompts)

        def _calculate_rewards(self, *args: Any) -> Any:
            return self._timed("reward", super()._calculate_rewards, *args)

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            return self._timed("rollout", super()._generate_and_score_completions, inputs)

        def _prepare_inputs(self, generation_batch: Any) -> Any:
            result = self._timed("prepare", super()._prepare_inputs, generation_batch)
            # the first call of a step generates; the update starts after it
            self.marks.setdefault("prepared", time.perf_counter())
            return result

        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            return self._timed("loss_forward", super().compute_loss, *args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            result = self._timed("training_step", super().training_step, *args, **kwargs)
            self.marks["backward_done"] = time.perf_counter()
            return result

    class LockStep(TrainerCallback):
        trainer: TimedGRPOTrainer

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.trainer.marks["optimizer_start"] = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.trainer.marks["optimizer_done"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            trainer = self.trainer
            times, marks = trainer.phases, trainer.marks
            backward = times["training_step"] - times["prepare"] - times["loss_forward"]
            phases = {
                "gen": times["gen"],
                "reward": times["reward"],
                "adv": times["rollout"] - times["gen"] - times["reward"],
                "update": marks["optimizer_done"] - marks["prepared"],
                "loss_forward": times["loss_forward"],
                "backward": backward,
                "clip_grad": marks["optimizer_start"] - marks["backward_done"],
                "optimizer": marks["optimizer_done"] - marks["optimizer_start"],
            }
            trainer.phases, trainer.marks = {}, {}
            lengths = trainer._metrics["train"]["completions/mean_length"]
            _send_step(conn, state.global_step, phases, float(lengths[-1]))

    micro_batch = settings.trl_micro_batch or settings.samples_per_step
    tokenizer = AutoTokenizer.from_pretrained(settings.model_path)
    model = AutoModelForCausalLM.from_pretrained(settings.model_path, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=str(Path(settings.run_dir) / "trl"),
        use_cpu=True,
        bf16=settings.dtype == "bfloat16",
        fp16=False,
        use_vllm=False,
        activation_checkpointing=False,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=settings.samples_per_step // micro_batch,
        num_generations=settings.samples_per_prompt,
        max_completion_length=settings.max_response_length,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=settings.learning_rate,
        weight_decay=settings.weight_decay,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=settings.grad_clip,
        epsilon=settings.clip_ratio,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        max_steps=settings.total_steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=settings.seed,
    )
    lock_step = LockStep()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=_plugrl_reward_function(settings),
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[lock_step],
    )
    if getattr(trainer.model, "is_activation_checkpointing", False):
        raise RuntimeError("TRL's model recomputes activations; plugrl's does not")
    trainer.phases, trainer.marks = {}, {}
    lock_step.trainer = trainer
    try:
        trainer.train()
    except StopBench:
        pass
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


# ------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class Side:
    """One framework's worker process and what it measured."""

    name: str
    process: Any
    conn: Any
    log: Path
    walls: list[float] = dataclasses.field(default_factory=list)
    phases: list[dict[str, float]] = dataclasses.field(default_factory=list)
    lengths: list[float] = dataclasses.field(default_factory=list)

    def receive(self) -> tuple[int, dict[str, float], float]:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not self.conn.poll(1.0):
            if not self.process.is_alive() or time.monotonic() > deadline:
                raise SystemExit(
                    f"the {self.name} worker stopped without finishing its step "
                    f"(exit code {self.process.exitcode}); see {self.log}"
                )
        message = self.conn.recv()
        if message[0] == "error":
            raise SystemExit(f"the {self.name} worker failed: {message[1]}; see {self.log}")
        _, step, phases, length = message
        return step, phases, length

    def step(self, keep: bool) -> None:
        start = time.perf_counter()
        self.conn.send("go")
        _, phases, length = self.receive()
        if keep:
            self.walls.append(time.perf_counter() - start)
            self.phases.append(phases)
            self.lengths.append(length)

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # the worker may already be gone
            self.conn.send("stop")
        self.process.join(timeout=120)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


def start_side(name: str, target: Any, settings: BenchSettings) -> Side:
    """Spawn a worker and wait until it has finished its first (set-up) step."""
    context = multiprocessing.get_context("spawn")
    driver_end, worker_end = context.Pipe()
    process = context.Process(target=target, args=(worker_end, settings), name=f"bench-{name}")
    process.start()
    worker_end.close()
    side = Side(name, process, driver_end, Path(settings.run_dir) / f"{name}.log")
    side.receive()
    return side


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _phase(side: Side, name: str) -> float:
    values = [phases[name] for phases in side.phases if name in phases]
    return _median(values)


def report(plugrl: Side, trl: Side, settings: BenchSettings) -> None:
    import torch
    import trl as trl_package

    def cell(value: float) -> str:
        return f"{value:>10.3f}" if value == value else f"{'-':>10}"

    print(
        f"GRPO step, quickstart model ({settings.dtype}, cpu, {settings.threads} threads): "
        f"{settings.prompts_per_step} prompts x {settings.samples_per_prompt} samples, "
        f"<= {settings.max_response_length} new tokens, temperature {settings.temperature}; "
        f"trl {trl_package.__version__}, torch {torch.__version__}; "
        f"{len(plugrl.walls)} measured steps each"
    )
    if settings.token_budget:
        print(f"plugrl: token-budget micro-batches of {settings.token_budget} tokens")
    else:
        print("plugrl: one forward/backward over the whole batch")
    if settings.extra_plugrl_overrides:
        print(f"plugrl also set: {' '.join(settings.extra_plugrl_overrides)}")
    if settings.trl_micro_batch:
        print(
            f"TRL: micro-batches of {settings.trl_micro_batch} samples "
            f"(gradient_accumulation_steps={settings.samples_per_step // settings.trl_micro_batch})"
        )
    else:
        print("TRL: one forward/backward over the whole batch")
    rows = [
        ("gen", _phase(plugrl, "gen"), _phase(trl, "gen")),
        ("reward", _phase(plugrl, "reward"), _phase(trl, "reward")),
        ("old_log_prob", _phase(plugrl, "old_log_prob"), float("nan")),
        ("adv", _phase(plugrl, "adv"), _phase(trl, "adv")),
        ("update", _phase(plugrl, "update_actor"), _phase(trl, "update")),
        ("  loss forward", float("nan"), _phase(trl, "loss_forward")),
        ("  backward", float("nan"), _phase(trl, "backward")),
        ("  grad clip", float("nan"), _phase(trl, "clip_grad")),
        ("  optimizer", float("nan"), _phase(trl, "optimizer")),
        ("update_weights", _phase(plugrl, "update_weights"), float("nan")),
        ("step (wall)", _median(plugrl.walls), _median(trl.walls)),
    ]
    print(f"{'phase (median s)':<18}{'plugrl':>10}{'TRL':>10}")
    for name, ours, theirs in rows:
        print(f"{name:<18}{cell(ours)}{cell(theirs)}")
    for side in (plugrl, trl):
        steps = " ".join(f"{wall:.2f}" for wall in side.walls)
        length = statistics.mean(side.lengths)
        print(f"{side.name} steps (s): {steps}; mean response length {length:.1f} tokens")
    ratio = _median(plugrl.walls) / _median(trl.walls)
    paired = sorted(ours / theirs for ours, theirs in zip(plugrl.walls, trl.walls, strict=True))
    print(
        f"plugrl/TRL step time: {ratio:.3f}x (median over medians; target <= 0.50: "
        f"{'met' if ratio <= 0.5 else 'NOT met'}); paired per step: median "
        f"{_median(paired):.3f}x, range {paired[0]:.2f}-{paired[-1]:.2f}x"
    )
    for side in (plugrl, trl):
        if max(side.walls) > 1.5 * min(side.walls):
            print(
                f"warning: {side.name}'s slowest step took over 1.5x its fastest; the machine "
                "was busy, trust the paired ratio more than the medians, or rerun"
            )
    plugrl_tokens = _median(plugrl.walls) / statistics.mean(plugrl.lengths)
    trl_tokens = _median(trl.walls) / statistics.mean(trl.lengths)
    print(f"per mean response token: {plugrl_tokens / trl_tokens:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quickstart-dir", default=None, help="default: plugrl's quickstart folder"
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps per framework")
    parser.add_argument("--warmup", type=int, default=2, help="dropped steps (>= 1: set-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads, both")
    parser.add_argument("--log-dir", default=None, help="worker logs and run folders")
    parser.add_argument("--json", default=None, help="also write every measured step here")
    parser.add_argument(
        "--plugrl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra plugrl recipe override (repeatable), e.g. actor.use_dynamic_bsz=true",
    )
    parser.add_argument(
        "--batching",
        choices=["budget", "whole"],
        default="budget",
        help="budget: plugrl with the quickstart recipe's token-budget micro-batches "
        f"({QUICKSTART_TOKEN_BUDGET} tokens), TRL with micro-batches of {TRL_MICRO_BATCH} "
        "samples (about as many tokens); whole: both do one forward/backward over all samples",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="float32 on both sides, or bfloat16 compute over float32 weights on both (plugrl: "
        "model.dtype and rollout.dtype; TRL: bf16=True)",
    )
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=None,
        help="TRL samples per forward/backward (gradient accumulation up to the whole batch, "
        "still one optimizer step); default: set by --batching",
    )
    args = parser.parse_args()
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"trl is not installed in this environment; set up with: {SETUP_COMMAND}")
    if args.steps < 1 or args.warmup < 1:
        raise SystemExit("--steps and --warmup must be at least 1 (the first step is set-up)")

    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe
    from plugrl_tools.quickstart import DEFAULT_DIR, prepare_quickstart

    shipped = load_recipe("quickstart", (), get_plugin_manager()).actor
    if not shipped.use_dynamic_bsz or shipped.ppo_max_token_len_per_gpu != QUICKSTART_TOKEN_BUDGET:
        raise SystemExit(
            "recipes/quickstart.yaml no longer batches by a token budget of "
            f"{QUICKSTART_TOKEN_BUDGET}; update QUICKSTART_TOKEN_BUDGET in this bench to match"
        )

    paths = prepare_quickstart(Path(args.quickstart_dir or DEFAULT_DIR))
    run_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="bench-grpo-vs-trl-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = BenchSettings(
        model_path=str(paths.model_path.resolve()),
        train_file=str(paths.train_file.resolve()),
        run_dir=str(run_dir.resolve()),
        threads=args.threads,
        total_steps=args.warmup + args.steps,
        token_budget=QUICKSTART_TOKEN_BUDGET if args.batching == "budget" else None,
        trl_micro_batch=args.trl_micro_batch
        or (TRL_MICRO_BATCH if args.batching == "budget" else None),
        extra_plugrl_overrides=tuple(args.plugrl_override),
        dtype=args.dtype,
    )
    if settings.trl_micro_batch and settings.samples_per_step % settings.trl_micro_batch:
        raise SystemExit(
            f"--trl-micro-batch {settings.trl_micro_batch} does not divide the "
            f"{settings.samples_per_step} samples of a step; choose a divisor"
        )
    # the workers inherit these; the same for both
    os.environ.update(
        {
            "OMP_NUM_THREADS": str(args.threads),
            "MKL_NUM_THREADS": str(args.threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
    )
    # set-up and first steps one after the other, so neither starts under the other's load
    sides = [start_side("plugrl", plugrl_worker, settings), start_side("TRL", trl_worker, settings)]
    try:
        for index in range(args.warmup - 1 + args.steps):
            keep = index >= args.warmup - 1
            for side in sides if index % 2 == 0 else reversed(sides):
                side.step(keep)
    finally:
        for side in sides:
            if side.process.is_alive():
                side.stop()
    report(sides[0], sides[1], settings)
    if args.json:
        steps = {
            side.name: {"wall": side.walls, "phases": side.phases, "lengths": side.lengths}
            for side in sides
        }
        Path(args.json).write_text(json.dumps(steps, indent=1) + "\n", encoding="utf-8")
    print(f"worker logs: {run_dir}")


if __name__ == "__main__":
    main()
