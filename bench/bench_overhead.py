"""plugrl's sync GRPO step against a bare PyTorch loop doing the same work on the same model.

Both sides train the quickstart model on the quickstart's arithmetic task as
``recipes/quickstart.yaml`` ships it: 32 prompts x 8 samples per step (the same prompts, drawn
by plugrl's loader), at most 48 new tokens at temperature 1, the ``plugrl/arithmetic`` scorer,
GRPO advantages, the token-mean clipped policy loss (old log-probs taken from the update's own
forward, as the step is exactly on-policy), one AdamW step per batch (the recipe's learning
rate, betas, weight decay and gradient clip), float32 on the CPU.

* plugrl runs as ``plugrl run`` does (``run_recipe``: the sync scheduler, the fsdp2 backend,
  the hf engine generating with the trainer's own module, the naive reward manager, the
  recipe's console and jsonl loggers); validation, checkpoints and the final export are off.
* The bare loop, :class:`BareLoop`, works on a plain ``transformers`` model (no FSDP): it calls
  :class:`plugrl_hf.engine.HFRolloutEngine` directly (the same engine code, bound to the model
  as plugrl binds its own, and the same per-request seeds), the scorer's ``compute_score``
  directly, computes the advantages and the loss in a few lines of torch
  (:func:`grpo_advantages`, :func:`clipped_token_mean_loss`, :func:`token_log_probs`;
  tests/bench/test_bench_overhead.py holds them to plugrl's), and steps ``torch.optim.AdamW``.
  The bench reports whether both sides sampled the same token ids at step 1.

Batching: ``--batching budget`` (default) gives both sides the recipe's token-budget
micro-batches (4,096 tokens, the same rows per micro-batch: the bare loop cuts them with the
backend's ``token_budget_micro_batches``); ``--batching whole``: one forward/backward over all
256 rows on both sides. Either way the bare loop lays each row out without shared padding, as
the backend does, and takes logits only at the positions that predict response tokens.

What the ratio counts as overhead: everything plugrl does per step that the bare loop does not,
the fsdp2 wrapper on one CPU process included, as that is what a user runs: its hooks around
every layer's forward and backward, DTensor parameters in the gradient clip and the optimizer,
and in generation the module forward the engine must run on a hooked model, where the bare
loop's plain model gets the engine's lean decode path (``--bare-decode forward`` makes the bare
loop decode through the forward too, to separate that part). plugrl also builds verl's padded
batch layout, computes the ``actor/entropy`` metric in the update, keeps its step metrics and
logs them; the bare loop does none of that.

Each side runs in its own spawned process with the same torch thread count; the two take their
steps in lock-step, alternating which goes first, as ``bench_grpo_vs_trl.py`` does. The first
``--warmup`` steps (set-up in the first) are dropped. The printed table gives each side's
median seconds per phase (``other``: the step's wall time outside the timed phases) and names
the phase of the largest difference when the ratio misses the target.

    .venv/bin/python bench/bench_overhead.py [--steps 8] [--warmup 2] [--threads 2]

It needs plugrl only (TRL is not imported). Figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the lock-step workers and driver side are bench_grpo_vs_trl's, beside this file
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from bench_grpo_vs_trl import Side, StopBench, _send_step, _start_worker  # noqa: E402

if TYPE_CHECKING:
    import torch

TARGET_RATIO = 1.10
QUICKSTART_TOKEN_BUDGET = 4096
PHASES = ("gen", "reward", "adv", "update", "weight_sync", "other")
"""Rows of the phase table; ``other`` is the step's wall time outside the timed phases."""
PLUGRL_PHASES = {
    "gen": "gen",
    "reward": "reward",
    "old_log_prob": "old_log_prob",
    "adv": "adv",
    "update_actor": "update",
    "update_weights": "weight_sync",
}
"""plugrl's ``timing_s/*`` names -> this bench's phase names."""


