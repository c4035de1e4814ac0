from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from tests.e2e.e2e_support import (
    REFERENCE_OVERRIDES,
    check_ok,
    reference_recipe,
    run_cli,
)


@attrs.frozen
class FinishedRun:
    recipe: Path
    run_dir: Path
    stderr: str


@pytest.fixture(scope="session")
def reference_run(tiny_task, tmp_path_factory) -> FinishedRun:
    """The reference recipe run to its end on ``cluster: local``, by the CLI."""
    recipe = reference_recipe(tiny_task, tmp_path_factory.mktemp("reference"))
    result = check_ok(run_cli(recipe, *REFERENCE_OVERRIDES))
    return FinishedRun(recipe, recipe.parent / "run", result.stderr)


@pytest.fixture
def generations(monkeypatch):
    """The number of prompts of each batch the engines generate for, in this process."""
    from plugrl.cluster.engines import EngineGroup

    calls = []
    generate = EngineGroup.generate

    def recording(self, prompts, params, **options):
        calls.append(len(prompts))
        return generate(self, prompts, params, **options)

    monkeypatch.setattr(EngineGroup, "generate", recording)
    return calls
