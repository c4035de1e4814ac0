"""docs/rewards.md stays true (its example runs), and the plugin registers lightly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import explain
from plugrl_scorers import arithmetic

DOC = Path(__file__).resolve().parents[3] / "docs" / "rewards.md"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)


def test_the_json_to_parquet_example_runs_and_its_rows_score(tmp_path):
    jsonl = next(block for block in code_blocks("json") if '"question"' in block)
    script = next(block for block in code_blocks("python") if "pq.write_table" in block)
    (tmp_path / "problems.jsonl").write_text(jsonl, encoding="utf-8")
    (tmp_path / "convert.py").write_text(script, encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "convert.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "wrote 3 rows to train.parquet"
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert [row["data_source"] for row in rows] == ["plugrl/arithmetic"] * 3
    assert rows[2]["prompt"][0]["role"] == "user"
    assert rows[2]["extra_info"] == {"split": "train", "index": 2}
    truth = rows[2]["reward_model"]["ground_truth"]
    assert truth == "1234"
    response = "1200 + 34 = 1,234.\nAnswer: 1,234"
    assert arithmetic.compute_score(rows[2]["data_source"], response, truth)["score"] == 1.0


def test_the_batch_form_example_is_a_batch_function(make_recipe, tmp_path):
    from plugrl.parts.scoring import make_resolver

    block = next(b for b in code_blocks("python") if "solution_strs" in b)
    path = tmp_path / "batch_reward.py"
    path.write_text(re.sub(r"(?m)^  ", "", block), encoding="utf-8")
    recipe = make_recipe({"manager": "batch", "custom_function": {"path": str(path)}})
    scorer = make_resolver(recipe, get_plugin_manager())("x")
    assert scorer.batch
    results = scorer.score_batch(
        data_sources=["x", "x"],
        solution_strs=["... so 42", "... so 41"],
        ground_truths=["42", "42"],
        extra_infos=[None, None],
    )
    assert [score for score, _ in results] == [1.0, 0.0]


def test_the_flexible_gsm8k_file_from_the_docs(make_recipe, tmp_path):
    from plugrl.parts.scoring import make_resolver

    block = next(b for b in code_blocks("python") if 'method="flexible"' in b)
    path = tmp_path / "flexible.py"
    path.write_text(block, encoding="utf-8")
    scorer = make_resolver(
        make_recipe({"custom_function": {"path": str(path)}}), get_plugin_manager()
    )("openai/gsm8k")
    assert scorer("openai/gsm8k", "so she has 72 clips", "72")["score"] == 1.0


def test_the_lenient_gsm8k_options_from_the_docs(make_recipe):
    import yaml

    from plugrl.parts.scoring import make_resolver

    reward = next(b for b in code_blocks("yaml") if "lenient" in b)
    scorer = make_resolver(make_recipe(yaml.safe_load(reward)["reward"]), get_plugin_manager())(
        "openai/gsm8k"
    )
    assert scorer("openai/gsm8k", "#### $72.0", "72")["score"] == 1.0
    # without them, verl's strict parse has no answer there
    registered = make_resolver(make_recipe(), get_plugin_manager())("openai/gsm8k")
    assert registered("openai/gsm8k", "#### $72.0", "72")["score"] == 0.0


def test_a_reward_file_can_pass_the_scorer_its_own_keyword_arguments(make_recipe, tmp_path):
    from plugrl.parts.scoring import make_resolver

    block = next(
        b
        for b in code_blocks("python")
        if b.strip().endswith('compute_score = load_part("reward_functions", "openai/gsm8k")')
    )
    path = tmp_path / "gsm8k_reward.py"
    path.write_text(block, encoding="utf-8")
    custom = {"custom_function": {"path": str(path), "kwargs": {"method": "flexible"}}}
    scorer = make_resolver(make_recipe(custom), get_plugin_manager())("openai/gsm8k")
    assert scorer("openai/gsm8k", "so she has 72 clips", "72")["score"] == 1.0
    plain = {"custom_function": {"path": str(path)}}
    assert (
        make_resolver(make_recipe(plain), get_plugin_manager())("openai/gsm8k")(
            "openai/gsm8k", "so she has 72 clips", "72"
        )["score"]
        == 0.0
    )


def test_function_args_are_checked_by_the_functions_options(make_recipe):
    from plugrl.errors import RecipeError

    with pytest.raises(RecipeError) as info:
        make_recipe({"function_args": {"openai/gsm8k": {"lenientt": True}}})
    assert str(info.value) == (
        "reward.function_args.openai/gsm8k.lenientt: unknown key; did you mean "
        "'reward.function_args.openai/gsm8k.lenient'?"
    )
    with pytest.raises(RecipeError) as info:
        make_recipe({"function_args": {"plugrl/arithmetic": {"strict": True}}})
    assert str(info.value) == (
        "reward.function_args.plugrl/arithmetic: reward function 'plugrl/arithmetic' (plugin "
        "'scorers') takes no options, got strict"
    )
    with pytest.raises(RecipeError, match=r"^reward.function_args.nope: unknown reward function"):
        make_recipe({"function_args": {"nope": {}}})


def test_a_glob_registered_function_gets_its_options_for_every_match(make_recipe):
    from plugrl.parts.scoring import make_resolver

    recipe = make_recipe({"function_args": {"aime*": {"strict_box_verify": True}}})
    scorer = make_resolver(recipe, get_plugin_manager())("aime2025")
    assert scorer.kwargs == {"strict_box_verify": True}


def test_registering_the_plugins_imports_neither_torch_nor_scorers():
    code = (
        "import sys, plugrl_reward_managers, plugrl_scorers as r; "
        "assert 'torch' not in sys.modules; "
        "assert 'plugrl_scorers.math_boxed' not in sys.modules; "
        "assert 'math_verify' not in sys.modules; print(len(r.REWARD_FUNCTIONS))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "13"


def test_every_registered_target_imports(plugins):
    for kind, plugin in (("reward_functions", "scorers"), ("reward_managers", "reward_managers")):
        entries = [entry for entry in plugins.registry(kind) if entry.plugin == plugin]
        assert entries
        for entry in entries:
            assert callable(entry.load()), entry.name


@pytest.mark.parametrize(
    ("key", "verl"),
    [
        ("reward.overlong_buffer.len", "reward_model.overlong_buffer.len"),
        ("reward.batch_timeout_s", None),
        ("reward.num_workers", None),
    ],
)
def test_manager_keys_are_explained(plugins, key, verl):
    info = explain(key, plugins)
    assert info.help
    assert info.verl == verl
    assert info.owner.endswith(("(reward_managers)", "(scorers)"))


def test_no_scorer_evaluates_text():
    """Model output is parsed, never run: no eval/exec/compile anywhere in the plugin."""
    root = Path(__file__).resolve().parents[3] / "plugins" / "rewards"
    pattern = re.compile(r"(?<![\w.])(eval|exec|compile)\s*\(")
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_explain_covers_the_options_of_parts_and_scoring_functions():
    from plugrl.errors import RecipeError
    from plugrl.plugin.manager import PluginManager

    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.load_entry_points()
    lenient = explain("reward.function_args.openai/gsm8k.lenient", manager)
    assert (lenient.type, lenient.default, lenient.owner) == (
        "bool",
        False,
        "reward function openai/gsm8k (scorers)",
    )
    clip = explain("actor.policy_loss_args.clip_cov_ratio", manager)
    assert clip.owner == "policy loss clip_cov (policy_losses)"
    assert clip.verl == "actor_rollout_ref.actor.policy_loss.clip_cov_ratio"
    assert explain("algorithm.adv_estimator_args.whiten", manager).default is True
    with pytest.raises(RecipeError) as info:
        explain("actor.policy_loss_args.nope", manager)
    assert str(info.value) == (
        "actor.policy_loss_args.nope: no part's options have it (policy loss clip_cov "
        "(policy_losses): clip_cov_ratio, clip_cov_lb, clip_cov_ub; policy loss kl_cov "
        "(policy_losses): kl_cov_ratio, ppo_kl_coef; policy loss sapo (policy_losses): tau_pos, "
        "tau_neg)"
    )
    with pytest.raises(RecipeError) as info:
        explain("reward.function_args.plugrl/arithmetic.strict", manager)
    assert str(info.value) == (
        "reward.function_args.plugrl/arithmetic: reward function 'plugrl/arithmetic' (plugin "
        "'scorers') takes no options"
    )
