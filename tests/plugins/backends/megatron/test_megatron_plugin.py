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
