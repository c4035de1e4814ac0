"""A fully-async recipe that cannot work stops at start-up with one line naming the key."""

from __future__ import annotations

from typing import ClassVar

import pytest
from click.testing import CliRunner

import plugrl
from plugrl.parts.rollout import Capability, RolloutEngine
from plugrl_tools.cli import cli
from tests.e2e.e2e_support import tiny_recipe, write_recipe


class BatchOnlyEngine(RolloutEngine):
    """An engine that streams and takes weights but can neither pause nor abort."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.STREAM, Capability.WEIGHT_UPDATE}
    )

    async def generate_request(self, request):
        raise AssertionError("the run must stop before generating")

    # the weight update it declares (the run stops before calling them)
    async def begin_weight_update(self, version, weights):
        raise AssertionError("the run must stop before a weight update")

    async def load_weights(self, bucket):
        raise AssertionError("the run must stop before a weight update")

    async def finish_weight_update(self):
        raise AssertionError("the run must stop before a weight update")


class BatchOnlyPlugin:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        register("batch_only", BatchOnlyEngine)


def error_line(tiny_task, tmp_path, **sections) -> str:
    sections = {"scheduler": "fully_async", **sections}
    sections["rollout"] = {"n": 2, "colocate": False, **sections.get("rollout", {})}
    recipe = write_recipe(
        tmp_path / "recipe.yaml", tiny_recipe(tiny_task, tmp_path / "run", **sections)
    )
    result = CliRunner().invoke(cli, ["run", str(recipe)])
    assert result.exit_code == 1, f"exit {result.exit_code}: {result.output}{result.exception!r}"
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.stderr
    assert (
        not (tmp_path / "run" / "metrics.jsonl").exists()
        or not (tmp_path / "run" / "metrics.jsonl").read_text().strip()
    )
    return lines[0]


def test_engines_on_the_trainers_devices_are_refused(tiny_task, tmp_path):
    line = error_line(tiny_task, tmp_path, rollout={"colocate": True})
    assert line.startswith("Error: rollout.colocate: scheduler fully_async generates while")
    assert "set rollout.colocate=false" in line


def test_partial_rollout_needs_an_engine_that_can_pause_or_abort(
    tiny_task, tmp_path, plugrl_plugin_manager, plugrl_register_plugin
):
    plugrl_register_plugin(BatchOnlyPlugin(), name="batch-only")
    line = error_line(tiny_task, tmp_path, rollout={"engine": "batch_only"})
    assert line == (
        "Error: rollout.engine: rollout engine 'batch_only' cannot abort requests in flight, "
        "which scheduler.partial_rollout=true needs: its class BatchOnlyEngine does not "
        "declare Capability.ABORT in its capabilities; set rollout.engine to an engine that "
        "declares Capability.ABORT, or change what needs it"
    )


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        (
            {"scheduler": {"name": "fully_async", "total_rollout_steps": 1}},
            "Error: scheduler.total_rollout_steps: 1 prompts are fewer than one trainer step "
            "takes (required_samples = actor.ppo_mini_batch_size x scheduler.require_batches = "
            "2); raise it",
        ),
        (
            {"scheduler": {"name": "fully_async", "staleness_threshold": -0.1}},
            "staleness_threshold",
        ),
        (
            {
                "scheduler": {"name": "fully_async", "use_rollout_log_probs": True},
                "algorithm": {"adv_estimator": "optimal_token_baseline"},
            },
            "Error: scheduler.use_rollout_log_probs: advantage estimator "
            "'optimal_token_baseline' reads sum_pi_squared from the trainer's old_log_prob "
            "pass, which this setting skips; set it to false or choose another estimator",
        ),
    ],
)
def test_bad_scheduler_keys(tiny_task, tmp_path, sections, expected):
    line = error_line(tiny_task, tmp_path, **sections)
    assert line == expected if expected.startswith("Error: ") else expected in line
