"""The example third-party plugins, installed with pip, are found and used by name.

The packages are installed into a temporary folder (``pip install --target``) put on the path,
as a user's ``pip install`` would put them in site-packages.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plugrl.data.batch import Batch
from plugrl.errors import RecipeError
from plugrl.plugin.manager import PluginManager, get_plugin_manager, set_plugin_manager
from plugrl.recipe import build_recipe, load_recipe, part_args
from plugrl.testing import make_batch, make_loss_aggregator, part_context
from tests.support import pip_install_into

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    pip_install_into(
        target,
        EXAMPLES / "plugrl-countdown",
        EXAMPLES / "plugrl-median-baseline",
        EXAMPLES / "plugrl-regenerate",
        EXAMPLES / "plugrl-word-guess",
    )
    return target


@pytest.fixture
def manager(installed, monkeypatch):
    monkeypatch.syspath_prepend(str(installed))
    manager = PluginManager(environ={})
    manager.load_entry_points()
    previous = set_plugin_manager(manager)
    yield manager
    set_plugin_manager(previous)


def test_cli_lists_the_installed_examples(installed):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    result = subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["countdown"]["distribution"] == "plugrl-countdown"
    assert rows["countdown"]["registers"]["reward_functions"][0]["name"] == "countdown"
    assert rows["median_baseline"]["version"] == "0.2.0"
    assert rows["regenerate"]["registers"]["schedulers"][0]["name"] == "regenerate"
    assert rows["word_guess"]["registers"]["environments"][0]["name"] == "word_guess"
    assert rows["median_baseline"]["registers"]["advantage_estimators"][0]["name"] == (
        "median_baseline"
    )
    assert rows["median_baseline"]["registers"]["policy_losses"][0]["name"] == "robust_ppo"


def run_cli(installed: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "plugrl_tools.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(installed)},
        timeout=300,
    )


@pytest.mark.parametrize(
    ("package", "tests"),
    [
        ("plugrl-countdown", 15),
        ("plugrl-median-baseline", 12),
        ("plugrl-regenerate", 5),
        ("plugrl-word-guess", 13),
    ],
)
def test_each_packages_own_tests_pass_against_the_installed_package(installed, package, tests):
    """As the author runs them: the package pip-installed (not editable), pytest in its folder
    with plugrl's test kit. The source folder is not on the path: the tests import the
    installed copy, and check that its entry point registered it."""
    folder = EXAMPLES / package
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(installed)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{tests} passed" in result.stdout
    module = package.replace("-", "_")
    where = subprocess.run(
        [sys.executable, "-c", f"import {module}; print({module}.__file__)"],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(installed)},
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed)


def test_countdown_options_reach_the_scoring_function_from_a_recipe(manager, tmp_path):
    from plugrl.parts.scoring import make_resolver

    path = tmp_path / "recipe.yaml"
    path.write_text(
        "reward:\n  function_args:\n    countdown: {format_score: 0.25, use_all_numbers: false}\n"
    )
    recipe = load_recipe(
        path, ["reward.function_args.countdown.correct_score=2"], get_plugin_manager()
    )
    scorer = make_resolver(recipe, get_plugin_manager())("countdown")
    assert scorer.kwargs == {"correct_score": 2.0, "format_score": 0.25, "use_all_numbers": False}
    truth = {"target": 24, "numbers": [3, 5, 8, 2]}
    assert scorer("countdown", "<answer>3 * 8</answer>", truth)["score"] == 2.0  # 5, 2 unused
    assert scorer("countdown", "<answer>3 * 8 * 1</answer>", truth)["score"] == 0.25
    assert scorer("countdown", "no answer", truth)["score"] == 0.0
    # without options, the function's defaults
    default = make_resolver(load_recipe(None, (), get_plugin_manager()), get_plugin_manager())(
        "countdown"
    )
    assert default("countdown", "<answer>3 * 8</answer>", truth)["score"] == pytest.approx(0.1)


def test_a_bad_countdown_option_fails_in_one_line_naming_the_key(manager, installed):
    with pytest.raises(RecipeError) as info:
        build_recipe(
            {"reward": {"function_args": {"countdown": {"format_score": 2.0}}}},
            get_plugin_manager(),
        )
    assert str(info.value) == (
        "reward.function_args.countdown.format_score: must be below correct_score (1.0), got 2.0"
    )
    result = run_cli(
        installed, "run", "quickstart", "reward.function_args.countdown.format_scor=0.2"
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "Error: reward.function_args.countdown.format_scor: unknown key; did you mean "
        "'reward.function_args.countdown.format_score'?"
    ]


def test_plugrl_explain_shows_the_loss_options(installed):
    result = run_cli(installed, "explain", "actor.policy_loss_args.max_advantage")
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[0] == "actor.policy_loss_args.max_advantage"
    assert lines[1].startswith("Advantages are clipped to [-max_advantage, max_advantage]")
    assert "type:    float" in lines and "default: 3.0" in lines
    assert "from:    policy loss robust_ppo (median_baseline)" in lines
    dual = run_cli(installed, "explain", "actor.policy_loss_args.dual_clip")
    assert "default: true" in dual.stdout  # YAML spelling


def test_robust_ppo_is_the_loss_of_the_objective_from_a_recipe(manager):
    from plugrl.algorithms.objective import PolicyObjective

    recipe = build_recipe(
        {
            "actor": {
                "policy_loss": "robust_ppo",
                "policy_loss_args": {"max_advantage": 1.5},
                "loss_agg_mode": "seq-mean-token-mean",
            }
        },
        get_plugin_manager(),
    )
    objective = PolicyObjective.from_recipe(recipe, get_plugin_manager())
    assert type(objective.policy_loss).__name__ == "RobustPPO"
    assert objective.policy_loss.args.max_advantage == 1.5
    batch = make_batch((2, 4), [2, 1, 3, 2], advantages=[4.0, -1.0, 0.0, -3.0], log_probs=True)
    log_prob = batch["old_log_probs"].clone().requires_grad_(True)
    scale = make_loss_aggregator(batch, recipe=recipe).scale
    loss, metrics = objective(batch, log_prob, None, scale)
    loss.backward()
    # ratio 1: the gradient of a token is -A (clipped to +-1.5) / its length / 4 sequences
    lengths = batch["response_mask"].sum(dim=-1, keepdim=True)
    clipped = torch.tensor([1.5, -1.0, 0.0, -1.5]).unsqueeze(-1)
    expected = -clipped / lengths / 4 * batch["response_mask"]
    assert torch.allclose(log_prob.grad, expected)
    assert metrics["actor/adv_clipfrac"] == pytest.approx(4 / 8)
    # the objective travels to trainer workers as its recipe and finds the loss there again
    import pickle

    again = pickle.loads(pickle.dumps(objective))
    again.attach(manager)  # as a trainer worker attaches its own plugins
    assert type(again.policy_loss).__name__ == "RobustPPO"


def test_countdown_scores_by_data_source(manager):
    score = manager.registry("reward_functions").match("countdown").load()
    truth = {"target": 24, "numbers": [3, 5, 8, 2]}
    assert score("countdown", "so <answer>(5 - 3 + 2) * 8 / 8 * 6</answer>", truth)["acc"] == 0
    assert score("countdown", "<answer>(5 - 2) * 8 * 3</answer>", truth)["score"] == 0.1
    assert (
        score(
            "countdown", "first <answer>1</answer> then <answer>(5 - 3 + 8) * 2 + 4</answer>", truth
        )["score"]
        == 0.1
    )
    assert score("countdown", "<answer>(8 - 5 + 3) * 2 * 2</answer>", truth)["score"] == 0.1
    assert score("countdown", "<answer>(8 - 5) * (2 + 3) + 9</answer>", truth)["score"] == 0.1
    assert score("countdown", "<answer>3 * 8 * (5 - 2) / 3</answer>", truth)["score"] == 0.1
    correct = score(
        "countdown",
        "think... <answer>(5 - 3) * 8 + 8</answer>",
        {"target": 24, "numbers": [5, 3, 8, 8]},
    )
    assert correct == {"score": 1.0, "acc": 1.0, "pred": "(5 - 3) * 8 + 8"}
    assert score("countdown", "no tag here", truth)["score"] == 0.0
    # model output is parsed, never run
    hostile = score("countdown", "<answer>__import__('os').system('true')</answer>", truth)
    assert hostile["score"] == 0.1 and hostile["acc"] == 0.0


def test_median_baseline_is_usable_from_a_recipe(manager):
    from tests import fake_parts

    manager.register(fake_parts, "fake-parts")
    recipe = build_recipe(
        {
            **fake_parts.BASE_RECIPE,
            "algorithm": {
                "adv_estimator": "median_baseline",
                "kl_penalty": "fakekl",
                "adv_estimator_args": {"scale_by_mad": True},
            },
        },
        get_plugin_manager(),
    )
    args = part_args(recipe, "algorithm", "adv_estimator_args", get_plugin_manager())
    estimator_cls = manager.registry("advantage_estimators").load("median_baseline")
    estimator = estimator_cls(recipe.algorithm, part_context(recipe, options=args))
    rewards = torch.zeros(5, 3)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 4.0, 2.0, 2.0])
    mask = torch.tensor([[1, 1, 0]] * 5)
    batch = Batch(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        columns={"uid": ["a", "a", "a", "b", "b"]},
    )
    advantages, returns = estimator.compute(batch)
    # group a: scores 1, 0, 4 -> median 1, |dev| 0, 1, 3 -> MAD 1; group b: all 2 -> 0
    expected = torch.tensor([0.0, -1.0, 3.0, 0.0, 0.0]) / (1 + 1e-6)
    assert torch.allclose(advantages[:, 0], expected)
    assert torch.equal(advantages[:, 2], torch.zeros(5))  # masked token
    assert torch.equal(advantages, returns)


def test_a_plugin_written_from_the_docs_works(tmp_path, monkeypatch):
    """Build the package that docs/plugins.md describes, from its code blocks alone."""
    doc = (ROOT / "docs" / "plugins.md").read_text()
    blocks = dict(re.findall(r"`([^`\n]+)`:\n\n```\w+\n(.*?)```", doc, re.DOTALL))
    package = tmp_path / "plugrl-my-task"
    for name in (
        "pyproject.toml",
        "src/plugrl_my_task/__init__.py",
        "src/plugrl_my_task/scoring.py",
    ):
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(blocks[name])
    site = tmp_path / "site"
    pip_install_into(site, package)
    monkeypatch.syspath_prepend(str(site))
    manager = PluginManager(environ={})
    manager.load_entry_points()
    row = next(r for r in manager.describe() if r["name"] == "my_task")
    assert row["distribution"] == "plugrl-my-task"
    score = manager.registry("reward_functions").match("my_task").load()
    assert score("my_task", "so the answer is 4", "4") == 1.0

    # the documented tests of the plugin pass with the plugin installed (not editable), as a
    # plugin author runs them
    testing = doc[doc.index("## Testing a plugin") :]
    tests = re.search(r"```python\n(.*?)```", testing, re.DOTALL)
    assert tests is not None
    test_file = tmp_path / "test_my_task.py"
    test_file.write_text(tests.group(1))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(tmp_path)])},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout


def test_median_baseline_values_reach_the_policy_loss(manager):
    """A recipe chooses the third-party estimator; its advantages drive the built-in loss."""
    from plugrl.algorithms.functional import loss_scale_from_mask
    from plugrl.algorithms.objective import PolicyObjective
    from plugrl.plugin.build import build_estimator
    from tests import fake_parts

    manager.register(fake_parts, "fake-parts")
    recipe = build_recipe(
        {
            **fake_parts.BASE_RECIPE,
            "actor": {
                "backend": "fakebackend",
                "policy_loss": "vanilla",
                "loss_agg_mode": "token-mean",
            },
            "algorithm": {"adv_estimator": "median_baseline"},
        },
        get_plugin_manager(),
    )
    rewards = torch.zeros(4, 2)
    rewards[:, 1] = torch.tensor([3.0, 1.0, 0.0, 5.0])
    mask = torch.tensor([[1, 1]] * 4)
    batch = Batch(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        columns={"uid": ["a", "a", "b", "b"]},
    )
    advantages, _ = build_estimator(recipe, get_plugin_manager()).compute(batch)
    # medians: group a (3, 1) -> 2, group b (0, 5) -> 2.5
    assert advantages[:, 0].tolist() == [1.0, -1.0, -2.5, 2.5]
    log_prob = torch.zeros(4, 2, requires_grad=True)
    micro = Batch(
        tensors={
            "old_log_probs": torch.zeros(4, 2),
            "advantages": advantages,
            "response_mask": mask,
        }
    )
    loss, metrics = PolicyObjective.from_recipe(recipe, get_plugin_manager())(
        micro, log_prob, None, loss_scale_from_mask(mask)
    )
    loss.backward()
    # ratio 1 everywhere: loss = -token-mean(A) = 0, gradient = -A / num_tokens
    assert torch.allclose(log_prob.grad, -advantages / 8)
    assert metrics["actor/pg_loss"] == pytest.approx(0.0)


def test_the_scheduler_in_the_docs_is_the_example_scheduler():
    """docs/plugins.md shows the example's scheduler whole: the page and the package, whose
    own tests run it, say the same thing."""
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = page.split("## Writing a scheduler\n", 1)[1].split("\n## ", 1)[0]
    shown = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    source = (
        EXAMPLES / "plugrl-regenerate" / "src" / "plugrl_regenerate" / "scheduler.py"
    ).read_text(encoding="utf-8")
    assert shown.strip() in source
