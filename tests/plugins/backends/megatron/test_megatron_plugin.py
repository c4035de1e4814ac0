"""The distribution: registration, availability without megatron-core, the prepare hook."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("plugrl_megatron", reason="pip install -e plugins/backends/megatron")
import tomllib

from plugrl.errors import RecipeError
from plugrl.recipe import build_recipe
from tests import install_hints as hints

PLUGIN_FOLDER = Path(__file__).resolve().parents[4] / "plugins" / "backends" / "megatron"
NEEDS = f"needs megatron ({hints.MEGATRON})"


def test_the_plugin_is_a_distribution_of_its_own_pinning_the_tested_megatron_core():
    assert not (PLUGIN_FOLDER / "__init__.py").exists()
    project = tomllib.loads((PLUGIN_FOLDER / "pyproject.toml").read_text())["project"]
    assert project["name"] == "plugrl-megatron"
    assert project["entry-points"]["plugrl"] == {"megatron": "plugrl_megatron"}
    (pin,) = project["optional-dependencies"]["megatron"]
    assert pin.startswith("megatron-core==")
    try:
        installed = metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return
    assert pin == f"megatron-core=={installed}"


def test_without_megatron_core_the_backend_is_listed_unavailable_and_refused(
    plugrl_plugin_manager, monkeypatch
):
    monkeypatch.setitem(sys.modules, "megatron", None)  # as if not installed
    entry = plugrl_plugin_manager.registry("training_backends").get("megatron")
    assert not entry.available
    assert entry.unavailable_reason == NEEDS
    with pytest.raises(RecipeError) as error:
        build_recipe({"actor": {"backend": "megatron"}}, plugrl_plugin_manager)
    assert str(error.value) == (
        "actor.backend: training backend 'megatron' (plugin 'megatron') is installed but "
        f"cannot run here: it {NEEDS}"
    )


def test_the_cli_lists_the_backend_unavailable_when_megatron_core_is_missing(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['megatron'] = None\n")
    env = {"PYTHONPATH": str(hide), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "plugrl_tools.cli"]
    listing = subprocess.run([*cli, "plugins", "--all"], capture_output=True, text=True, env=env)
    assert f"megatron [unavailable: {NEEDS}]" in listing.stdout


def test_the_recipe_keys_carry_verl_names():
    import attrs

    from plugrl_megatron.config import MegatronActorConfig

    assert MegatronActorConfig(tensor_model_parallel_size=2).tensor_model_parallel_size == 2
    verl = {f.name: f.metadata["verl"] for f in attrs.fields(MegatronActorConfig)}
    assert verl["tensor_model_parallel_size"] == (
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"
    )
    assert verl["override_transformer_config"] == (
        "actor_rollout_ref.actor.megatron.override_transformer_config"
    )
    assert verl["optimizer_cpu_offload"] == (
        "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload"
    )
    megatron = "actor_rollout_ref.actor.megatron"
    for name in (
        "param_offload",
        "grad_offload",
        "optimizer_offload",
        "use_dist_checkpointing",
        "dist_checkpointing_path",
        "use_mbridge",
        "vanilla_mbridge",
    ):
        assert verl[name] == f"{megatron}.{name}"
    assert verl["ref_param_offload"] == "actor_rollout_ref.ref.megatron.param_offload"


VERL_SCRIPT = r"""python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer.yaml' \
    actor_rollout_ref.model.path=/models/qwen \
    actor_rollout_ref.actor.megatron.param_offload=False \
    actor_rollout_ref.actor.megatron.grad_offload=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=True \
    actor_rollout_ref.ref.megatron.param_offload=True \
    actor_rollout_ref.actor.megatron.use_dist_checkpointing=True \
    actor_rollout_ref.actor.megatron.dist_checkpointing_path=/ckpt/mcore \
    actor_rollout_ref.ref.megatron.use_dist_checkpointing=True \
    actor_rollout_ref.ref.megatron.dist_checkpointing_path=/ckpt/mcore \
    actor_rollout_ref.actor.megatron.use_mbridge=True \
    actor_rollout_ref.actor.megatron.vanilla_mbridge=False
