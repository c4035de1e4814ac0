"""``plugrl plan``: the shipped recipes, large shapes, converted verl scripts, --json, --solve
and the one-line errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugrl.recipe import shipped_recipes
from plugrl_tools.cli import cli

REPO = Path(__file__).resolve().parents[2]
VERL_EXAMPLES = REPO / "tests/tools/convert/fixtures/verl/main/examples/grpo_trainer"
MIXTURE_OF_EXPERTS = ("Qwen3-30B-A3B", "Qwen3-235B-A22B")


def plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["plan", *args], catch_exceptions=False)
    return result.exit_code, result.output


def all_recipes() -> list[Path]:
    return [*shipped_recipes().values(), *sorted((REPO / "recipes/npu").glob("*.yaml"))]


@pytest.mark.parametrize("recipe", all_recipes(), ids=lambda path: path.stem)
def test_shipped_recipes_plan(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the quickstart folders are not built here
    code, output = plan(str(recipe), "--device-memory", "80GiB")
    text = recipe.read_text()
    if any(name in text for name in MIXTURE_OF_EXPERTS):
        assert code == 1
        assert "mixture-of-experts" in output and len(output.strip().splitlines()) == 1
        return
    assert code == 0, output
    verdicts = [line for line in output.splitlines() if line.startswith(("fits:", "does not"))]
    assert len(verdicts) == 1, output


@pytest.mark.parametrize("shape", ["qwen2.5-7b", "qwen2.5-32b", "llama-3-70b"])
def test_large_shapes_answer_quickly(shape, write_recipe):
    recipe = write_recipe(
        {
            "model": {"path": shape, "enable_gradient_checkpointing": True},
            "data": {"train_batch_size": 64, "max_response_length": 2048},
            "actor": {"ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 1},
            "rollout": {"engine": "vllm", "n": 8, "tensor_model_parallel_size": 8},
            "trainer": {"n_gpus_per_node": 8},
            "cluster": "ray",
        }
    )
    start = time.perf_counter()
    code, output = plan(str(recipe), "--device-memory", "80GiB")
    assert time.perf_counter() - start < 2.0
    assert code == 0, output
    assert output.startswith(f"model {shape}:")


def test_json_output(write_recipe):
    recipe = write_recipe({"model": {"path": "qwen2.5-7b"}, "data": {"train_batch_size": 8}})
    code, output = plan(str(recipe), "actor.ppo_mini_batch_size=8", "--json")
    assert code == 0, output
    data = json.loads(output)
    assert data["model"] == "qwen2.5-7b"
    assert data["fits"] is None  # no device memory on this machine
    assert {p["phase"] for p in data["phases"]} == {"generate", "log_prob", "update"}


def test_solve(write_recipe):
    recipe = write_recipe(
        {
            "model": {"path": "qwen2.5-7b"},
            "data": {"train_batch_size": 8},
            "trainer": {"n_gpus_per_node": 8},
            "cluster": "ray",
        }
    )
    code, output = plan(
        str(recipe),
        "actor.ppo_mini_batch_size=8",
        "--device-memory",
        "80GiB",
        "--solve",
        "data.max_response_length",
    )
    assert code == 0, output
    value = int(output.splitlines()[-1].rpartition(": ")[2])
    assert output.splitlines()[-1] == f"largest data.max_response_length that fits: {value}"
    code, over = plan(
        str(recipe),
        "actor.ppo_mini_batch_size=8",
        f"data.max_response_length={value + 1}",
        "--device-memory",
        "80GiB",
    )
    assert "does not fit" in over


def test_bad_device_memory_is_one_line(write_recipe):
    recipe = write_recipe({"model": {"path": "qwen2.5-7b"}})
    result = CliRunner().invoke(cli, ["plan", str(recipe), "--device-memory", "lots"])
    assert result.exit_code == 2
    assert "'lots' is not a memory size; write it like 80GiB" in result.output


def test_bad_config_json_is_one_line(tmp_path, write_recipe):
    (tmp_path / "config.json").write_text("[1, 2")
    recipe = write_recipe({"model": {"path": "qwen2.5-7b"}})
    code, output = plan(str(recipe), "--model-config", str(tmp_path / "config.json"))
    assert code == 1
    assert output.startswith("Error: model.path: ")
    assert "is not valid JSON" in output and len(output.strip().splitlines()) == 1


def test_converted_verl_qwen25_7b_grpo_fits_on_80gb(tmp_path):
    """verl's Qwen2.5-7B GRPO example (megatron, TP 2 x PP 2, vLLM TP 4, 8 x 80 GB) as
    `plugrl convert verl` writes it plans directly, and fits."""
    script = VERL_EXAMPLES / "run_qwen2_5-7b_math_megatron_diff_tp.sh"
    converted = tmp_path / "grpo.yaml"
    result = CliRunner().invoke(cli, ["convert", "verl", str(script), "-o", str(converted)])
    assert converted.is_file(), result.output
    code, output = plan(str(converted), "--device-memory", "80GiB")
    assert code == 0, output
    assert output.startswith("model qwen2.5-7b:")  # Qwen/Qwen2.5-7B-Instruct, shipped shape
    assert "TP=2 PP=2 CP=1 DP=2" in output
    assert output.splitlines()[-1].startswith("fits: peak")


def test_converted_verl_qwen2_7b_fsdp_grpo_examples(tmp_path):
    """verl's Qwen2-7B GRPO examples on the FSDP backend (vLLM TP 2 at 0.6, 8 x 80 GB), as
    `plugrl convert verl` writes them, both fit. The MATH one has 16 rows of 1024 + 1024
    tokens a micro-batch, packed; the GSM8K one 40 rows of 512 + 1024, whose 40,960 response
    tokens hold 2 bytes a logit at the update's peak (their bfloat16 head output, which the
    log-probs' backward writes its gradient over) and one chunk's working set, as verl's
    fused cross-entropy holds its logits."""
    peaks = {}
    for name in ("run_qwen2-7b_math", "run_qwen2-7b"):
        converted = tmp_path / f"{name}.yaml"
        CliRunner().invoke(
            cli, ["convert", "verl", str(VERL_EXAMPLES / f"{name}.sh"), "-o", str(converted)]
        )
        assert converted.is_file(), name
        code, output = plan(str(converted), "--device-memory", "80GiB", "--json")
        assert code == 0, output
        data = json.loads(output)
        assert data["model"] == "qwen2-7b"  # Qwen/Qwen2-7B-Instruct, shipped shape
        update = next(p for p in data["phases"] if p["phase"] == "update")
        peaks[name] = (update["peak_gib"], data["fits"], data["notes"])
    peak, fits, notes = peaks["run_qwen2-7b_math"]
    assert fits is True and peak == pytest.approx(37.56, abs=0.01)
    assert notes == []
    peak, fits, notes = peaks["run_qwen2-7b"]
    assert fits is True and peak == pytest.approx(56.67, abs=0.01)
    assert notes == []
