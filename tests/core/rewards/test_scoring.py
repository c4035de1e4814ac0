"""Custom reward functions from files, the call forms, results, and resolving data sources."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch

from plugrl.errors import DataError, PluginError, RecipeError
from plugrl.parts.scoring import (
    FileFunction,
    Scorer,
    ScoringError,
    is_batch_form,
    make_resolver,
    normalize_result,
)
from plugrl.plugin.manager import get_plugin_manager

SYNC = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)
"""
ASYNC = """
import asyncio

async def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    await asyncio.sleep(0)
    return {"score": float(solution_str == ground_truth) + bonus, "length": len(solution_str)}
"""
BATCH = """
def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]
"""
TWO_PARAMS = """
def compute_score(solution_str, ground_truth):
    return 1.0 if ground_truth in solution_str else 0.0
"""


def custom(path, name="compute_score", kwargs=None):
    return {"custom_function": {"path": str(path), "name": name, "kwargs": kwargs or {}}}


def test_sync_file_function_is_used_for_every_data_source(make_recipe, scorer_file):
    recipe = make_recipe(custom(scorer_file(SYNC)))
    resolve = make_resolver(recipe, get_plugin_manager())
    scorer = resolve("anything/at_all")
    assert resolve("other") is scorer
    assert scorer("anything", " 4 ", "4") == 1.0
    assert scorer.score_sample(data_source="x", solution_str="5", ground_truth="4") == (0.0, {})


def test_async_file_function_with_kwargs(make_recipe, scorer_file):
    recipe = make_recipe(custom(scorer_file(ASYNC), kwargs={"bonus": 0.5}))
    scorer = make_resolver(recipe, get_plugin_manager())("x")
    score, extras = scorer.score_sample(
        data_source="x", solution_str="4", ground_truth="4", extra_info=None
    )
    assert score == 1.5
    assert extras == {"score": 1.5, "length": 1}


def test_batch_file_function_is_detected_by_its_parameters(make_recipe, scorer_file):
    scorer = make_resolver(make_recipe(custom(scorer_file(BATCH))), get_plugin_manager())("x")
    assert scorer.batch
    results = scorer.score_batch(
        data_sources=["x", "x"],
        solution_strs=["1", "2"],
        ground_truths=["1", "1"],
        extra_infos=[None, None],
    )
    assert results == [(1.0, {}), (0.0, {})]


def test_a_function_gets_only_the_parameters_it_declares(make_recipe, scorer_file):
    scorer = make_resolver(make_recipe(custom(scorer_file(TWO_PARAMS))), get_plugin_manager())("x")
    assert scorer.params == ("solution_str", "ground_truth")
    assert scorer("x", "the answer is 7", "7", {"id": 1}) == 1.0


def test_per_sample_function_scores_a_batch_row_by_row(make_recipe, scorer_file):
    scorer = make_resolver(make_recipe(custom(scorer_file(SYNC))), get_plugin_manager())("x")
    results = scorer.score_batch(
        data_sources=["x"] * 3,
        solution_strs=["1", "2", "3"],
        ground_truths=["1", "1", "3"],
        extra_infos=[None] * 3,
    )
    assert [score for score, _ in results] == [1.0, 0.0, 1.0]


def test_file_function_pickles_as_path_and_name(scorer_file):
    function = FileFunction(str(scorer_file(SYNC)), "compute_score")
    clone = pickle.loads(pickle.dumps(Scorer.wrap(function, "f")))
    assert clone.function == function
    assert clone("d", "4", "4") == 1.0


# ------------------------------------------------------------------------------ errors


def test_missing_file(make_recipe, tmp_path):
    with pytest.raises(RecipeError) as error:
        make_resolver(make_recipe(custom(tmp_path / "nope.py")), get_plugin_manager())
    message = str(error.value)
    assert message.startswith("reward.custom_function.path: reward function file ")
    assert "nope.py' not found; set it to the Python file" in message
    assert "\n" not in message


def test_file_that_fails_to_import(make_recipe, scorer_file):
    path = scorer_file("import math\n\nvalue = undefined_name + 1\n")
    with pytest.raises(RecipeError) as error:
        make_resolver(make_recipe(custom(path)), get_plugin_manager())
    message = str(error.value)
    assert f"{path} failed to import (line 3): NameError: name 'undefined_name'" in message
    assert f"(python {path} shows the traceback)" in message
    assert "\n" not in message


def test_file_with_a_syntax_error(make_recipe, scorer_file):
    path = scorer_file("def compute_score(:\n    pass\n")
    with pytest.raises(RecipeError, match=r"failed to import \(line 1\): SyntaxError"):
        make_resolver(make_recipe(custom(path)), get_plugin_manager())


def test_missing_function_lists_what_the_file_defines(make_recipe, scorer_file):
    path = scorer_file(SYNC)
    with pytest.raises(RecipeError) as error:
        make_resolver(make_recipe(custom(path, name="score")), get_plugin_manager())
    assert str(error.value) == (
        f"reward.custom_function.name: {path} has no function 'score' (it defines "
        "compute_score); set reward.custom_function.name"
    )


def test_name_that_is_not_a_function(make_recipe, scorer_file):
    path = scorer_file("compute_score = 3\n")
    with pytest.raises(RecipeError, match=r"'compute_score' in .* is a int, not a function"):
        make_resolver(make_recipe(custom(path)), get_plugin_manager())


def test_kwargs_the_function_does_not_take(make_recipe, scorer_file):
    recipe = make_recipe(custom(scorer_file(SYNC), kwargs={"temperature": 2}))
    with pytest.raises(RecipeError) as error:
        make_resolver(recipe, get_plugin_manager())
    assert str(error.value).startswith("reward.custom_function.kwargs: reward function")
    assert "takes no parameter 'temperature'; remove it from" in str(error.value)


