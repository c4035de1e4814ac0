"""Building a part checks that its class fits the interface of its kind, in one line."""

from __future__ import annotations

import inspect

import pytest
import torch

import plugrl
from plugrl.cluster.worker import build_device
from plugrl.errors import PluginError
from plugrl.parts.device import Device
from plugrl.parts.reward import RewardManager
from plugrl.parts.rollout import Capability, RolloutEngine
from plugrl.plugin.build import build_part, signature_fixes
from plugrl.plugin.manager import PluginManager
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
            "'list[Completion]'; rename 'prompts' to 'request' (the core may pass it by name); "
            "give 'params' a default or remove it (the core never passes it) (see "
            "docs/plugins.md)",
        ),
        (
            "notasync",
            "rollout engine 'notasync' from plugin 'engines-under-test': "
            "NotAsync.generate_request(self, request) does not fit the interface, which has "
            "RolloutEngine.generate_request(self, request: 'GenerationRequest') -> "
            "'list[Completion]'; make it async def (the core awaits it) (see docs/plugins.md)",
        ),
    ],
)
def test_a_class_that_does_not_fit_is_named_with_what_is_expected(context, name, message):
    with pytest.raises(PluginError) as info:
        build(name, context)
    assert str(info.value) == message


def test_a_renamed_keyword_of_an_optional_method_is_caught(context):
    with pytest.raises(PluginError) as info:
        build("wrongkeyword", context)
    assert str(info.value) == (
        "rollout engine 'wrongkeyword' from plugin 'engines-under-test': "
        "WrongKeyword.pause(self, how='keep') does not fit the interface, which has "
        "RolloutEngine.pause(self, mode: 'PauseMode' = 'keep') -> 'None'; rename 'how' to "
        "'mode' (the core may pass it by name) (see docs/plugins.md)"
    )


# ------------------------------------------------------------- written as a third party would


class RenamedAbort(RolloutEngine):
    capabilities = frozenset({Capability.ABORT})

    async def generate_request(self, request):
        return []

    async def abort(self, ids):
        pass

    async def pause(self, mode="keep"):
        pass

    async def resume(self):
        pass


class PauseWithoutDefault(RolloutEngine):
    capabilities = frozenset({Capability.PAUSE_KEEP})

    async def generate_request(self, request):
        return []

    async def pause(self, mode):
        pass

    async def resume(self):
        pass


class KeywordOnlyVersion(RolloutEngine):
    async def generate_request(self, request):
        return []

    async def begin_weight_update(self, *, version, weights):
        pass


class PositionalOnlyBatch(RewardManager):
    def __call__(self, batch, /):
        return None


class DeclaresWithoutImplementing(RolloutEngine):
    capabilities = frozenset({Capability.STREAM, Capability.WEIGHT_UPDATE})

    async def generate_request(self, request):
        return []

    async def load_weights(self, bucket):
        pass


class DeclaresAbortOnly(RolloutEngine):
    capabilities = frozenset({Capability.ABORT})

    async def generate_request(self, request):
        return []

    async def abort(self, request_ids):
        pass


class DeclaresAndImplements(RolloutEngine):
    capabilities = frozenset({Capability.SHARE_MODEL, Capability.SLEEP})

    async def generate_request(self, request, **options):
        return []

    def bind_model(self, model, version):
        pass

    async def sleep(self, level=1):
        pass

    async def wake_up(self, tags=None):
        pass


class ThirdPartyEngines:
    @plugrl.hookimpl
    def register_rollout_engines(self, register):
        for cls in (
            RenamedAbort,
            PauseWithoutDefault,
            KeywordOnlyVersion,
            DeclaresWithoutImplementing,
            DeclaresAbortOnly,
            DeclaresAndImplements,
        ):
            register(cls.__name__.lower(), cls)

    @plugrl.hookimpl
    def register_reward_managers(self, register):
        register("positional_only", PositionalOnlyBatch)


@pytest.fixture
def third_party(plugrl_register_plugin, plugrl_plugin_manager):
    plugrl_register_plugin(ThirdPartyEngines(), "third-party")
    return part_context(plugins=plugrl_plugin_manager)


