"""On-policy distillation at quickstart size: the quickstart's untrained tiny model (the
student) distils a teacher, the same model after a short supervised warm start on the
quickstart's worked examples, through the command line (k1 as each token's advantage, no task
reward). On held-out prompts, the reverse KL from the student to the teacher at the states the
student visits falls by most of its gap within eight steps."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from click.testing import CliRunner

from plugrl_tools.cli import cli
from tests.e2e.e2e_support import by_step, read_records, write_recipe

pytestmark = pytest.mark.slow

STEPS = 8


@attrs.frozen
class DistillationPair:
    student: Path
    teacher: Path
    train_file: Path
    val_file: Path


def build_distillation_pair(root: Path) -> DistillationPair:
    """The untrained quickstart model (student), that model after 4 steps of supervised
    training on 64 worked examples (teacher), and arithmetic prompts (64 to train on, 8
    held out)."""
    from plugrl_tools.quickstart import arithmetic
    from plugrl_tools.quickstart.build import QuickstartSettings, _task
    from plugrl_tools.quickstart.model import build_tiny_model
    from plugrl_tools.quickstart.warmstart import supervised_fine_tune

    splits, examples, tokenizer = _task(0, QuickstartSettings())
    pair = DistillationPair(
        student=root / "student",
        teacher=root / "teacher",
        train_file=root / "train.parquet",
        val_file=root / "val.parquet",
    )
    for folder, warm_examples in ((pair.student, 0), (pair.teacher, 64)):
        model = build_tiny_model(tokenizer, 0)
        if warm_examples:
            torch.manual_seed(0)
            supervised_fine_tune(
                model, tokenizer, examples[:warm_examples], epochs=2, batch_size=32, lr=1e-3, seed=0
            )
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    arithmetic.write_parquet(splits.train[:64], "train", pair.train_file)
    arithmetic.write_parquet(splits.val[:8], "val", pair.val_file)
    return pair


def held_out_reverse_kl(student: Path, teacher: Path, val_file: Path, samples: int = 4) -> float:
    """``KL(pi_student || pi_teacher)`` over the whole vocabulary, averaged over the states the
    student visits when it samples (temperature 1, at most 8 tokens) for the held-out
    prompts: the quantity distillation minimises, without a one-sample estimate's noise."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(student)
    student_model, teacher_model = (
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for path in (student, teacher)
    )
    generator = torch.Generator().manual_seed(0)
    total, count = 0.0, 0
    for row in pq.read_table(val_file).to_pylist():
        text = tokenizer.apply_chat_template(
            list(row["prompt"]), add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            for _ in range(samples):
                ids = list(prompt)
                for _ in range(8):
                    logits = student_model(torch.tensor([ids])).logits[0, -1]
                    token = int(
                        torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
                    )
                    ids.append(token)
                    if token == tokenizer.eos_token_id:
                        break
                sequence = torch.tensor([ids])
                # the states before each sampled token
                states = slice(len(prompt) - 1, len(ids) - 1)
                log_p = torch.log_softmax(student_model(sequence).logits[0, states], -1)
                log_q = torch.log_softmax(teacher_model(sequence).logits[0, states], -1)
                total += float((log_p.exp() * (log_p - log_q)).sum())
                count += len(ids) - len(prompt)
    return total / count


@pytest.fixture(scope="module")
def distillation_run(plugrl_build_once, tmp_path_factory):
    pair = plugrl_build_once(build_distillation_pair)
    folder = tmp_path_factory.mktemp("distillation")
    recipe = {
        "model": {"path": str(pair.student), "dtype": "float32"},
        "data": {
            "train_files": [str(pair.train_file)],
            "val_files": [str(pair.val_file)],
            "train_batch_size": 8,
            "max_prompt_length": 32,
            "max_response_length": 8,
        },
        "device": "cpu",
        # four optimizer steps per training step
        "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 2e-3}},
        "rollout": {"n": 8},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {
            "total_training_steps": STEPS,
            "default_local_dir": str(folder / "run"),
            "logger": ["jsonl"],
            "seed": 7,
            "export_hf": True,
            "val_before_train": False,
            "test_freq": 0,
        },
        "distillation": {
            "enabled": True,
            "teachers": {"teacher": {"model": {"path": str(pair.teacher), "dtype": "float32"}}},
            "loss": {"loss_mode": "k1", "use_policy_gradient": True, "use_task_rewards": False},
        },
    }
    result = CliRunner().invoke(cli, ["run", str(write_recipe(folder / "r.yaml", recipe))])
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    return pair, folder / "run"


def test_the_student_closes_most_of_its_gap_to_the_teacher(distillation_run):
    pair, run_dir = distillation_run
    before = held_out_reverse_kl(pair.student, pair.teacher, pair.val_file)
    after = held_out_reverse_kl(run_dir / "hf_model", pair.teacher, pair.val_file)
    assert before > 0.1, f"the teacher is too close to the student to learn from: {before}"
    assert after <= 0.4 * before, f"held-out reverse KL {before:.3f} -> {after:.3f}"


def test_each_step_logs_the_distillation_metrics(distillation_run):
    _, run_dir = distillation_run
    records = by_step(read_records(run_dir))
    assert sorted(records) == list(range(1, STEPS + 1))
    for step, record in records.items():
        for name in (
            "actor/distillation/loss",
            "actor/distillation/abs_loss",
            "actor/distillation/pg_clipfrac",
            "actor/distillation/loss_min",
            "actor/distillation/loss_max",
            "timing_s/teacher",
        ):
            assert name in record, f"step {step} lacks {name}"
        # k1 is signed: the teacher likes some sampled tokens more than the student does
        assert record["actor/distillation/loss_min"] < 0 < record["actor/distillation/loss_max"]
    first = sum(records[s]["actor/distillation/loss"] for s in (1, 2)) / 2
    last = sum(records[s]["actor/distillation/loss"] for s in (STEPS - 1, STEPS)) / 2
    assert last < 0.7 * first
