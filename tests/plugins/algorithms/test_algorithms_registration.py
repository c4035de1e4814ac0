import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from plugrl.parts.algorithm import AdvantageEstimator, PolicyLoss
from plugrl.plugin.manager import set_plugin_manager
from plugrl_estimators import ESTIMATORS
from plugrl_kl_penalties import KL_PENALTIES
from plugrl_policy_losses import LOSSES
from plugrl_tools.cli import cli

EXPECTED_ESTIMATORS = {
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "grpo_passk",
    "gdpo",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
}
EXPECTED_LOSSES = {
    "vanilla",
    "gspo",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "cispo",
    "reinforce",
    "sapo",
    "dppo_tv",
    "dppo_kl",
}
EXPECTED_KL = {"kl", "abs", "mse", "low_var_kl", "kl+", "abs+", "low_var_kl+"}
EXPECTED_KL_ALIASES = {"k1", "k2", "k3", "k1+", "k3+", "mse+", "k2+"}


def test_tables_hold_every_name():
    assert set(ESTIMATORS) == EXPECTED_ESTIMATORS
    assert set(LOSSES) == EXPECTED_LOSSES
    assert set(KL_PENALTIES) == EXPECTED_KL


def test_every_part_and_config_loads(plugins):
    for entry in plugins.registry("advantage_estimators"):
        assert issubclass(entry.load(), AdvantageEstimator)
        entry.load_config()
    for entry in plugins.registry("policy_losses"):
        assert issubclass(entry.load(), PolicyLoss)
        entry.load_config()
    kl = plugins.registry("kl_penalties")
    assert set(kl.names(include_aliases=True)) == EXPECTED_KL | EXPECTED_KL_ALIASES
    for name in kl.names(include_aliases=True):
        assert callable(kl.load(name))


def test_registration_modules_do_not_import_torch():
    code = (
        "import sys, plugrl_estimators, plugrl_policy_losses, plugrl_kl_penalties; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.fixture
def installed():
    """The plugin manager a fresh process builds from the installed entry points."""
    previous = set_plugin_manager(None)
    try:
        yield
    finally:
        set_plugin_manager(previous)


def test_plugrl_plugins_command_lists_every_name(installed):
    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    for plugin in ("estimators", "policy_losses", "kl_penalties"):
        assert rows[plugin]["builtin"]
    estimators = rows["estimators"]["registers"]["advantage_estimators"]
    losses = rows["policy_losses"]["registers"]["policy_losses"]
    penalties = rows["kl_penalties"]["registers"]["kl_penalties"]
    assert {e["name"] for e in estimators} == EXPECTED_ESTIMATORS
    assert {e["name"] for e in losses} == EXPECTED_LOSSES
    assert {e["name"] for e in penalties} == EXPECTED_KL
    aliases = {alias for e in penalties for alias in e["aliases"]}
    assert aliases == EXPECTED_KL_ALIASES
    text = CliRunner().invoke(cli, ["plugins"]).output
    for name in EXPECTED_ESTIMATORS | EXPECTED_LOSSES | EXPECTED_KL:
        assert name in text


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("algorithm.adv_estimator", EXPECTED_ESTIMATORS),
        ("actor.policy_loss", EXPECTED_LOSSES),
        ("actor.kl_loss_type", EXPECTED_KL),
        ("algorithm.kl_penalty", EXPECTED_KL),
    ],
)
def test_plugrl_explain_lists_the_registered_choices(installed, key, names):
    result = CliRunner().invoke(cli, ["explain", key])
    assert result.exit_code == 0, result.output
    choices = next(line for line in result.output.splitlines() if "choices:" in line)
    assert set(choices.split(":", 1)[1].replace(" ", "").split(",")) == names


def test_every_name_is_documented():
    doc = (Path(__file__).parents[3] / "docs" / "algorithms.md").read_text(encoding="utf-8")
    names = EXPECTED_ESTIMATORS | EXPECTED_LOSSES | EXPECTED_KL | EXPECTED_KL_ALIASES
    undocumented = sorted(name for name in names if f"`{name}`" not in doc)
    assert not undocumented
