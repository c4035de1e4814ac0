from pathlib import Path

import pytest

from tests.tools.convert import stand_in_plugins

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def script_text():
    """script_text(name) -> the text of a fixture script under scripts/."""

    def read(name):
        return (SCRIPTS / name).read_text(encoding="utf-8")

    return read


@pytest.fixture
def stand_ins(plugrl_plugin_manager, plugrl_register_plugin):
    """The installed plugins plus stand-ins for plugrl-npu, plugrl-megatron, plugrl-vllm, each
    declaring the verl names of a few of its keys."""
    plugrl_register_plugin(stand_in_plugins, "stand-ins")
    return plugrl_plugin_manager


@pytest.fixture
def plugrl_plugin_manager(plugrl_make_plugin_manager):
    """The plugins that ship with plugrl, without the accelerator distributions a test
    environment may have installed: these tests state what a conversion gives where those are
    absent, and `stand_ins` stands for them where present."""
    return plugrl_make_plugin_manager(
        environ={"PLUGRL_DISABLED_PLUGINS": "megatron,vllm,sglang,npu"}
    )