def test_a_class_with_every_capability_it_declares_is_built(third_party):
    assert isinstance(build("declaresandimplements", third_party), DeclaresAndImplements)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "renamedabort",
            "rollout engine 'renamedabort' from plugin 'third-party': RenamedAbort.abort(self, "
            "ids) does not fit the interface, which has RolloutEngine.abort(self, request_ids: "
            "'Sequence[str]') -> 'None'; rename 'ids' to 'request_ids' (the core may pass it "
            "by name) (see docs/plugins.md)",
        ),
        (
            "pausewithoutdefault",
            "rollout engine 'pausewithoutdefault' from plugin 'third-party': "
            "PauseWithoutDefault.pause(self, mode) does not fit the interface, which has "
            "RolloutEngine.pause(self, mode: 'PauseMode' = 'keep') -> 'None'; give 'mode' the "
            "default 'keep' (the core may call it without 'mode') (see docs/plugins.md)",
        ),
        (
            "keywordonlyversion",
            "rollout engine 'keywordonlyversion' from plugin 'third-party': "
            "KeywordOnlyVersion.begin_weight_update(self, *, version, weights) does not fit the "
            "interface, which has RolloutEngine.begin_weight_update(self, version: 'int', "
            "weights: 'Sequence[WeightMeta]') -> 'None'; move 'version' before the '*' (the "
            "core may pass it by position); move 'weights' before the '*' (the core may pass "
            "it by position) (see docs/plugins.md)",
        ),
        (
            "declareswithoutimplementing",
            "rollout engine 'declareswithoutimplementing' from plugin 'third-party': "
            "DeclaresWithoutImplementing declares Capability.WEIGHT_UPDATE in capabilities but "
            "does not override RolloutEngine.begin_weight_update(self, version: 'int', "
            "weights: 'Sequence[WeightMeta]') -> 'None', "
            "RolloutEngine.finish_weight_update(self) -> 'None', which that capability needs; "
            "implement them or remove Capability.WEIGHT_UPDATE from capabilities (see "
            "docs/plugins.md)",
        ),
        (
            "declaresabortonly",
            "rollout engine 'declaresabortonly' from plugin 'third-party': DeclaresAbortOnly "
            "declares Capability.ABORT in capabilities but does not override "
            "RolloutEngine.pause(self, mode: 'PauseMode' = 'keep') -> 'None', "
            "RolloutEngine.resume(self) -> 'None', which that capability needs; implement them "
            "or remove Capability.ABORT from capabilities (see docs/plugins.md)",
        ),
    ],
)
def test_a_third_party_engine_that_the_core_could_not_call_stops_at_start_up(
    third_party, name, message
):
    with pytest.raises(PluginError) as info:
        build(name, third_party)
    assert str(info.value) == message


def test_a_positional_only_parameter_the_core_may_name_is_caught(third_party):
    with pytest.raises(PluginError) as info:
        build_part("reward_managers", "positional_only", Recipe().reward, third_party)
    assert str(info.value) == (
        "reward manager 'positional_only' from plugin 'third-party': "
        "PositionalOnlyBatch.__call__(self, batch, /) does not fit the interface, which has "
        "RewardManager.__call__(self, batch: 'Batch') -> 'RewardOutput'; let 'batch' be "
        "passed by name, drop the '/' (the core may pass it by name) (see docs/plugins.md)"
    )


@pytest.mark.parametrize(
    ("have", "fixes"),
    [
        ("def f(self, request_ids): ...", []),
        ("def f(self, *args, **kwargs): ...", []),
        ("def f(self, request_ids, extra=None): ...", []),
        ("def f(this, request_ids): ...", []),
        ("def f(self): ...", ["add the parameter 'request_ids' (the core may pass it)"]),
        (
            "def f(self, request_ids, extra): ...",
            ["give 'extra' a default or remove it (the core never passes it)"],
        ),
        (
            "def f(self, *, request_ids): ...",
            ["move 'request_ids' before the '*' (the core may pass it by position)"],
        ),
        (
            "def f(self, **names): ...",
            ["add the parameter 'request_ids' (the core may pass it)"],
        ),
    ],
)
def test_signature_fixes_name_what_to_change(have, fixes):
    namespace = {}
    exec(have, namespace)
    want = inspect.signature(RolloutEngine.abort)
    assert signature_fixes(want, inspect.signature(namespace["f"])) == fixes


def test_signature_fixes_of_a_swapped_order():
    def want(self, version, weights): ...

    def have(self, weights, version): ...

    assert signature_fixes(inspect.signature(want), inspect.signature(have)) == [
        "put 'version' in position 1, as the interface has it (the core may pass it by position)",
        "put 'weights' in position 2, as the interface has it (the core may pass it by position)",
    ]


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
