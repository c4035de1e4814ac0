import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

import fake_parts


@pytest.fixture
def fake_parts_manager(plugrl_plugin_manager, plugrl_register_plugin):
    """The installed plugins plus ``fake_parts``."""
    plugrl_register_plugin(fake_parts, "fake-parts")
    return plugrl_plugin_manager


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(data, name="recipe.yaml") -> path; data is a dict or YAML text."""

    def write(data, name="recipe.yaml"):
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
        return path

    return write