@dataclasses.dataclass(frozen=True)
class OverheadSettings:
    """What both sides train on and how; passed to the worker processes."""

    model_path: str
    train_file: str
    run_dir: str
    threads: int
    total_steps: int
    seed: int = 42
    token_budget: int | None = QUICKSTART_TOKEN_BUDGET
    """Tokens per forward/backward on both sides; ``None``: the whole batch."""
    bare_lean_decode: bool = True
    """Whether the bare loop's engine may use its lean decode path (plugrl's hooked model
    cannot)."""
    extra_overrides: tuple[str, ...] = ()
    """More recipe overrides (both sides read the recipe; the bare loop only its settings)."""

    def overrides(self) -> list[str]:
        """The quickstart recipe, pointed at the bench's model and data, with validation,
        checkpoints and the export off; the bare loop reads its settings from it too."""
        budget = (
            [f"actor.ppo_max_token_len_per_gpu={self.token_budget}"]
            if self.token_budget
            else ["actor.use_dynamic_bsz=false"]
        )
        return [
            f"model.path={self.model_path}",
            # the bare loop trains and samples a plain float32 model, whatever the recipe ships
            "model.dtype=float32",
            "rollout.dtype=float32",
            # the same work on both sides: the bare loop trains every sequence
            "actor.skip_zero_advantage_rows=false",
            f"data.train_files=[{self.train_file}]",
            "data.val_files=[]",
            # one more step than the driver asks for, so the run's last step never comes
            f"trainer.total_training_steps={self.total_steps + 1}",
            f"trainer.default_local_dir={Path(self.run_dir) / 'plugrl'}",
            f"trainer.seed={self.seed}",
            "trainer.save_freq=-1",
            "trainer.export_hf=false",
            *budget,
            *self.extra_overrides,
        ]


def load_settings_recipe(settings: OverheadSettings) -> Any:
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.recipe import load_recipe

    return load_recipe("quickstart", settings.overrides(), get_plugin_manager())


# ------------------------------------------------------------------------- the bare loop maths


def grpo_advantages(scores: torch.Tensor, group_size: int, epsilon: float = 1e-6) -> torch.Tensor:
    """Per-response GRPO advantages of ``scores [B]`` laid out group after group
    (``group_size`` responses per prompt): ``(score - group mean) / (group std + epsilon)``
    with the unbiased std."""
    groups = scores.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.ones_like(mean)
    return ((groups - mean) / (std + epsilon)).view(-1)


def clipped_token_mean_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float,
) -> torch.Tensor:
    """This micro-batch's share of PPO's clipped surrogate (dual clip for negative advantages)
    averaged over the ``num_tokens`` response tokens of the whole batch; ``advantages [b]``
    per response, the other tensors ``[b, R]``."""
    import torch

    advantage = advantages[:, None]
    ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0).exp()
    unclipped = -advantage * ratio
    clipped = -advantage * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    worst = torch.maximum(unclipped, clipped)
    losses = torch.where(advantage < 0, torch.minimum(-advantage * dual_clip, worst), worst)
    return (losses * mask).sum() / max(num_tokens, 1)


