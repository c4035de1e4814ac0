"""Without Ray (the ``plugrl[ray]`` extra), every setting that needs it stops the run at start-up
with one line naming the setting and the install command, never with an import traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugrl.cluster.ray_group import (
    check_ray_installed,
    ensure_ray,
    import_ray,
    ray_installed,
    ray_needs,
)
from plugrl.errors import PluginError, RecipeError
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import ClusterConfig, build_recipe, load_recipe
from plugrl_reward_managers.ray_pool import RayPool
from plugrl_sim.parts import build_sim_task, sim_recipe

INSTALL = "pip install 'plugrl[ray]'"


def missing(needs: str) -> str:
    return f"{needs} needs Ray, which is not installed here: {INSTALL}"


@pytest.fixture
def no_ray(monkeypatch):
    """``import ray`` fails, as where the extra is not installed."""
    for name in [name for name in sys.modules if name == "ray" or name.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)


def hidden_ray_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess in which ``import ray`` fails."""
    hide = tmp_path / "hide-ray"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hide), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def test_what_needs_ray_is_named_by_its_setting():
    recipe = build_recipe(
        {
            "cluster": "ray",
            "rollout": {"weight_transport": "object_store"},
            "reward": {"manager": "parallel", "backend": "ray"},
        },
        get_plugin_manager(),
    )
    assert ray_needs(recipe) == [
        "cluster.mode=ray",
        "rollout.weight_transport=object_store",
        "reward.backend=ray",
    ]
    assert ray_needs(build_recipe({}, get_plugin_manager())) == []


def test_with_ray_installed_nothing_is_refused():
    assert ray_installed()  # the test extra installs it
    check_ray_installed(build_recipe({"cluster": "ray"}, get_plugin_manager()))


def test_without_ray_each_need_is_one_line(no_ray):
    assert not ray_installed()
    with pytest.raises(PluginError) as error:
        check_ray_installed(
            build_recipe(
                {"reward": {"manager": "parallel", "backend": "ray"}}, get_plugin_manager()
            )
        )
    assert str(error.value) == missing("reward.backend=ray")
    with pytest.raises(PluginError) as error:
        check_ray_installed(
            build_recipe(
                {"cluster": "ray", "reward": {"manager": "parallel", "backend": "ray"}},
                get_plugin_manager(),
            )
        )
    assert str(error.value) == (
        f"cluster.mode=ray and reward.backend=ray need Ray, which is not installed here: {INSTALL}"
    )
    check_ray_installed(build_recipe({}, get_plugin_manager()))  # a run that does not need Ray


def test_without_ray_the_places_that_import_it_say_so_in_one_line(no_ray):
    with pytest.raises(PluginError) as error:
        import_ray("cluster.mode=ray")
    assert str(error.value) == missing("cluster.mode=ray")
    with pytest.raises(PluginError) as error:
        ensure_ray(ClusterConfig(mode="ray"))
    assert str(error.value) == missing("cluster.mode=ray")
    with pytest.raises(PluginError) as error:
        RayPool(2)
    assert str(error.value) == missing("reward.backend=ray")


def test_without_ray_the_object_store_transport_is_refused_by_the_recipe(no_ray):
    with pytest.raises(RecipeError) as error:
        build_recipe({"rollout": {"weight_transport": "object_store"}}, get_plugin_manager())
    assert str(error.value) == (
        "rollout.weight_transport: weight transport 'object_store' (plugin 'transports') is "
        f"installed but cannot run here: it needs ray ({INSTALL})"
    )


def run_cli(args, cwd, env):
    return subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    "overrides, needs",
    [
        (["cluster=ray"], "cluster.mode=ray"),
        (["reward.manager=parallel", "reward.backend=ray"], "reward.backend=ray"),
    ],
)
def test_a_run_that_needs_ray_stops_at_start_up_in_one_line(
    tmp_path, overrides, needs, write_recipe
):
    task = build_sim_task(tmp_path / "task", num_train=16, num_val=4)
    recipe = write_recipe(sim_recipe(task, tmp_path / "run", steps=1))
    result = run_cli(["run", str(recipe), *overrides], tmp_path, hidden_ray_env(tmp_path))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"Error: {missing(needs)}"
    assert "Traceback" not in result.stderr
    # stopped before anything was recorded or logged
    assert not (tmp_path / "run" / "recipe.yaml").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_async_guide_commands_on_ray_stop_in_one_line_without_ray(tmp_path):
    """docs/async.md's ``plugrl run quickstart-async cluster=ray ...`` where Ray is missing."""
    recipe = load_recipe("quickstart-async", (), get_plugin_manager())
    # the recipe's relative path, which the command resolves in its own working folder
    model = tmp_path / os.path.relpath(recipe.model.path)
    model.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (model / name).write_text("{}")
    command = "run quickstart-async cluster=ray trainer.n_gpus_per_node=1 rollout.n_gpus_per_node=1"
    result = run_cli(command.split(), tmp_path, hidden_ray_env(tmp_path))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: cluster.mode=ray needs Ray, which is not installed here: {INSTALL}"
    ]
