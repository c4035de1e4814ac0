"""A stand-in for the part of SGLang (0.5.x) that plugrl-sglang uses, for contract tests.

It exposes exactly that surface, with SGLang's names and the parameters the plugin passes
(keyword names as in SGLang's signatures): ``sglang.Engine(**server args)`` with
``async_generate(..., input_ids, sampling_params, return_logprob, rid)`` and
``shutdown()``; its ``tokenizer_manager`` coroutines ``pause_generation``,
``continue_generation``, ``update_weights_from_tensor(obj, request)``,
``release_memory_occupation(obj, request)``, ``resume_memory_occupation(obj, request)``,
``flush_cache()`` and the plain ``abort_request(rid, abort_all)``, and its ``model_config``'s
``is_multimodal`` (false unless a test sets it); the request dataclasses of
``sglang.srt.managers.io_struct``; ``sglang.srt.utils.MultiprocessingSerializer``. Anything
else raises ``AttributeError``, so the plugin cannot depend on more without a test noticing.

Generation is simulated: one token per event-loop turn, token ``(sum(input_ids) + step) %
97``, log-prob ``-(weights_loaded + 1) / 10`` (so a test sees which weights produced a token).
Every call is recorded in ``Engine.calls`` as ``(name, arguments)``.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import pickle
import sys
import types
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec
from typing import Any, Literal

VERSION = "0.5.5"
VOCAB = 97


@dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[bytes | str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


@dataclass
class GetWeightsByNameReqInput:
    name: str
    truncate_size: int = 100


@dataclass
class ReleaseMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class ResumeMemoryOccupationReqInput:
    tags: list[str] | None = None


@dataclass
class PauseGenerationReqInput:
    mode: Literal["abort", "retract", "in_place"] = "abort"

    def __post_init__(self) -> None:
        if self.mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"Invalid mode: {self.mode!r}")


@dataclass
class ContinueGenerationReqInput:
    pass


@dataclass
class FlushCacheReqOutput:
    success: bool


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj: Any, output_str: bool = False) -> bytes:
        return pickle.dumps(obj)

    @staticmethod
    def deserialize(data: bytes) -> Any:
        return pickle.loads(data)


@dataclass
class _State:
    rid: str
    finished: bool = False
    aborted: bool = False


@dataclass
class TokenizerManager:
    engine: Engine
    rid_to_state: dict[str, _State] = field(default_factory=dict)
    is_pause: bool = False
    resumed: asyncio.Event | None = None
    model_config: Any = field(default_factory=lambda: types.SimpleNamespace(is_multimodal=False))

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.engine.calls.append(("abort_request", {"rid": rid, "abort_all": abort_all}))
        for state in self.rid_to_state.values():
            if abort_all or state.rid == rid:
                state.aborted = True

    async def pause_generation(self, obj: PauseGenerationReqInput) -> None:
        self.engine.calls.append(("pause_generation", {"mode": obj.mode}))
        assert isinstance(obj, PauseGenerationReqInput)
        self.is_pause = True
        self.resumed = asyncio.Event()
        if obj.mode == "abort":
            while self.rid_to_state:
                for state in self.rid_to_state.values():
                    state.aborted = True
                await asyncio.sleep(0)

    async def continue_generation(self, obj: ContinueGenerationReqInput) -> None:
        self.engine.calls.append(("continue_generation", {}))
        assert isinstance(obj, ContinueGenerationReqInput)
        self.is_pause = False
        if self.resumed is not None:
            self.resumed.set()

    async def update_weights_from_tensor(
        self, obj: UpdateWeightsFromTensorReqInput, request: Any = None
    ) -> tuple[bool, str]:
        assert isinstance(obj, UpdateWeightsFromTensorReqInput)
        engine = self.engine
        # each tensor-parallel rank reads its own payload
        buckets = [MultiprocessingSerializer.deserialize(p) for p in obj.serialized_named_tensors]
        engine.calls.append(
            (
                "update_weights_from_tensor",
                {
                    "names": [name for name, _ in buckets[0]],
                    "payloads": len(buckets),
                    "load_format": obj.load_format,
                    "flush_cache": obj.flush_cache,
                    "request": request,
                    "in_flight": len(self.rid_to_state),
                },
            )
        )
        if engine.refuse_weights:
            return False, "Failed to update weights: unknown parameter"
        for name, tensor in buckets[0]:
            engine.weights[name] = tensor.clone()
        engine.weights_loaded += 1
        return True, "Succeeded to update model weights."

    async def get_weights_by_name(
        self, obj: GetWeightsByNameReqInput, request: Any = None
    ) -> list | None:
        """SGLang's answer: the first ``truncate_size`` rows of the weight as float32 values
        (nested lists), ``None`` for a name the model does not have."""
        assert isinstance(obj, GetWeightsByNameReqInput)
        self.engine.calls.append(("get_weights_by_name", {"name": obj.name}))
        tensor = self.engine.weights.get(obj.name)
        if tensor is None:
            return None
        return tensor[: obj.truncate_size].float().tolist()

    async def flush_cache(self) -> FlushCacheReqOutput:
        self.engine.calls.append(("flush_cache", {"in_flight": len(self.rid_to_state)}))
        return FlushCacheReqOutput(success=not self.rid_to_state)

    async def release_memory_occupation(
        self, obj: ReleaseMemoryOccupationReqInput, request: Any = None
    ) -> None:
        assert isinstance(obj, ReleaseMemoryOccupationReqInput)
        assert not self.rid_to_state, "SGLang asserts the engine is idle before releasing"
        self.engine.calls.append(("release_memory_occupation", {"tags": obj.tags}))
        self.engine.released.update(obj.tags or ["kv_cache", "weights"])

    async def resume_memory_occupation(
        self, obj: ResumeMemoryOccupationReqInput, request: Any = None
    ) -> None:
        assert isinstance(obj, ResumeMemoryOccupationReqInput)
        self.engine.calls.append(("resume_memory_occupation", {"tags": obj.tags}))
        self.engine.released.difference_update(obj.tags or ["kv_cache", "weights"])


class Engine:
    instances: list[Engine] = []  # noqa: RUF012 (the test's record of engines made)

    def __init__(self, **kwargs: Any) -> None:
        self.server_args = kwargs
        self.calls: list[tuple[str, dict[str, Any]]] = [("Engine", dict(kwargs))]
        self.tokenizer_manager = TokenizerManager(self)
        self.weights: dict[str, Any] = {}
        self.weights_loaded = 0
        self.refuse_weights = False
        self.released: set[str] = set()
        self.shut_down = False
        Engine.instances.append(self)

    async def async_generate(
        self,
        prompt: str | None = None,
        sampling_params: dict | None = None,
        input_ids: list[int] | None = None,
        image_data: Any = None,
        video_data: Any = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        token_ids_logprob: list[int] | None = None,
        lora_path: Any = None,
        custom_logit_processor: Any = None,
        return_hidden_states: bool = False,
        stream: bool = False,
        rid: str | None = None,
    ) -> dict[str, Any]:
        self.calls.append(
            (
                "async_generate",
                {
                    "input_ids": list(input_ids or []),
                    "image_data": image_data,
                    "video_data": video_data,
                    "sampling_params": dict(sampling_params or {}),
                    "return_logprob": return_logprob,
                    "stream": stream,
                    "rid": rid,
                },
            )
        )
        manager = self.tokenizer_manager
        while manager.is_pause:
            assert manager.resumed is not None
            await manager.resumed.wait()
        assert rid not in manager.rid_to_state, f"rid {rid} is already in flight"
        assert not self.released, f"generation while {sorted(self.released)} are released"
        state = manager.rid_to_state.setdefault(rid or "", _State(rid or ""))
        params = sampling_params or {}
        stop_ids = set(params.get("stop_token_ids") or [])
        base = sum(input_ids or [])
        pairs: list[tuple[float, int, None]] = []
        finish: dict[str, Any] = {"type": "length", "length": params["max_new_tokens"]}
        try:
            for step in range(params["max_new_tokens"]):
                await asyncio.sleep(0)
                if state.aborted:
                    finish = {"type": "abort", "message": "Abort in waiting queue"}
                    break
                token = (base + step) % VOCAB
                pairs.append((-(self.weights_loaded + 1) / 10, token, None))
                if token in stop_ids:
                    finish = {"type": "stop", "matched": token}
                    break
        finally:
            del manager.rid_to_state[rid or ""]
        output = {
            "output_ids": [token for _, token, _ in pairs],
            "meta_info": {
                "id": rid,
                "finish_reason": finish,
                "prompt_tokens": len(input_ids or []),
                "completion_tokens": len(pairs),
            },
        }
        if return_logprob:
            output["meta_info"]["output_token_logprobs"] = pairs
        return output

    def shutdown(self) -> None:
        self.calls.append(("shutdown", {}))
        self.shut_down = True


def modules() -> dict[str, types.ModuleType]:
    """The fake ``sglang`` package and the submodules the plugin imports, by name."""

    def module(name: str, **attributes: Any) -> types.ModuleType:
        made = types.ModuleType(name)
        made.__spec__ = ModuleSpec(name, None, is_package=True)
        made.__dict__.update(attributes)
        return made

    io_struct = module(
        "sglang.srt.managers.io_struct",
        UpdateWeightsFromTensorReqInput=UpdateWeightsFromTensorReqInput,
        GetWeightsByNameReqInput=GetWeightsByNameReqInput,
        ReleaseMemoryOccupationReqInput=ReleaseMemoryOccupationReqInput,
        ResumeMemoryOccupationReqInput=ResumeMemoryOccupationReqInput,
        PauseGenerationReqInput=PauseGenerationReqInput,
        ContinueGenerationReqInput=ContinueGenerationReqInput,
    )
    utils = module("sglang.srt.utils", MultiprocessingSerializer=MultiprocessingSerializer)
    managers = module("sglang.srt.managers", io_struct=io_struct)
    srt = module("sglang.srt", managers=managers, utils=utils)
    sglang = module("sglang", __version__=VERSION, Engine=Engine, srt=srt)
    return {
        "sglang": sglang,
        "sglang.srt": srt,
        "sglang.srt.managers": managers,
        "sglang.srt.managers.io_struct": io_struct,
        "sglang.srt.utils": utils,
    }


def install(monkeypatch: Any) -> type[Engine]:
    """Put the fake in ``sys.modules`` for one test; returns its ``Engine`` class."""
    Engine.instances.clear()
    for name, made in modules().items():
        monkeypatch.setitem(sys.modules, name, made)
    return Engine


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the fake modules on import, so that ``sglang`` enters ``sys.modules`` only when
    something imports it (the core refuses to prepare an engine whose framework was imported
    first)."""

    def __init__(self) -> None:
        self.made = modules()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name not in self.made:
            return None
        return ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        return self.made[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_on_import(monkeypatch: Any) -> type[Engine]:
    """Make ``import sglang`` find the fake for one test, without importing it now."""
    Engine.instances.clear()
    finder = _Finder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    for name in finder.made:
        # setitem then delitem: monkeypatch puts back what was there, and removes the fake
        # modules the test imported
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    return Engine