@dataclasses.dataclass
class MicroBatch:
    """Rows laid out without shared padding: each row's prompt then response from column 0,
    right-padded; logits are needed at the last ``keep`` positions, and response token ``j``
    of row ``i`` is predicted by kept position ``response_index[i, j]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    keep: int
    response_index: torch.Tensor
    responses: torch.Tensor
    mask: torch.Tensor


def micro_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_token_id: int
) -> MicroBatch:
    """The :class:`MicroBatch` of rows ``prompts[i] + responses[i]`` (every response
    non-empty)."""
    import torch

    rows = [list(p) + list(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(len(row) for row in rows)
    response_width = max(len(r) for r in responses)
    shortest_prompt = min(len(p) for p in prompts)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    response_ids = torch.full((len(rows), response_width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), response_width), dtype=torch.float32)
    for i, (row, response) in enumerate(zip(rows, responses, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        response_ids[i, : len(response)] = torch.tensor(response)
        mask[i, : len(response)] = 1
    # position p predicts token p + 1: kept positions start at the shortest prompt's last one
    keep = width - shortest_prompt + 1
    starts = torch.tensor([len(p) - shortest_prompt for p in prompts])
    response_index = (starts[:, None] + torch.arange(response_width)[None, :]).clamp(max=keep - 1)
    position_ids = torch.arange(width).expand(len(rows), -1)
    return MicroBatch(
        input_ids, attention_mask, position_ids, keep, response_index, response_ids, mask
    )


def token_log_probs(model: Any, batch: MicroBatch, temperature: float) -> torch.Tensor:
    """Log-probs ``[b, R]`` of the batch's response tokens under ``model`` (0 past a row's
    response)."""
    import torch

    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.keep,
        use_cache=False,
    ).logits[:, -batch.keep :]
    index = batch.response_index[..., None].expand(-1, -1, logits.shape[-1])
    logits = logits.gather(1, index).float() / temperature
    picked = logits.gather(-1, batch.responses[..., None]).squeeze(-1)
    return (picked - torch.logsumexp(logits, dim=-1)) * batch.mask


# ---------------------------------------------------------------------------- the bare worker


@dataclasses.dataclass
class StepPrompts:
    """One step's prompts as plugrl's loader draws them, and what the scorer needs of them."""

    prompt_ids: list[list[int]]
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[Any]


def step_prompts(recipe: Any, steps: int) -> list[StepPrompts]:
    """The prompts of the first ``steps`` steps, in the order plugrl's loader draws them."""
    from plugrl.data.dataset import PromptDataset, PromptLoader, load_tokenizer, pad_token_id_of

    tokenizer = load_tokenizer(recipe.model)
    dataset = PromptDataset.train(recipe.data, tokenizer)
    loader = PromptLoader.for_training(dataset, recipe.data, pad_token_id_of(tokenizer))
    out = []
    for _ in range(steps):
        batch = loader.next_batch()
        out.append(
            StepPrompts(
                [list(ids) for ids in batch["raw_prompt_ids"]],
                list(batch["data_source"]),
                list(batch["ground_truth"]),
                list(batch["extra_info"]),
            )
        )
    return out


