"""A GRPO run of the tiny model through ``plugrl run``, start to end: its metrics, validation,
checkpoints, export, a kill and resume, and the same run on Ray ranks."""

from __future__ import annotations

import os
import re
import signal

import pytest

from plugrl.plugin.manager import get_plugin_manager
from tests.e2e.e2e_support import (
    REFERENCE_OVERRIDES,
    REFERENCE_STEPS,
    assert_same_metrics,
    background_run,
    by_step,
    check_ok,
    group_gone,
    read_records,
    reference_recipe,
    run_cli,
    wait_for_step,
)

pytestmark = pytest.mark.slow

VAL_CORE = "val-core/plugrl/arithmetic/acc/mean@2"
VAL_SCORE = "val-aux/plugrl/arithmetic/score/mean@2"
VALIDATION_LINE = re.compile(r"\[validation\] .* -> .* \(score (-?\d+\.\d+)\)$")


def safetensors_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------- one run, read


def test_the_run_logs_every_step_once_with_verl_metrics(reference_run):
    records = by_step(read_records(reference_run.run_dir))
    assert sorted(records) == list(range(REFERENCE_STEPS + 1))
    for step in range(1, REFERENCE_STEPS + 1):
        record = records[step]
        for name in (
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "actor/kl_loss",
            "actor/lr",
            "critic/score/mean",
            "critic/advantages/mean",
            "response_length/mean",
            "timing_s/gen",
            "timing_s/ref",
            "timing_s/update_actor",
            "perf/throughput",
            "perf/wall_clock_s",
        ):
            assert name in record, f"step {step} has no {name}"
        assert record["training/global_step"] == step
        if step > 1:  # the record of step 0 is validation alone
            assert record["perf/wall_clock_s"] > records[step - 1]["perf/wall_clock_s"]
        # the spread reward gives the two responses of a prompt different scores, so every
        # step has non-zero advantages and gradients
        assert record["critic/score/max"] > record["critic/score/min"]
        assert record["actor/grad_norm"] > 0
    # the actor equals the reference model until its first optimizer step, then moves away
    assert records[REFERENCE_STEPS]["actor/kl_loss"] > 0
    assert (reference_run.run_dir / "latest_checkpointed_iteration.txt").read_text() == (
        f"{REFERENCE_STEPS}\n"
    )
    for step in range(1, REFERENCE_STEPS + 1):
        assert (reference_run.run_dir / f"global_step_{step}" / "plugrl_checkpoint.json").exists()


def test_validation_runs_before_training_and_after_the_last_step(reference_run):
    records = by_step(read_records(reference_run.run_dir))
    before, last = records[0], records[REFERENCE_STEPS]
    # the record of step 0 is validation alone, at the run's clock
    assert set(before) == {"step", VAL_CORE, VAL_SCORE, "perf/wall_clock_s"}
    assert VAL_CORE in last and VAL_SCORE in last
    for step in range(1, REFERENCE_STEPS):
        assert VAL_CORE not in records[step]  # trainer.test_freq is -1
    assert 0.0 <= last[VAL_CORE] <= 1.0
    # mean@2 averages both samples of every validation prompt: the 4 prompts x 2 samples
    # of the final validation are the last 8 logged generations
    logged = [
        float(match.group(1))
        for line in reference_run.stderr.splitlines()
        if (match := VALIDATION_LINE.search(line))
    ]
    assert len(logged) == 16  # two validations of 8 samples
    assert sum(logged[:8]) / 8 == pytest.approx(before[VAL_SCORE], abs=0.005)
    assert sum(logged[8:]) / 8 == pytest.approx(last[VAL_SCORE], abs=0.005)
    assert f"{VAL_CORE}: 0.000 -> " in reference_run.stderr


# ---------------------------------------------------------------------------- the export


