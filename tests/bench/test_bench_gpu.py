"""bench/bench_gpu.py: its FLOP counts and device peaks, and its whole path (model build,
``run_recipe``, the phase probes, the table and the JSON) on a tiny model on the CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import ModuleType, SimpleNamespace

import pytest

from tests.bench.test_bench_imports import BENCH


def _load_bench() -> ModuleType:
    # registered under its name: its dataclasses look their module up in sys.modules
    name = "bench_gpu"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


bench = _load_bench()


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_the_peak_comes_from_the_device_name(name, tflops):
    assert bench.peak_tflops(name) == tflops


def test_model_flops_count_dense_and_causal_attention_products():
    # 10 parameters, 2 layers of attention width 4, sequences of 3 and 5 tokens
    dense, attention = bench.model_flops(10, 2, 4, [3, 5], backward=False)
    assert dense == 2 * 10 * 8
    assert attention == 2 * 2 * 4 * (9 + 25)
    dense_backward, attention_backward = bench.model_flops(10, 2, 4, [3, 5], backward=True)
    assert (dense_backward, attention_backward) == (3 * dense, 3 * attention)


def test_a_tied_embedding_counts_once_and_an_untied_input_embedding_not_at_all():
    tied = SimpleNamespace(tie_word_embeddings=True, vocab_size=100, hidden_size=8)
    untied = SimpleNamespace(tie_word_embeddings=False, vocab_size=100, hidden_size=8)
    assert bench.matmul_parameters(tied, 5000) == 5000
    assert bench.matmul_parameters(untied, 5000) == 5000 - 800


def test_the_qwen_shapes_are_qwen25s_configs():
    small, large = bench.SHAPES["qwen2.5-0.5b"].model, bench.SHAPES["qwen2.5-1.5b"].model
    assert (small["hidden_size"], small["num_hidden_layers"], small["intermediate_size"]) == (
        896,
        24,
        4864,
    )
    assert (large["hidden_size"], large["num_hidden_layers"], large["intermediate_size"]) == (
        1536,
        28,
        8960,
    )
    assert small["vocab_size"] == large["vocab_size"] == 151936
    # the published sizes: 0.49B and 1.54B parameters (the norms and biases are a rounding)
    assert round(bench.approximate_parameters(small) / 1e9, 2) == 0.49
    assert round(bench.approximate_parameters(large) / 1e9, 2) == 1.54


def test_an_unknown_shape_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--shapes: unknown qwen9; choose of tiny"):
        bench.main(["--shapes", "qwen9", "--out", str(tmp_path)])


def test_a_failed_or_skipped_shape_says_where_and_why():
    failed = {
        "shape": "qwen2.5-1.5b",
        "status": "failed",
        "phase": "update",
        "error": "out of memory: OutOfMemoryError: CUDA out of memory",
    }
    assert bench.verdict(failed) == (
        "FAIL qwen2.5-1.5b (update): out of memory: OutOfMemoryError: CUDA out of memory"
    )
    skipped = {"shape": "qwen2.5-1.5b", "status": "skipped", "error": "40 s of --budget-s left"}
    assert bench.verdict(skipped) == "SKIP qwen2.5-1.5b: 40 s of --budget-s left"
    assert "| qwen2.5-1.5b | FAILED: out of memory" in bench.table([failed], "a device")


@pytest.mark.slow
def test_the_tiny_shape_runs_the_whole_path_on_cpu(tmp_path, capsys):
    out = tmp_path / "out"
    code = bench.main(
        [
            *("--device", "cpu", "--shapes", "tiny", "--no-smoke", "--out", str(out)),
            *("--workdir", str(tmp_path / "work"), "--peak-tflops", "1"),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed + (out / "gpu-bench-tiny.log").read_text()
    assert "PASS tiny: 2 measured steps of 4 x 4 rows" in printed
    document = json.loads((out / "gpu-bench.json").read_text())
    (tiny,) = document["shapes"]
    assert tiny["status"] == "passed"
    rows = tiny["batch"]["prompts"] * tiny["batch"]["n"]
    assert tiny["generate"]["rows"] == rows
    assert 0 < tiny["generate"]["response_tokens"] <= rows * 32
    for phase in ("log_prob", "update"):
        assert tiny[phase]["tokens_per_s"] > 0
        assert 0 < tiny[phase]["mfu"] < tiny[phase]["mfu_attn"]
        # prompt and response tokens of every row, none of the padding
        assert tiny["generate"]["response_tokens"] < tiny[phase]["tokens"] <= rows * 64
    assert tiny["weight_sync"]["seconds"] > 0 and tiny["step"]["seconds"] > 0
    # no device memory on a CPU; every phase still has its key
    assert tiny["max_memory_allocated_gib"] == dict.fromkeys(bench.PHASES)
    assert "| tiny |" in (out / "gpu-bench.txt").read_text()