"""


def test_verl_s_offload_dist_checkpoint_and_mbridge_keys_convert(plugrl_make_plugin_manager):
    from plugrl_tools.convert.output import validate
    from plugrl_tools.convert.verl import convert_script

    plugins = plugrl_make_plugin_manager()
    conversion = convert_script(VERL_SCRIPT, "run.sh", plugins=plugins)
    # the reference model's offload is its own key, not the actor's (they differ here); its
    # dist checkpoint is the actor's (plugrl's reference model starts from the actor's weights)
    assert conversion.recipe["actor"] == {
        "backend": "megatron",
        "grad_offload": True,
        "optimizer_offload": True,
        "ref_param_offload": True,
        "use_dist_checkpointing": True,
        "dist_checkpointing_path": "/ckpt/mcore",
    }
    # without LoRA, Megatron-Bridge only builds the same model from the same weights: the
    # converter drops the switch, as the plugin's own refusal of it advises (set it true)
    assert [(u.category, u.override) for u in conversion.unmapped] == [
        ("dropped", "actor_rollout_ref.actor.megatron.vanilla_mbridge=False")
    ]
    assert conversion.unmapped[0].reason.startswith(
        "verl's choice of the library that builds the Megatron model from the Hugging Face weights"
    )
    result = validate(conversion.recipe, plugins, check_files=False)
    assert (result.error, result.missing) == (None, ())


def test_megatron_bridge_is_refused_in_one_line(plugrl_plugin_manager):
    with pytest.raises(RecipeError) as error:
        build_recipe(
            {"actor": {"backend": "megatron", "vanilla_mbridge": False}}, plugrl_plugin_manager
        )
    assert str(error.value) == (
        "actor.vanilla_mbridge: false asks for NVIDIA's Megatron-Bridge (its model providers "
        "and LoRA), which plugrl-megatron does not have; set it true (plugrl converts "
        "Qwen2/Qwen3 dense weights itself) (got False)"
    )


def test_the_readme_names_every_key_of_the_backend():
    import attrs

    from plugrl.parts.backend import ActorConfig
    from plugrl_megatron.config import MegatronActorConfig

    common = {field.name for field in attrs.fields(ActorConfig)}
    own = [f.name for f in attrs.fields(MegatronActorConfig) if f.name not in common]
    readme = (PLUGIN_FOLDER / "README.md").read_text(encoding="utf-8")
    assert [name for name in own if f"`{name}`" not in readme] == []


def test_importing_the_backend_module_does_not_import_megatron():
    """The driver loads the class before prepare_backend runs in its process."""
    code = (
        "import sys, plugrl_megatron.backend; "
        "print(sorted(m for m, module in sys.modules.items() "
        "if m.split('.')[0] == 'megatron' and module is not None))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_prepare_backend_leaves_other_devices_and_backends_alone():
    import plugrl_megatron

    assert plugrl_megatron.prepare_backend("cuda", "megatron", None) is None
    assert plugrl_megatron.prepare_backend("cpu", "fsdp2", None) is None


def test_prepare_backend_on_cpu_says_what_it_patched_once():
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.tensor_parallel import random as megatron_random

    import plugrl_megatron

    tracker = megatron_random.CudaRNGStatesTracker
    saved = (
        torch.cuda.current_device,
        tracker.fork,
        megatron_random._get_cuda_rng_state,
        megatron_random._set_cuda_rng_state,
    )
    try:
        assert plugrl_megatron.prepare_backend("cpu", "megatron", None) == [
            "torch.cuda.current_device -> cpu",
            "megatron CudaRNGStatesTracker.fork -> forks the CPU generator",
            "megatron _get/_set_cuda_rng_state -> the CPU generator's state",
        ]
        assert plugrl_megatron.prepare_backend("cpu", "megatron", None) == []
        assert torch.cuda.current_device() == torch.device("cpu")
        state = megatron_random._get_cuda_rng_state()
        first = torch.rand(3)
        megatron_random._set_cuda_rng_state(state)
        assert torch.equal(torch.rand(3), first)
    finally:
        (
            torch.cuda.current_device,
            tracker.fork,
            megatron_random._get_cuda_rng_state,
            megatron_random._set_cuda_rng_state,
        ) = saved


def _megatron_recipe(ranks: int, **parallel: int):
    from plugrl.parts.rollout import RolloutConfig
    from plugrl.recipe import ClusterConfig, DataConfig, Recipe, TrainerConfig
    from plugrl_megatron.config import MegatronActorConfig

    return Recipe(
        actor=MegatronActorConfig(backend="megatron", ppo_mini_batch_size=2, **parallel),
        data=DataConfig(train_batch_size=4),
        rollout=RolloutConfig(n=1),
        trainer=TrainerConfig(n_gpus_per_node=ranks),
        cluster=ClusterConfig(mode="ray"),
    )


def test_a_mini_batch_is_split_over_model_copies_not_over_all_ranks():
    from plugrl.recipe import check_recipe

    # 4 ranks, tensor parallel 2: 2 model copies share the 2 sequences of a mini-batch
    # (the check once divided them over all 4 ranks and refused)
    check_recipe(_megatron_recipe(4, tensor_model_parallel_size=2))
    check_recipe(_megatron_recipe(8, pipeline_model_parallel_size=2, context_parallel_size=2))
    with pytest.raises(RecipeError) as error:
        check_recipe(_megatron_recipe(8, tensor_model_parallel_size=2))
    assert str(error.value) == (
        "actor.ppo_mini_batch_size: ppo_mini_batch_size x rollout.n = 2 sequences per "
        "optimizer step cannot be split evenly over 4 data-parallel ranks (8 ranks of "
        "trainer.nnodes x trainer.n_gpus_per_node in model copies of 2); make it a multiple of 4"
    )


def test_a_micro_batch_divides_a_model_copys_share():
    from plugrl.recipe import check_recipe

    recipe = _megatron_recipe(4, tensor_model_parallel_size=2)
    recipe.actor.ppo_micro_batch_size_per_gpu = 2
    with pytest.raises(RecipeError) as error:
        check_recipe(recipe)
    assert str(error.value) == (
        "actor.ppo_micro_batch_size_per_gpu: 2 does not divide a rank's share of a mini-batch, "
        "1 sequences (actor.ppo_mini_batch_size 2 x rollout.n 1 / 2 data-parallel ranks); "
        "choose a divisor of 1"
    )


def test_ranks_that_do_not_make_whole_model_copies_are_refused_with_the_recipe():
    from plugrl.recipe import check_recipe

    with pytest.raises(RecipeError) as error:
        check_recipe(_megatron_recipe(3, tensor_model_parallel_size=2))
    assert str(error.value) == (
        "actor.tensor_model_parallel_size: 3 ranks cannot hold tensor x pipeline x context "
        "parallel = 2 x 1 x 1 = 2 ranks per model copy; make the role's rank count a multiple "
        "of 2"
    )


def test_lora_is_refused_when_the_recipe_is_read(plugrl_plugin_manager):
    with pytest.raises(RecipeError) as error:
        build_recipe(
            {"actor": {"backend": "megatron"}, "model": {"lora_rank": 8}}, plugrl_plugin_manager
        )
    assert str(error.value) == (
        "model.lora_rank: is 8, but the megatron backend trains no LoRA adapters; set "
        "model.lora_rank=0 to train every weight, or actor.backend=fsdp2"
    )