def test_the_exported_folder_generates_what_the_trained_actor_does(reference_run, tiny_task):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from plugrl.cluster.groups import make_worker_group
    from plugrl.data.dataset import PromptDataset
    from plugrl.parts.context import PartContext
    from plugrl.parts.rollout import SamplingParams
    from plugrl.recipe import load_recipe
    from plugrl_cpu.device import CpuDevice
    from plugrl_hf.engine import HFRolloutEngine

    export = reference_run.run_dir / "hf_model"
    trained = safetensors_weights(export)
    initial = safetensors_weights(tiny_task.model)
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[name], initial[name]) for name in trained)

    exported_model = AutoModelForCausalLM.from_pretrained(export).eval()
    tokenizer = AutoTokenizer.from_pretrained(export)
    recipe = load_recipe(reference_run.recipe, REFERENCE_OVERRIDES, get_plugin_manager())
    prompts = [
        list(record.prompt_ids) for record in PromptDataset.validation(recipe.data, tokenizer)
    ]

    # the actor as the trainer holds it: an FSDP2 rank loaded from the last checkpoint,
    # generating through the colocated engine
    actor = make_worker_group(recipe, "actor", device_name="cpu", plugins=get_plugin_manager())
    try:
        actor.setup(REFERENCE_STEPS)
        actor.load_checkpoint(reference_run.run_dir / f"global_step_{REFERENCE_STEPS}" / "actor")
        weights = dict(actor.named_weights())
        # the file holds a tied lm_head once, as the embedding
        assert set(weights) - set(trained) <= {"lm_head.weight"}
        for name, tensor in trained.items():
            assert weights[name].equal(tensor), name
        context = PartContext(
            recipe=recipe,
            device=CpuDevice(recipe.device),
            tokenizer=tokenizer,
            model_from_trainer=True,
        )
        engine = HFRolloutEngine(recipe.rollout, context)
        engine.bind_model(actor.rollout_model(), REFERENCE_STEPS)
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=12)
        completions = engine.generate(prompts, greedy)
    finally:
        actor.close()

    for prompt, completion in zip(prompts, completions, strict=True):
        with torch.no_grad():
            output = exported_model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=12,
                pad_token_id=tokenizer.pad_token_id,
            )
        assert output[0, len(prompt) :].tolist() == completion.token_ids


# ----------------------------------------------------------------- SIGTERM, kill -9, resume


def test_a_run_killed_then_stopped_by_sigterm_ends_as_the_uninterrupted_run_did(
    reference_run, tiny_task, tmp_path
):
    """One run interrupted twice, each time once step 2 is logged, while its checkpoint is
    written: kill -9 ends it, its rerun resumes and is stopped by SIGTERM as Ctrl-C stops it,
    without half-written checkpoints, and the last rerun resumes again and logs and exports
    bit for bit what the uninterrupted reference run did."""
    recipe = reference_recipe(tiny_task, tmp_path)
    run_dir = tmp_path / "run"
    metrics_file = run_dir / "metrics.jsonl"
    with background_run(recipe, tmp_path / "killed.log", *REFERENCE_OVERRIDES) as process:
        # step 2 is logged after checkpoint 1 is written (a step is logged, then saved)
        wait_for_step(process, metrics_file, step=2)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(30) == -signal.SIGKILL
        # its reward workers die with it
        assert group_gone(process.pid), "processes of the killed run are still alive"
    killed_at = metrics_file.read_text()
    assert max(by_step(read_records(run_dir))) < REFERENCE_STEPS, "the run finished first"

    with background_run(recipe, tmp_path / "stopped.log", *REFERENCE_OVERRIDES) as process:
        # the rerun drops the records of the steps it redoes, then logs step 2 again
        wait_for_step(process, metrics_file, step=2, unlike=killed_at)
        process.send_signal(signal.SIGTERM)
        # stopped as Ctrl-C stops it: an interrupted run, not a kill
        assert process.wait(300) == 1
        assert group_gone(process.pid), "processes of the stopped run are still alive"
    assert "Aborted!" in (tmp_path / "stopped.log").read_text()
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")], "half-written folders"
    assert max(by_step(read_records(run_dir))) < REFERENCE_STEPS, "the run finished first"

    rerun = check_ok(run_cli(recipe, *REFERENCE_OVERRIDES))
    resumed = re.search(r"resumed from \S+global_step_(\d+) \(step (\d+)\)", rerun.stderr)
    assert resumed, f"the rerun did not resume:\n{rerun.stderr[-2000:]}"
    assert int(resumed.group(1)) >= 1

    records = by_step(read_records(run_dir))
    expected = by_step(read_records(reference_run.run_dir))
    assert sorted(records) == sorted(expected)
    # the resumed segments' wall clock goes on from the checkpoint's
    # (the record of step 0 is validation alone)
    wall_clock = [records[step]["perf/wall_clock_s"] for step in sorted(records) if step > 0]
    assert wall_clock == sorted(wall_clock)
    for step, record in expected.items():
        # bit for bit: same weights, optimizer state, data position and sampling seeds
        assert_same_metrics(records[step], record, rel=0, abs_=0, where=f"step {step}")
    resumed_weights = safetensors_weights(run_dir / "hf_model")
    for name, tensor in safetensors_weights(reference_run.run_dir / "hf_model").items():
        assert resumed_weights[name].equal(tensor), name