class BareLoop:
    """A GRPO step written out over a plain model and the hf engine, no plugrl run loop."""

    def __init__(self, settings: OverheadSettings) -> None:
        import attrs
        import torch
        from transformers import AutoModelForCausalLM

        from plugrl.data.dataset import load_tokenizer, pad_token_id_of
        from plugrl.parts.context import PartContext
        from plugrl_hf.engine import HFRolloutEngine

        self.settings = settings
        recipe = load_settings_recipe(settings)
        self.recipe = recipe
        self.tokenizer = load_tokenizer(recipe.model)
        self.pad_token_id = pad_token_id_of(self.tokenizer)
        self.prompts = step_prompts(recipe, settings.total_steps)
        self.model = AutoModelForCausalLM.from_pretrained(
            recipe.model.path, dtype=torch.float32
        ).eval()
        actor = recipe.actor
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=actor.optim.lr,
            betas=tuple(actor.optim.betas),
            weight_decay=actor.optim.weight_decay,
        )
        config = attrs.evolve(recipe.rollout, lean_decode=settings.bare_lean_decode)
        context = PartContext(recipe=recipe, tokenizer=self.tokenizer, model_from_trainer=True)
        self.engine = HFRolloutEngine(config, context)
        self.engine.bind_model(self.model, 0)
        self.loop = asyncio.new_event_loop()

    def generate(self, step: int) -> list[list[int]]:
        """``rollout.n`` responses per prompt, prompt after prompt, seeded as plugrl seeds
        them (:func:`plugrl.state.seeds.round_seed`, one request per prompt)."""
        from plugrl.parts.rollout import batch_requests
        from plugrl.run.steps import sampling_params

        params = sampling_params(self.recipe, step)
        requests = batch_requests(self.prompts[step - 1].prompt_ids, params, f"step{step}")

        async def generate_all() -> list[list[Any]]:
            return list(await asyncio.gather(*(self.engine.generate_request(r) for r in requests)))

        outputs = self.loop.run_until_complete(generate_all())
        return [
            list(completion.token_ids)
            for completions in outputs
            for completion in sorted(completions, key=lambda c: c.sample_index)
        ]

    def step(self, step: int) -> tuple[dict[str, float], list[list[int]]]:
        """One GRPO step; returns its phase times and the sampled token ids."""
        import torch

        from plugrl_fsdp2.batching import token_budget_micro_batches
        from plugrl_scorers.arithmetic import compute_score

        recipe, actor = self.recipe, self.recipe.actor
        n = recipe.rollout.n
        prompts = self.prompts[step - 1]
        times: dict[str, float] = {}
        start = time.perf_counter()
        responses = self.generate(step)
        times["gen"] = time.perf_counter() - start

        mark = time.perf_counter()
        scores = []
        for row, response in enumerate(responses):
            prompt = row // n
            text = self.tokenizer.decode(response, skip_special_tokens=True)
            result = compute_score(
                prompts.data_sources[prompt],
                text,
                prompts.ground_truths[prompt],
                prompts.extra_infos[prompt],
            )
            scores.append(float(result["score"]))
        times["reward"] = time.perf_counter() - mark

        mark = time.perf_counter()
        advantages = grpo_advantages(torch.tensor(scores), n)
        times["adv"] = time.perf_counter() - mark

        mark = time.perf_counter()
        rows = [
            (prompts.prompt_ids[row // n], response)
            for row, response in enumerate(responses)
            if response  # an empty response has no token to train on
        ]
        row_advantages = advantages[[row for row, r in enumerate(responses) if r]]
        num_tokens = sum(len(r) for _, r in rows)
        lengths = [len(p) + len(r) for p, r in rows]
        budget = self.settings.token_budget
        plan = token_budget_micro_batches(lengths, budget) if budget else [list(range(len(rows)))]
        temperature = recipe.rollout.temperature or 1.0
        step_loss = 0.0
        self.model.train()
        for indices in plan:
            batch = micro_batch(
                [rows[i][0] for i in indices], [rows[i][1] for i in indices], self.pad_token_id
            )
            log_prob = token_log_probs(self.model, batch, temperature)
            loss = clipped_token_mean_loss(
                log_prob,
                log_prob.detach(),
                row_advantages[indices],
                batch.mask,
                num_tokens,
                clip_low=actor.effective_clip_low,
                clip_high=actor.effective_clip_high,
                dual_clip=actor.clip_ratio_c,
            )
            loss.backward()
            step_loss += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), actor.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        times["update"] = time.perf_counter() - mark

        mark = time.perf_counter()
        self.engine.bind_model(self.model, step)
        times["weight_sync"] = time.perf_counter() - mark
        # as plugrl's console line has them, to compare the two logs step by step
        score = statistics.mean(scores)
        print(f"step {step} | score {score:.3f} | pg_loss {step_loss:+.4f} | grad {grad_norm:.3f}")
        return times, responses


def bare_worker(conn: Any, settings: OverheadSettings) -> None:
    """Run :class:`BareLoop`'s steps, one per driver "go"."""
    _start_worker(settings, "bare")
    try:
        loop = BareLoop(settings)
        for step in range(1, settings.total_steps + 1):
            times, responses = loop.step(step)
            mean_length = statistics.mean(len(r) for r in responses)
            if step == 1:
                write_first_tokens(settings, "bare", responses)
            _send_step(conn, step, times, mean_length)
    except StopBench:
        pass
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


# --------------------------------------------------------------------------- the plugrl worker


def plugrl_worker(conn: Any, settings: OverheadSettings) -> None:
    """Run plugrl's sync GRPO loop through ``run_recipe``, one step per driver "go"."""
    _start_worker(settings, "plugrl")
    import plugrl
    import plugrl_sync.scheduler as sync_scheduler
    from plugrl.plugin.manager import get_plugin_manager
    from plugrl.run.runner import run_recipe

    generate = sync_scheduler.generate
    first_tokens: list[list[list[int]]] = []

    def recording_generate(parts: Any, prompts: Any, params: Any) -> Any:
        batch = generate(parts, prompts, params)
        if not first_tokens:  # step 1's token ids, for the driver's check
            mask = batch["response_mask"].bool()
            first_tokens.append(
                [row[keep].tolist() for row, keep in zip(batch["responses"], mask, strict=True)]
            )
        return batch

    sync_scheduler.generate = recording_generate

    class LockStep:
        @plugrl.hookimpl
        def on_step_end(self, step: int, metrics: Any) -> None:
            phases = {
                name: float(metrics[f"timing_s/{timing}"])
                for timing, name in PLUGRL_PHASES.items()
                if f"timing_s/{timing}" in metrics
            }
            phases["step"] = float(metrics["timing_s/step"])
            if step == 1:
                write_first_tokens(settings, "plugrl", first_tokens[0])
            _send_step(conn, step, phases, float(metrics["response_length/mean"]))

    plugins = get_plugin_manager()
    plugins.register(LockStep(), name="bench-lockstep")
    recipe = load_settings_recipe(settings)
    try:
        run_recipe(recipe, plugins)
    except StopBench:
        pass
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


# ------------------------------------------------------------------------------------- driver


def start(name: str, target: Any, settings: OverheadSettings) -> Side:
    """Spawn a worker and wait until it has finished its first (set-up) step."""
    context = multiprocessing.get_context("spawn")
    driver_end, worker_end = context.Pipe()
    process = context.Process(target=target, args=(worker_end, settings), name=f"bench-{name}")
    process.start()
    worker_end.close()
    side = Side(name, process, driver_end, Path(settings.run_dir) / f"{name}.log")
    side.receive()
    return side


def write_first_tokens(settings: OverheadSettings, name: str, tokens: list[list[int]]) -> None:
    """Keep step 1's sampled token ids for the driver's check (:func:`compare_tokens`)."""
    path = Path(settings.run_dir) / f"{name}-step1-tokens.json"
    path.write_text(json.dumps(tokens), encoding="utf-8")


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def phase_rows(side: Side) -> dict[str, float]:
    """Median seconds per phase; ``other`` is each step's wall time minus its timed phases."""
    medians = {}
    for phase in PHASES[:-1]:
        values = [phases[phase] for phases in side.phases if phase in phases]
        medians[phase] = _median(values)
    others = [
        wall - sum(phases.get(phase, 0.0) for phase in (*PHASES[:-1], "old_log_prob"))
        for wall, phases in zip(side.walls, side.phases, strict=True)
    ]
    medians["other"] = _median(others)
    return medians


def overhead_phase(plugrl: dict[str, float], bare: dict[str, float]) -> str:
    """The phase where plugrl spends the most seconds more than the bare loop."""
    return max(PHASES, key=lambda phase: plugrl[phase] - bare[phase])


def report(plugrl: Side, bare: Side, settings: OverheadSettings, same_tokens: str) -> None:
    import torch

    print(
        f"sync GRPO step, quickstart model (float32, cpu, {settings.threads} threads, "
        f"torch {torch.__version__}): {len(plugrl.walls)} measured steps each"
    )
    if settings.token_budget:
        print(f"both: token-budget micro-batches of {settings.token_budget} tokens")
    else:
        print("both: one forward/backward over the whole batch")
    print(
        "bare loop decodes with "
        + ("the engine's lean path (plain model)" if settings.bare_lean_decode else "the forward")
    )
    if settings.extra_overrides:
        print(f"also set: {' '.join(settings.extra_overrides)}")
    print(f"step 1 token ids: {same_tokens}")
    ours, theirs = phase_rows(plugrl), phase_rows(bare)
    print(f"{'phase (median s)':<20}{'plugrl':>10}{'bare':>10}{'plugrl-bare':>13}")
    for phase in PHASES:
        print(
            f"{phase:<20}{ours[phase]:>10.3f}{theirs[phase]:>10.3f}"
            f"{ours[phase] - theirs[phase]:>+13.3f}"
        )
    old = _median([p["old_log_prob"] for p in plugrl.phases if "old_log_prob" in p])
    if old == old:
        print(f"(plugrl also ran an old_log_prob pass: {old:.3f} s)")
    timed = (*PHASES[:-1], "old_log_prob")
    inside = _median([p["step"] - sum(p.get(name, 0.0) for name in timed) for p in plugrl.phases])
    outside = _median([w - p["step"] for w, p in zip(plugrl.walls, plugrl.phases, strict=True)])
    print(
        f"plugrl other: {inside:.3f} s inside train_step, "
        f"{outside:.3f} s around it (step metrics, loggers, the run loop)"
    )
    print(f"{'step (wall)':<20}{_median(plugrl.walls):>10.3f}{_median(bare.walls):>10.3f}")
    for side in (plugrl, bare):
        steps = " ".join(f"{wall:.2f}" for wall in side.walls)
        print(
            f"{side.name} steps (s): {steps}; mean response length "
            f"{statistics.mean(side.lengths):.1f} tokens"
        )
    ratio = _median(plugrl.walls) / _median(bare.walls)
    paired = sorted(p / b for p, b in zip(plugrl.walls, bare.walls, strict=True))
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(
        f"plugrl/bare step time: {ratio:.3f}x (median over medians; target <= "
        f"{TARGET_RATIO:.2f}: {verdict}); paired per step: median {_median(paired):.3f}x, "
        f"range {paired[0]:.2f}-{paired[-1]:.2f}x"
    )
    if ratio > TARGET_RATIO:
        phase = overhead_phase(ours, theirs)
        print(
            f"most of the overhead is in {phase}: {ours[phase] - theirs[phase]:+.3f} s of "
            f"{_median(plugrl.walls) - _median(bare.walls):+.3f} s per step"
        )
    for side in (plugrl, bare):
        if max(side.walls) > 1.5 * min(side.walls):
            print(
                f"warning: {side.name}'s slowest step took over 1.5x its fastest; the machine "
                "was busy, trust the paired ratio more than the medians, or rerun"
            )


def compare_tokens(settings: OverheadSettings) -> str:
    """Whether both sides sampled the same token ids at step 1, in words."""
    folder = Path(settings.run_dir)
    ours, theirs = (
        json.loads((folder / f"{name}-step1-tokens.json").read_text(encoding="utf-8"))
        for name in ("plugrl", "bare")
    )
    if ours == theirs:
        return f"the same on both sides ({len(ours)} responses)"
    differ = sum(p != b for p, b in zip(ours, theirs, strict=True))
    return f"{differ} of {len(ours)} responses differ"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quickstart-dir", default=None, help="default: plugrl's quickstart folder"
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="dropped steps (>= 1: set-up)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads, both")
    parser.add_argument("--log-dir", default=None, help="worker logs and run folders")
    parser.add_argument("--json", default=None, help="also write every measured step here")
    parser.add_argument(
        "--batching",
        choices=["budget", "whole"],
        default="budget",
        help=f"budget: both with the recipe's {QUICKSTART_TOKEN_BUDGET}-token micro-batches; "
        "whole: both one forward/backward over all samples",
    )
    parser.add_argument(
        "--bare-decode",
        choices=["lean", "forward"],
        default="lean",
        help="lean: the bare loop's plain model decodes on the engine's lean path, as the "
        "engine serves a plain model; forward: through the model's forward, as plugrl's "
        "FSDP-wrapped model does",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra recipe override (repeatable), e.g. reward.overlap=false",
    )
    args = parser.parse_args(argv)
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
    run_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="bench-overhead-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = OverheadSettings(
        model_path=str(paths.model_path.resolve()),
        train_file=str(paths.train_file.resolve()),
        run_dir=str(run_dir.resolve()),
        threads=args.threads,
        total_steps=args.warmup + args.steps,
        token_budget=QUICKSTART_TOKEN_BUDGET if args.batching == "budget" else None,
        bare_lean_decode=args.bare_decode == "lean",
        extra_overrides=tuple(args.override),
    )
    os.environ.update(
        {
            "OMP_NUM_THREADS": str(args.threads),
            "MKL_NUM_THREADS": str(args.threads),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
    )
    # set-up and first steps one after the other, so neither starts under the other's load
    sides = [start("plugrl", plugrl_worker, settings), start("bare", bare_worker, settings)]
    try:
        for index in range(args.warmup - 1 + args.steps):
            keep = index >= args.warmup - 1
            for side in sides if index % 2 == 0 else reversed(sides):
                side.step(keep)
    finally:
        for side in sides:
            if side.process.is_alive():
                side.stop()
    report(sides[0], sides[1], settings, compare_tokens(settings))
    if args.json:
        steps = {
            side.name: {"wall": side.walls, "phases": side.phases, "lengths": side.lengths}
            for side in sides
        }
        Path(args.json).write_text(json.dumps(steps, indent=1) + "\n", encoding="utf-8")
    print(f"worker logs: {run_dir}")


if __name__ == "__main__":
    main()
