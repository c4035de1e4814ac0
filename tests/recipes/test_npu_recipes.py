"""The NPU recipes (recipes/npu/) validate with ``plugrl run --print-config``.

They choose parts of plugrl-npu and plugrl-sglang, installed here from this repository, and
name torch_npu and SGLang, which cannot be installed here: empty packages of those names stand
in for them, since validating a recipe only checks that they are importable. The recipes on
Megatron with the fully-async scheduler also need plugrl-megatron and the ``fully_async``
scheduler; where those are not installed, their tests are skipped with that reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from plugrl.plugin.manager import PluginManager
from tests.accelerator_plugins import ROOT, pip_install, plugrl

RECIPES = ROOT / "recipes" / "npu"
ON_FSDP2 = ["gsm8k-grpo-qwen2.5-0.5b-npu", "dapo-qwen3-32b-npu"]
ON_MEGATRON_FULLY_ASYNC = [
    "gsm8k-grpo-qwen2.5-0.5b-npu-fully-async",
    "dapo-qwen3-30b-a3b-npu-fully-async",
    "grpo-qwen3-235b-npu-fully-async",
]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    site = pip_install(tmp_path_factory.mktemp("site"), "plugrl-sglang", "plugrl-npu")
    libraries = tmp_path_factory.mktemp("libraries")
    for name in ("torch_npu", "sglang"):
        (libraries / name).mkdir()
        (libraries / name / "__init__.py").write_text("")
    return [site, libraries]


def resolved(name: str, path: list[Path]) -> dict:
    result = plugrl("run", str(RECIPES / f"{name}.yaml"), "--print-config", path=path)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_every_npu_recipe_is_tested():
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted(
        ON_FSDP2 + ON_MEGATRON_FULLY_ASYNC
    )


def test_the_synchronous_gsm8k_recipe_keeps_the_seed_settings(path):
    recipe = resolved("gsm8k-grpo-qwen2.5-0.5b-npu", path)
    assert recipe["device"] == {"name": "npu", "fused_kernels": True}
    assert recipe["actor"]["backend"] == "fsdp2"
    assert (recipe["rollout"]["engine"], recipe["rollout"]["n"]) == ("sglang", 8)
    assert recipe["rollout"]["gpu_memory_utilization"] == 0.7
    assert recipe["trainer"]["n_gpus_per_node"] == 2
    assert recipe["actor"]["optim"]["lr"] == 5.0e-7
    assert recipe["actor"]["kl_loss_type"] == "low_var_kl"


def test_the_dapo_qwen3_32b_recipe_keeps_the_seed_settings(path):
    recipe = resolved("dapo-qwen3-32b-npu", path)
    actor, rollout = recipe["actor"], recipe["rollout"]
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (0.2, 0.28)
    assert actor["loss_agg_mode"] == "token-mean" and actor["use_kl_loss"] is False
    assert actor["param_offload"] is True and actor["use_dynamic_bsz"] is True
    assert (rollout["engine"], rollout["n"], rollout["tensor_model_parallel_size"]) == (
        "sglang",
        16,
        4,
    )
    assert recipe["reward"]["manager"] == "dapo"
    assert recipe["reward"]["overlong_buffer"] == {
        "enable": True,
        "len": 4096,
        "penalty_factor": 1.0,
        "log": False,
    }
    assert recipe["data"]["max_response_length"] == 20480
    # four nodes of 16 NPUs: two train, two generate
    trainer_npus = recipe["trainer"]["nnodes"] * recipe["trainer"]["n_gpus_per_node"]
    assert trainer_npus + rollout["nnodes"] * rollout["n_gpus_per_node"] == 64


def _missing_parts() -> str | None:
    plugins = PluginManager()
    plugins.load_entry_points()
    missing = []
    if "megatron" not in plugins.registry("training_backends"):
        missing.append("the megatron backend (plugrl-megatron)")
    if "fully_async" not in plugins.registry("schedulers"):
        missing.append("the fully_async scheduler")
    return " and ".join(missing) + " not installed" if missing else None


@pytest.mark.parametrize("name", ON_MEGATRON_FULLY_ASYNC)
def test_the_megatron_fully_async_recipes_validate(name, path):
    reason = _missing_parts()
    if reason:
        pytest.skip(reason)
    recipe = resolved(name, path)
    assert recipe["device"]["name"] == "npu"
    assert recipe["actor"]["backend"] == "megatron"
    assert recipe["actor"]["override_transformer_config"]["use_flash_attn"] is True
    scheduler = recipe["scheduler"]
    assert scheduler["name"] == "fully_async"
    assert scheduler["partial_rollout"] is True and scheduler["use_rollout_log_probs"] is True