def test_a_required_parameter_plugrl_does_not_pass(make_recipe, scorer_file):
    path = scorer_file("def compute_score(solution_str, reference):\n    return 0.0\n")
    with pytest.raises(RecipeError, match="needs parameter 'reference', which plugrl does not"):
        make_resolver(make_recipe(custom(path)), get_plugin_manager())


def test_a_function_without_solution_str(make_recipe, scorer_file):
    path = scorer_file("def compute_score(text=None, ground_truth=None):\n    return 0.0\n")
    with pytest.raises(RecipeError, match="has no 'solution_str' parameter; scoring functions"):
        make_resolver(make_recipe(custom(path)), get_plugin_manager())


def test_unknown_data_source_lists_registered_ones_and_how_to_add(make_recipe):
    resolve = make_resolver(make_recipe(), get_plugin_manager())
    with pytest.raises(DataError) as error:
        resolve("my_lab/puzzles")
    message = str(error.value)
    assert message.startswith("no reward function for data_source 'my_lab/puzzles' (registered: ")
    assert "aime*" in message and "openai/gsm8k" in message and "plugrl/arithmetic" in message
    assert "reward.custom_function.path=FILE.py" in message
    assert "register_reward_functions" in message
    assert "\n" not in message


def test_registry_resolution_by_exact_name_and_pattern(make_recipe):
    resolve = make_resolver(make_recipe(), get_plugin_manager())
    assert resolve("aime2024").label == "reward function 'aime*' (plugin 'scorers')"
    assert resolve("openai/gsm8k")("openai/gsm8k", "#### 3", "3")["score"] == 1.0


def test_lambdas_cannot_reach_a_worker():
    scorer = Scorer.wrap(lambda data_source, solution_str, ground_truth: 1.0, "my lambda")
    with pytest.raises(PluginError, match="my lambda cannot be sent to a scoring worker process"):
        scorer.check_picklable()


# ------------------------------------------------------------------------------ results


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (1, (1.0, {})),
        (True, (1.0, {})),
        (np.float32(0.25), (0.25, {})),
        (torch.tensor(0.5), (0.5, {})),
        ({"score": 1, "acc": np.bool_(True)}, (1.0, {"score": 1.0, "acc": True})),
    ],
)
def test_normalize_result(result, expected):
    assert normalize_result(result, "f") == expected


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "f returned NoneType None; return a number or a dict with a numeric 'score'"),
        ("1.0", "f returned str '1.0'; return a number"),
        ({"acc": 1}, "f returned a dict without 'score' (keys: acc)"),
        (float("nan"), "f returned a score of nan; scores must be finite"),
        (torch.ones(2), "f returned Tensor"),
    ],
)
def test_normalize_result_errors(result, message):
    with pytest.raises(ScoringError, match=message.replace("(", r"\(").replace(")", r"\)")):
        normalize_result(result, "f")


def test_batch_function_returning_the_wrong_number_of_scores(scorer_file, make_recipe):
    path = scorer_file(
        "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
        "    return [1.0]\n"
    )
    scorer = make_resolver(make_recipe(custom(path)), get_plugin_manager())("x")
    with pytest.raises(ScoringError, match="returned 1 scores for a batch of 2; return one per"):
        scorer.score_batch(
            data_sources=["x"] * 2,
            solution_strs=["a", "b"],
            ground_truths=["a", "b"],
            extra_infos=[None] * 2,
        )


def test_is_batch_form():
    def per_sample(data_source, solution_str, ground_truth, extra_info=None): ...

    def batch(data_sources, solution_strs, ground_truths, extra_infos): ...

    assert not is_batch_form(per_sample)
    assert is_batch_form(batch)


def test_a_file_whose_import_hangs_stops_the_run_at_a_deadline(
    make_recipe, scorer_file, monkeypatch
):
    from plugrl.parts import scoring

    monkeypatch.setattr(scoring, "IMPORT_TIMEOUT_S", 0.5)
    path = scorer_file("import time\ntime.sleep(30)\n" + SYNC, name="hangs.py")
    with pytest.raises(RecipeError) as info:
        make_resolver(make_recipe(custom(path)), get_plugin_manager())
    assert str(info.value) == (
        f"reward.custom_function.path: importing {path} did not finish in 0.5 s; check what the "
        "file does at import (a download, a lock, a prompt for input) and move it into the "
        "function"
    )


def test_an_interruption_during_the_import_is_not_blamed_on_the_file(
    make_recipe, scorer_file, tmp_path
):
    import _thread
    import signal
    import sys
    import threading

    from plugrl.parts import scoring

    started = tmp_path / "started"
    path = scorer_file(
        f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(3)\n" + SYNC,
        name="slow.py",
    )

    def interrupt_once_importing() -> None:
        while not started.exists():
            threading.Event().wait(0.01)
        _thread.interrupt_main()  # what Ctrl-C, or SIGTERM through the CLI, raises

    # Python's own Ctrl-C handler, whatever an earlier test in this process left installed
    # (interrupt_main does nothing under SIG_IGN, and a server's handler may not raise)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=interrupt_once_importing, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            make_resolver(make_recipe(custom(path)), get_plugin_manager())
    finally:
        signal.signal(signal.SIGINT, previous)
    # nothing of the half-imported file is kept: a later run imports it afresh
    assert str(path.resolve()) not in scoring._FILE_MODULES
    # this file's module only: another test in this process may have imported a slow_*.py
    assert not [
        name for name in sys.modules if re.fullmatch(r"plugrl_reward_file_slow_[0-9a-f]{10}", name)
    ]
