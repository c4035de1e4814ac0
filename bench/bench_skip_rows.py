"""The fsdp2 actor update leaving out the sequences whose advantages are all zero
(``actor.skip_zero_advantage_rows``) against running every sequence, side by side.

A GRPO-shaped batch (left-padded prompts, right-padded responses of random lengths, groups of
``--n``) gets group-normalised advantages from random 0/1 scores, with ``--uniform`` of its
groups scoring alike (their advantages are zero). Two actors of the same model, with the same
recipe but for the option, take turns running the update of the recipe's objective (the
vanilla PPO loss, old log-probs from the update's own forward) on that batch: the gradient is
the same, the work is not. Prints the median seconds of each, their ratio, the share of real
tokens left out (the ratio the update would reach if its time were proportional to tokens).
That the gradients are the same is tested in
``tests/plugins/backends/fsdp2/test_fsdp2_skip_rows.py``. Any Hugging Face causal LM
folder works; without one, a 4M-parameter Qwen2 (the tool quickstart's shape) is made with
random weights.

    python bench/bench_skip_rows.py [--model FOLDER] [--steps 4] [--uniform 0.35]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_packed_update import actor, quickstart_shaped_model

from plugrl.algorithms.objective import PolicyObjective
from plugrl.data.batch import Batch
from plugrl.plugin.manager import get_plugin_manager


def grpo_batch(
    groups: int, n: int, uniform: float, prompt: int, response: int, vocab: int, seed: int
) -> Batch:
    """Rows of ``groups`` prompts x ``n`` responses; a ``uniform`` share of the groups has
    one score for every response, the others a mix of 0 and 1 (GRPO advantages: score minus
    the group mean over the group's standard deviation)."""
    generator = torch.Generator().manual_seed(seed)
    rows = groups * n
    prompt_lens = torch.randint(prompt // 2, prompt + 1, (groups,), generator=generator)
    prompt_lens = prompt_lens.repeat_interleave(n)
    response_lens = torch.randint(4, response + 1, (rows,), generator=generator)
    ids = torch.randint(1, vocab, (rows, prompt + response), generator=generator)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        mask[i, prompt - int(prompt_lens[i]) : prompt + int(response_lens[i])] = 1
    response_mask = mask[:, prompt:].clone()
    scores = torch.zeros(groups, n)
    alike = round(uniform * groups)
    for group in range(groups):
        if group < alike:
            scores[group] = float(group % 2)
        else:
            scores[group, 0], scores[group, 1] = 1.0, 0.0
            scores[group, 2:] = torch.randint(0, 2, (n - 2,), generator=generator).float()
    mean, std = scores.mean(-1, keepdim=True), scores.std(-1, keepdim=True)
    advantages = ((scores - mean) / (std + 1e-6)).flatten()
    return Batch(
        {
            "input_ids": ids * mask,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": (ids * mask)[:, prompt:].clone(),
            "response_mask": response_mask,
            "advantages": advantages[:, None] * response_mask,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Hugging Face model folder")
    parser.add_argument("--steps", type=int, default=4, help="measured updates of each")
    parser.add_argument("--groups", type=int, default=32, help="prompts per batch")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument(
        "--uniform", type=float, default=0.35, help="share of groups that scored alike"
    )
    parser.add_argument("--budget", type=int, default=4096, help="tokens per micro-batch")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = args.groups * args.n
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(args.model) if args.model else quickstart_shaped_model(Path(scratch) / "m")
        budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": args.budget}
        backends = {
            skip: actor(model, rows, skip_zero_advantage_rows=skip, **budget)
            for skip in (True, False)
        }
        objective = PolicyObjective.from_recipe(backends[True].recipe, get_plugin_manager())
        vocab = backends[True]._hf_config.vocab_size
        batch = grpo_batch(args.groups, args.n, args.uniform, 21, 48, vocab, seed=0)
        without = objective.rows_without_gradient(batch)
        assert without is not None
        real = batch["attention_mask"].sum(-1)
        left_out = float(real[without].sum() / real.sum())
        times: dict[bool, list[float]] = {True: [], False: []}
        for step in range(args.steps + 1):
            # alternate which goes first, so both see the same machine load
            for skip in (True, False) if step % 2 else (False, True):
                update = batch.copy()
                start = time.perf_counter()
                backends[skip].update_policy(update, objective)
                if step:  # the first update of each warms up
                    times[skip].append(time.perf_counter() - start)
    skip_s, full_s = (statistics.median(times[s]) for s in (True, False))
    ratios = [s / f for s, f in zip(times[True], times[False], strict=True)]
    print(
        f"update of {rows} rows ({int(real.sum())} real tokens; {int(without.sum())} rows in "
        f"groups that scored alike, {left_out:.0%} of the tokens), token budget {args.budget}, "
        f"{args.threads} threads, {args.steps} measured updates each"
    )
    print(
        f"skipping {skip_s:.3f} s, every row {full_s:.3f} s: {skip_s / full_s:.2f}x "
        f"(tokens run: {1 - left_out:.2f}x)"
    )
    print(f"paired per update: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
