"""docs/agents.md's option tables of the code tools are the config classes' fields, with their
defaults."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from plugrl_code_tools.python import PythonToolConfig
from plugrl_code_tools.sandbox import SandboxToolConfig

DOC = Path(__file__).resolve().parents[4] / "docs" / "agents.md"


def documented(tool: str) -> dict[str, str]:
    """``option -> default`` of the table after the line naming the tool's options."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"`{tool}` options (`rollout.agent.tool_args.{tool}`)")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def default_text(field: attrs.Attribute) -> str:
    default = field.default.factory() if isinstance(field.default, attrs.Factory) else field.default
    return json.dumps(default) if isinstance(default, bool | dict) else str(default)


@pytest.mark.parametrize(
    ("tool", "config"), [("python", PythonToolConfig), ("sandbox", SandboxToolConfig)]
)
def test_the_option_tables_are_the_config_fields(tool, config):
    fields = attrs.fields(config)
    assert documented(tool) == {field.name: default_text(field) for field in fields}