def test_a_run_killed_between_logging_a_step_and_saving_it_logs_the_step_once(
    reference_run, tiny_task, tmp_path, monkeypatch
):
    """The gap a kill -9 can fall into: step 2 is logged, its checkpoint not written yet."""
    from click.testing import CliRunner

    from plugrl.state.checkpoint import CheckpointManager
    from plugrl_tools.cli import cli

    recipe = reference_recipe(tiny_task, tmp_path)
    save = CheckpointManager.save

    def killed_before_step_2_is_saved(self, step, write, state):
        if step == 2:
            raise SystemExit(137)
        return save(self, step, write, state)

    monkeypatch.setattr(CheckpointManager, "save", killed_before_step_2_is_saved)
    first = CliRunner().invoke(cli, ["run", str(recipe), *REFERENCE_OVERRIDES])
    assert first.exit_code == 137
    run_dir = tmp_path / "run"
    assert max(by_step(read_records(run_dir))) == 2
    assert not (run_dir / "global_step_2").exists()

    monkeypatch.setattr(CheckpointManager, "save", save)
    rerun = CliRunner().invoke(cli, ["run", str(recipe), *REFERENCE_OVERRIDES])
    assert rerun.exit_code == 0, f"{rerun.stderr}{rerun.exception!r}"
    assert "global_step_1 (step 1)" in rerun.stderr
    records = by_step(read_records(run_dir))  # fails on a step logged twice
    expected = by_step(read_records(reference_run.run_dir))
    assert sorted(records) == sorted(expected)
    for step, record in expected.items():
        assert_same_metrics(records[step], record, rel=0, abs_=0, where=f"step {step}")


# ---------------------------------------------------------------------------- Ray ranks


def _validation_lines(stderr):
    return [line for line in stderr.splitlines() if VALIDATION_LINE.search(line)]


def test_two_ray_ranks_and_an_engine_of_its_own_train_like_one_local_rank(
    reference_run, tiny_task, tmp_path
):
    """Two FSDP2 ranks of the actor and the reference model on Ray, and the engine in a Ray
    worker on a device of its own, fed each step's weights through the object store.
    Engines colocated on the trainer's devices take the same path but for where they sit:
    tests/core/cluster/test_colocated_tp.py places them and runs them on Ray."""
    import torch

    recipe = reference_recipe(tiny_task, tmp_path)
    result = check_ok(
        run_cli(
            recipe,
            *REFERENCE_OVERRIDES,
            "cluster.mode=ray",
            # logical CPUs: two for the trainer ranks (the reference model shares them), one
            # for the engine
            "cluster.num_cpus=3",
            "trainer.n_gpus_per_node=2",
            "rollout.colocate=false",
            "rollout.n_gpus_per_node=1",
        )
    )
    assert "the engines get the actor's weights through the 'object_store' transport" in (
        result.stderr
    )
    records = by_step(read_records(tmp_path / "run"))
    expected = by_step(read_records(reference_run.run_dir))
    assert sorted(records) == sorted(expected)
    for step, record in expected.items():
        # sharded reductions add in another order than one rank does; the scores are hashes
        # of the sampled text, so equal critic/score/* means the same responses were sampled
        assert_same_metrics(records[step], record, rel=1e-4, abs_=1e-5, where=f"step {step}")
        if step:
            assert record["timing_s/update_weights"] > 0
    # pushed weights sample exactly what the shared model did
    assert _validation_lines(result.stderr) == _validation_lines(reference_run.stderr)
    ray_weights = safetensors_weights(tmp_path / "run" / "hf_model")
    for name, tensor in safetensors_weights(reference_run.run_dir / "hf_model").items():
        torch.testing.assert_close(ray_weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)


def test_an_engine_with_pushed_weights_samples_what_the_shared_model_does(
    reference_run, tiny_task, tmp_path
):
    from click.testing import CliRunner

    from plugrl_tools.cli import cli

    recipe = reference_recipe(tiny_task, tmp_path)
    result = CliRunner().invoke(
        cli, ["run", str(recipe), *REFERENCE_OVERRIDES, "rollout.colocate=false"]
    )
    assert result.exit_code == 0, f"{result.stderr}{result.exception!r}"
    records = by_step(read_records(tmp_path / "run"))
    expected = by_step(read_records(reference_run.run_dir))
    assert sorted(records) == sorted(expected)
    for step, record in expected.items():
        assert_same_metrics(records[step], record, rel=0, abs_=0, where=f"step {step}")
    assert _validation_lines(result.stderr) == _validation_lines(reference_run.stderr)
