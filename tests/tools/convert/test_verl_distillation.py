"""`plugrl convert verl` on verl's on-policy distillation scripts (in the current corpus,
fixtures/verl-current, listed with their source in its SOURCES): the ``distillation`` section
in plugrl's layout, one teacher or several, and a recipe that validates."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugrl.plugin.manager import get_plugin_manager
from plugrl_tools.convert.output import validate
from plugrl_tools.convert.verl import convert_script

OPD = Path(__file__).parent / "fixtures" / "verl-current"
EXAMPLES = OPD / "examples" / "on_policy_distillation_trainer"
SCRIPTS = [*EXAMPLES.glob("*.sh"), OPD / "tests" / "special_e2e" / "run_v1_separate_async_opd.sh"]
"""verl's distillation scripts: its distillation examples and its V1 trainer's OPD test."""
INHERITED = {"HOME": "/home/user", "USER": "user", "PWD": "/home/user/verl"}


def convert(path: Path):
    return convert_script(
        path.read_text(encoding="utf-8"),
        path.name,
        plugins=get_plugin_manager(),
        inherited=INHERITED,
    )


def unmapped_keys(conversion) -> dict[str, str]:
    return {u.override.partition("=")[0].lstrip("+"): u.category for u in conversion.unmapped}


def test_one_teacher_takes_verls_whole_teacher_pool(plugrl_plugin_manager):
    conversion = convert(EXAMPLES / "run_qwen3_8b_fsdp.sh")
    distillation = conversion.recipe["distillation"]
    teacher = distillation["teachers"]["teacher_model"]
    assert teacher["model"] == {"path": "Qwen/Qwen3-32B"}
    assert teacher["engine"] == "vllm"
    # distillation.n_gpus_per_node=TEACHER_WORLD_SIZE (4) on distillation.nnodes=NNODES (1)
    assert (teacher["rollout"]["nnodes"], teacher["rollout"]["n_gpus_per_node"]) == (1, 4)
    assert teacher["rollout"]["tensor_model_parallel_size"] == 2
    assert distillation["enabled"] is True
    assert distillation["loss"] == {
        "loss_mode": "k1",
        "use_policy_gradient": True,
        "use_task_rewards": False,
        "loss_max_clamp": 10.0,
        "log_prob_min_clamp": -10.0,
        "topk": 64,
    }
    # vllm is not installed in these tests: its own keys (max_model_len) wait for it
    assert {
        key: category
        for key, category in unmapped_keys(conversion).items()
        if key.startswith("distillation.") and category != "plugin"
    } == {}
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None, validation.error


def test_several_teachers_route_by_data_source_on_devices_of_their_own(plugrl_plugin_manager):
    conversion = convert(EXAMPLES / "run_qwen3_8b_mopd_fsdp.sh")
    distillation = conversion.recipe["distillation"]
    teachers = distillation["teachers"]
    # verl's default teacher_model entry is dropped once others are named
    assert sorted(teachers) == ["geo3k", "gsm8k"]
    assert teachers["gsm8k"]["key"] == "openai/gsm8k"
    assert teachers["geo3k"]["key"] == "hiyouga/geometry3k"
    for teacher in teachers.values():
        # one replica of tensor_model_parallel_size 2 each
        assert (teacher["rollout"]["nnodes"], teacher["rollout"]["n_gpus_per_node"]) == (1, 2)
    validation = validate(conversion.recipe, get_plugin_manager(), check_files=False)
    assert validation.error is None, validation.error


@pytest.mark.parametrize("script", sorted(path.relative_to(OPD).as_posix() for path in SCRIPTS))
def test_every_distillation_script_converts_its_teachers(script, plugrl_plugin_manager):
    conversion = convert(OPD / script)
    distillation = conversion.recipe["distillation"]
    assert distillation["enabled"] is True
    assert distillation["teachers"], "no teacher converted"
    for teacher in distillation["teachers"].values():
        assert teacher["model"]["path"]
    # every distillation key is converted or reported with its reason
    assert all(
        category in ("dropped", "plugin") or not key.startswith("distillation.")
        for key, category in unmapped_keys(conversion).items()
    ), unmapped_keys(conversion)
