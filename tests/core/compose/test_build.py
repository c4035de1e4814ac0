"""Building a part checks that its class fits the interface of its kind, in one line."""

from __future__ import annotations

import pytest
import torch

import plugrl
from plugrl.cluster.worker import build_device
from plugrl.compose.build import build_part
from plugrl.errors import PluginError
from plugrl.parts.device import Device
from plugrl.parts.rollout import RolloutEngine
from plugrl.plugins import PluginManager
from plugrl.recipe import Recipe
from plugrl.testing import part_context


class GoodEngine(RolloutEngine):
    async def generate_request(self, request, *, extra=None):
        return []


class NotAnEngine:
    def __init__(self, config, context):
        pass


class OldConstructor(RolloutEngine):
    def __init__(self, recipe, *, device, tokenizer):
        pass

    async def generate_request(self, request):
        return []


class WrongParameters(RolloutEngine):
    async def generate_request(self, prompts, params):
        return []


class NotAsync(RolloutEngine):
    def generate_request(self, request):
        return []


class WrongKeyword(RolloutEngine):
    async def generate_request(self, request):
        return []

    async def pause(self, how="keep"):
        pass


class Engines:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        for cls in (GoodEngine, NotAnEngine, OldConstructor, WrongParameters, NotAsync):
            register(cls.__name__.lower(), cls)
        register("wrongkeyword", WrongKeyword)


@pytest.fixture
def context():
    manager = PluginManager(environ={"PLUGRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    manager.register(Engines(), name="engines-under-test")
    return part_context(plugins=manager)


def build(name, context):
    return build_part("rollout_engines", name, Recipe().rollout, context)


def test_a_class_that_fits_is_built(context):
    assert isinstance(build("goodengine", context), GoodEngine)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "notanengine",
            "rollout engine 'notanengine' from plugin 'engines-under-test': NotAnEngine is not a "
            "subclass of plugrl.parts.rollout.RolloutEngine; derive it from the interface (see "
            "docs/plugins.md)",
        ),
        (
            "oldconstructor",
            "rollout engine 'oldconstructor' from plugin 'engines-under-test': "
            "OldConstructor(recipe, *, device, tokenizer) does not fit the interface; plugrl "
            "builds every part as OldConstructor(config, context) (see docs/plugins.md)",
        ),
        (
            "wrongparameters",
            "rollout engine 'wrongparameters' from plugin 'engines-under-test': "
            "WrongParameters.generate_request(self, prompts, params) does not fit the interface, "
            "which has RolloutEngine.generate_request(self, request: 'GenerationRequest') -> "
            "'list[Completion]' (takes other parameters); fix it (see docs/plugins.md)",
        ),
        (
            "notasync",
            "rollout engine 'notasync' from plugin 'engines-under-test': "
            "NotAsync.generate_request(self, request) does not fit the interface, which has "
            "RolloutEngine.generate_request(self, request: 'GenerationRequest') -> "
            "'list[Completion]' (must be async def); fix it (see docs/plugins.md)",
        ),
    ],
)
def test_a_class_that_does_not_fit_is_named_with_what_is_expected(context, name, message):
    with pytest.raises(PluginError) as info:
        build(name, context)
    assert str(info.value) == message


def test_a_renamed_keyword_of_an_optional_method_is_caught(context):
    with pytest.raises(PluginError, match=r"WrongKeyword\.pause\(self, how='keep'\)"):
        build("wrongkeyword", context)


# ------------------------------------------------------------------------ torch device types


class MyXpu(Device):
    """A device whose torch extension drives it as torch's private backend."""

    name = "myxpu"
    dist_backend = "gloo"

    @classmethod
    def is_available(cls):
        return True

    def device_count(self):
        return 1

    def torch_device(self, local_rank=0):
        return torch.device(self.torch_device_type)

    def manual_seed(self, seed):
        torch.manual_seed(seed)


class MyXpuOnCpu(MyXpu):
    name = "myxpu_cpu"
    torch_device_type = "cpu"


class MyXpuOnCpuToo(MyXpuOnCpu):
    name = "myxpu_cpu_too"


class NoType(MyXpu):
    name = "notype"
    torch_device_type = ""


class Devices:
    @plugrl.hookimpl
    def register_devices(self, register):
        for cls in (MyXpu, MyXpuOnCpu, MyXpuOnCpuToo, NoType):
            register(cls.name, cls)


def test_the_torch_device_type_is_the_name_unless_a_device_says_otherwise():
    assert MyXpu.torch_device_type == "myxpu"
    assert MyXpuOnCpu.torch_device_type == "cpu"
    assert MyXpuOnCpuToo.torch_device_type == "cpu"  # a subclass drives what its parent does


@pytest.fixture
def devices(plugrl_register_plugin, plugrl_plugin_manager):
    plugrl_register_plugin(Devices(), "my-devices")
    return plugrl_plugin_manager


def test_a_device_torch_knows_is_built(devices):
    for name in ("myxpu_cpu", "myxpu_cpu_too"):
        device = build_device(devices, name, Recipe())
        assert torch.device(device.torch_device_type).type == "cpu"


def test_a_device_type_torch_does_not_know_stops_at_start_up(devices):
    with pytest.raises(RuntimeError) as torch_error:
        torch.device("myxpu")
    with pytest.raises(PluginError) as info:
        build_device(devices, "myxpu", Recipe())
    assert str(info.value) == (
        f"device 'myxpu' from plugin 'my-devices': torch.device('myxpu') fails "
        f"({torch_error.value}); set MyXpu.torch_device_type to the device type torch knows it "
        "by (the one its torch extension registers, imported when the device is built), not "
        "the registered name"
    )


def test_an_empty_device_type_stops_at_start_up(devices):
    with pytest.raises(PluginError) as info:
        build_device(devices, "notype", Recipe())
    assert str(info.value) == (
        "device 'notype' from plugin 'my-devices': NoType.torch_device_type is ''; set it to "
        "the device type torch knows the device by ('cuda', 'npu', 'cpu', or the type its "
        "torch extension registers)"
    )
