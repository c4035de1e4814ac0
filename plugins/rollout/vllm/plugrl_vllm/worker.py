"""What runs inside vLLM's worker: the ``worker_extension_cls`` that loads pushed weights and
LoRA adapters, and the grouping of Hugging Face weights into the layers vLLM fuses them into.

vLLM loads q/k/v into one ``qkv_proj`` layer and gate/up into one ``gate_up_proj``; a layer is
reloaded from the weights of one call, so the engine sends a fused layer's weights together
(:class:`FusedGroups`) whatever buckets they arrived in.

Some of vLLM's models name their modules otherwise than the checkpoint (a vision-language
model's language model and vision tower: Hugging Face's ``model.visual.*`` is vLLM's
``visual.*``); vLLM's loader renames the weights by the model's ``hf_to_vllm_mapper``, and the
plan reads layers through the same renaming (:class:`Names`).

An adapter update (``rollout.lora_sync=adapters``) builds vLLM's ``LoRAModel`` from the pushed
factors in memory and registers it in the worker's LoRA manager under the engine's one adapter
id, replacing the previous version; requests that name that id then run with it. No adapter
folder is written: the id is registered before any request names it, so vLLM never looks for
one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from plugrl.api import PluginError
from plugrl_vllm.logs import hide_rotary_reload_notice

ROUTES = ("reload_weights", "load_weights")


def layer_of(name: str, packed: Mapping[str, Sequence[str]]) -> str:
    """The vLLM layer a Hugging Face weight loads into: its module path, with a shard of a
    fused layer (``q_proj``) replaced by the fused layer (``qkv_proj``)."""
    module, _, _ = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    for fused, shards in packed.items():
        if leaf in shards:
            return f"{parent}.{fused}" if parent else fused
    return module


@attrs.frozen
class WeightPlan:
    """Where a version's weights go in vLLM's model."""

    layers: dict[str, str]
    """hf name -> the vLLM layer it loads into (:func:`layer_of`)."""
    aliases: dict[str, list[str]]
    """hf name -> more names to load the same tensor under: a weight the model shares between
    two layers (tied input and output embeddings) that the trainer sends once."""


@attrs.frozen
class Names:
    """The renaming between checkpoint (Hugging Face) names and the vLLM model's: ``to_model``
    is what vLLM's loader applies (None: the loader drops the weight), ``to_checkpoint`` its
    inverse where one exists. The identity for models that name modules as the checkpoint."""

    to_model: Callable[[str], str | None] = lambda name: name
    to_checkpoint: Callable[[str], str | None] = lambda name: name

    @classmethod
    def of_model(cls, model: Any) -> Names:
        """The renaming of a vLLM model by its ``hf_to_vllm_mapper`` (vLLM's
        ``WeightsMapper``: its ``map_name``, inverted through its prefix table). Only the
        renames (``get_rename_mapper()``): a fused layer's shards keep their names
        (``q_proj``), which :func:`layer_of` and :func:`hf_view` resolve."""
        mapper = getattr(model, "hf_to_vllm_mapper", None)
        if mapper is None:
            return cls()
        if hasattr(mapper, "get_rename_mapper"):
            mapper = mapper.get_rename_mapper()
        prefixes = dict(getattr(mapper, "orig_to_new_prefix", {}) or {})

        def to_checkpoint(name: str) -> str | None:
            candidates = [
                original + name[len(new) :]
                for original, new in prefixes.items()
                if new is not None and name.startswith(new)
            ]
            for candidate in [*candidates, name]:
                if mapper.map_name(candidate) == name:
                    return candidate
            return None

        return cls(to_model=mapper.map_name, to_checkpoint=to_checkpoint)


def weight_plan(
    names: Iterable[str],
    packed: Mapping[str, Sequence[str]],
    parameters: Iterable[str],
    shared: Mapping[str, str],
    renaming: Names | None = None,
) -> WeightPlan:
    """The plan of the announced weights (checkpoint names). ``parameters`` are the model's
    parameter names, a shared parameter under each of its names; ``shared`` maps the second
    name of a shared parameter to the first (``lm_head.weight`` ->
    ``model.embed_tokens.weight``); ``renaming`` turns checkpoint names into the model's
    (:class:`Names`). The plan's layers are the model's, its names and aliases checkpoint
    names (what the loader takes).

    Raises naming announced weights the model has no layer for, and layers no announced
    weight covers: vLLM's CPU build keeps a layer that gets no weights on its old ones."""
    renaming = renaming or Names()
    announced = list(names)
    in_model = {name: renaming.to_model(name) for name in announced}
    announced_in_model = {model: name for name, model in in_model.items() if model is not None}
    aliases: dict[str, list[str]] = {}
    alias_in_model: dict[str, str] = {}
    for alias, source in shared.items():
        if alias in announced_in_model or source not in announced_in_model:
            continue
        checkpoint_alias = renaming.to_checkpoint(alias)
        if checkpoint_alias is None:
            raise PluginError(
                f"the vllm rollout model shares {source} with {alias}, a name no checkpoint "
                "weight is loaded under; push the weight under both names"
            )
        aliases.setdefault(announced_in_model[source], []).append(checkpoint_alias)
        alias_in_model[checkpoint_alias] = alias
    layers = {name.rpartition(".")[0] for name in parameters}
    plan = {}
    unknown = []
    for name in [*announced, *(alias for more in aliases.values() for alias in more)]:
        model_name = alias_in_model.get(name) or in_model.get(name)
        if model_name is None:
            # vLLM's loader drops it (a weight the model does not use): sent on its own
            plan[name] = name
            continue
        layer = layer_of(model_name, packed)
        if layer not in layers:
            unknown.append(name)
        plan[name] = layer
    if unknown:
        raise PluginError(
            f"begin_weight_update announced {', '.join(unknown[:3])}"
            + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
            + ", which the vllm rollout model does not have; push weights under Hugging Face "
            "names of the same architecture"
        )
    uncovered = sorted(layers - set(plan.values()))
    if uncovered:
        raise PluginError(
            f"begin_weight_update announced weights of {len(layers) - len(uncovered)} of "
            f"{len(layers)} layers of the vllm rollout model; none for "
            + ", ".join(uncovered[:3])
            + (f" and {len(uncovered) - 3} more" if len(uncovered) > 3 else "")
            + "; push every weight with each version"
        )
    return WeightPlan(layers=plan, aliases=aliases)


@attrs.define
class FusedGroups:
    """Collects a version's weights bucket by bucket and hands out each layer's weights once
    all of them have arrived."""

    members: dict[str, set[str]]
    """layer -> the weights that load into it."""
    layer_of: dict[str, str]
    aliases: dict[str, list[str]] = attrs.field(factory=dict)
    waiting: dict[str, list[tuple[str, Any]]] = attrs.field(factory=dict)
    """layer -> the weights of it that arrived (copies: bucket memory is reused)."""

    @classmethod
    def from_plan(cls, plan: WeightPlan) -> FusedGroups:
        members: dict[str, set[str]] = {}
        for name, layer in plan.layers.items():
            members.setdefault(layer, set()).add(name)
        return cls(members=members, layer_of=dict(plan.layers), aliases=dict(plan.aliases))

    def add(self, bucket: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Take a bucket; return the weights of every layer now complete."""
        ready: list[tuple[str, Any]] = []
        arrived: dict[str, list[tuple[str, Any]]] = {}
        for name, tensor in bucket:
            for target in (name, *self.aliases.get(name, ())):
                arrived.setdefault(self.layer_of[target], []).append((target, tensor))
        for layer, weights in arrived.items():
            have = self.waiting.get(layer, [])
            names = {name for name, _ in have} | {name for name, _ in weights}
            if names >= self.members[layer]:
                ready.extend(have)
                ready.extend(weights)
                self.waiting.pop(layer, None)
            else:
                # held until the rest of the layer arrives: copy out of the bucket's memory
                have.extend((name, tensor.detach().clone()) for name, tensor in weights)
                self.waiting[layer] = have
        return ready

    @property
    def pending(self) -> dict[str, list[str]]:
        """Layers with some but not all weights arrived -> the names that arrived."""
        return {layer: [name for name, _ in have] for layer, have in self.waiting.items()}


def adapter_module(name: str) -> str:
    """The module an adapter factor belongs to, without PEFT's prefix:
    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` ->
    ``model.layers.0.self_attn.q_proj``."""
    module = name.rsplit(".", 2)[0]
    return module.removeprefix("base_model.model.")


def unknown_adapter_modules(names: Iterable[str], supported: Iterable[str]) -> list[str]:
    """The adapter factors among ``names`` whose module (its last name part, ``q_proj``) is
    none of ``supported``: the modules vLLM's model has LoRA layers for, a fused layer's
    shards included."""
    known = set(supported)
    return [name for name in names if adapter_module(name).rpartition(".")[2] not in known]


class AdapterReceiver:
    """The LoRA half of :class:`WeightReceiver`: vLLM's worker LoRA manager, fed from memory."""

    def _plugrl_lora_managers(self) -> tuple[Any, Any]:
        """The worker's LoRA manager and the model manager under it; an error when the engine
        started without LoRA."""
        manager = getattr(self.model_runner, "lora_manager", None)  # type: ignore[attr-defined]
        if manager is None:
            raise PluginError(
                "the vllm rollout engine started without LoRA and cannot take adapters; "
                "start it with rollout.lora_sync=adapters (or auto) and model.lora_rank > 0"
            )
        return manager, manager._adapter_manager

    def plugrl_adapter_modules(self) -> list[str]:
        """The module names (last parts) vLLM's model can put adapters on."""
        _, models = self._plugrl_lora_managers()
        packed = models.packed_modules_mapping
        supported: list[str] = []
        for module in models.supported_lora_modules:
            supported.extend(packed.get(module, [module]))
        return sorted(set(supported))

    def plugrl_load_adapter(self, adapter_id: int, tensors: dict[str, Any]) -> None:
        """Register ``tensors`` (adapter factors, the scaling folded into ``lora_B``) as the
        adapter ``adapter_id``, replacing the one registered under it."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        manager, models = self._plugrl_lora_managers()
        rank = max(int(t.shape[0]) for n, t in tensors.items() if n.endswith(".lora_A.weight"))
        leaves = sorted({adapter_module(name).rpartition(".")[2] for name in tensors})
        # alpha equal to the rank: a scaling of 1, the trainer's already in lora_B
        helper = PEFTHelper.from_dict({"r": rank, "lora_alpha": rank, "target_modules": leaves})
        helper.validate_legal(manager.lora_config)
        mapper = getattr(models.model, "hf_to_vllm_mapper", None)
        adapter = LoRAModel.from_lora_tensors(
            adapter_id,
            tensors,
            helper,
            device="cpu",
            dtype=manager.lora_config.lora_dtype,
            model_vocab_size=manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        )
        # a request naming the id between the two calls would find none: the engine calls
        # this between steps only
        models.remove_adapter(adapter_id)
        models.add_adapter(adapter)

    def plugrl_adapter_fingerprints(
        self, adapter_id: int, names: list[str], dtype: str
    ) -> dict[str, Any]:
        """The fingerprints (as mappings) of the adapter factors ``names`` as the registered
        adapter ``adapter_id`` holds them (a fused layer's adapter holds one factor per
        shard), in ``dtype``; names it lacks are left out."""
        import torch

        from plugrl.api.rollout import weight_fingerprint

        _, models = self._plugrl_lora_managers()
        adapter = models.get_adapter(adapter_id)
        if adapter is None:
            return {}
        packed = getattr(models.model, "packed_modules_mapping", {}) or {}
        fingerprints = {}
        for name in names:
            factor = _held_factor(adapter.loras, name, packed)
            if factor is not None:
                fingerprints[name] = attrs.asdict(weight_fingerprint(factor, getattr(torch, dtype)))
        return fingerprints


def _held_factor(loras: Mapping[str, Any], name: str, packed: Mapping[str, Sequence[str]]) -> Any:
    """The factor ``name`` in vLLM's adapter layers ``loras`` (by module), looking in the
    fused layer's list for a shard of one; ``None`` when absent."""
    module = adapter_module(name)
    is_a = name.endswith(".lora_A.weight")
    weights = loras.get(module)
    index = None
    if weights is None:
        parent, _, leaf = module.rpartition(".")
        for fused, shards in packed.items():
            if leaf in shards:
                weights = loras.get(f"{parent}.{fused}" if parent else fused)
                index = list(shards).index(leaf)
                break
    if weights is None:
        return None
    factor = weights.lora_a if is_a else weights.lora_b
    if index is not None:
        factor = factor[index] if isinstance(factor, list) else None
    return factor


class WeightReceiver(AdapterReceiver):
    """Mixed into vLLM's worker (``worker_extension_cls``); the engine calls these methods
    through ``collective_rpc``. ``self.model_runner`` is the worker's model runner."""

    def plugrl_weight_plan(self, names: list[str]) -> dict[str, Any]:
        """The :class:`WeightPlan` of ``names`` as a mapping (it may cross processes)."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        # every name of a shared parameter: a tied output embedding is a layer of its own,
        # kept on its old weights unless it is loaded too
        first_name: dict[int, str] = {}
        shared: dict[str, str] = {}
        parameters = []
        for name, parameter in model.named_parameters(remove_duplicate=False):
            parameters.append(name)
            source = first_name.setdefault(id(parameter), name)
            if source != name:
                shared[name] = source
        plan = weight_plan(names, packed, parameters, shared, Names.of_model(model))
        return attrs.asdict(plan)

    def plugrl_weight_fingerprints(
        self, names: list[str], shapes: dict[str, list[int]], dtype: str
    ) -> dict[str, Any]:
        """The fingerprints (as mappings) of the Hugging Face weights ``names``, read out of
        the layers vLLM loaded them into (:func:`hf_view`; ``shapes``: the full shape of every
        weight of the update), in ``dtype``; names with no layer here are left out."""
        import torch

        from plugrl.api.rollout import weight_fingerprint

        model = self.model_runner.model  # type: ignore[attr-defined]
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        held = dict(model.named_parameters(remove_duplicate=False))
        held.update(dict(model.named_buffers()))
        renaming = Names.of_model(model)
        in_model = {name: renaming.to_model(name) for name in shapes}
        model_shapes = {in_model[name]: shape for name, shape in shapes.items() if in_model[name]}
        fingerprints = {}
        for name in names:
            model_name = in_model.get(name)
            if model_name is None:
                continue
            view = hf_view(model_name, shapes[name], held, packed, model_shapes)
            if view is not None:
                fingerprints[name] = attrs.asdict(weight_fingerprint(view, getattr(torch, dtype)))
        return fingerprints

    def plugrl_load_weights(self, route: str, weights: list[tuple[str, Any]]) -> None:
        if route == "reload_weights":
            hide_rotary_reload_notice()
            self.model_runner.reload_weights(weights_iterator=iter(weights))  # type: ignore[attr-defined]
        elif route == "load_weights":
            self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        else:
            raise PluginError(f"unknown weight route {route!r}; one of {', '.join(ROUTES)}")


def hf_view(
    name: str,
    shape: Sequence[int],
    held: Mapping[str, Any],
    packed: Mapping[str, Sequence[str]],
    shapes: Mapping[str, Sequence[int]],
) -> Any:
    """The part of vLLM's parameter that holds the Hugging Face weight ``name`` of full
    ``shape`` (one engine of one device): the parameter itself, the rows of a shard of a fused
    layer (``q_proj`` in ``qkv_proj``: the shards stack along the first dimension in the order
    of ``packed``, each as many rows as its shape in ``shapes``), or the first rows of a padded
    one (a vocabulary padded to a multiple). ``None`` when no parameter holds it in that
    shape (a layer whose kernel keeps the weight packed in a form of its own)."""
    module, _, kind = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    offset = 0
    target = name
    for fused, shards in packed.items():
        if leaf in shards:
            target = f"{parent}.{fused}.{kind}" if parent else f"{fused}.{kind}"
            for shard in shards[: list(shards).index(leaf)]:
                sibling = f"{parent}.{shard}.{kind}" if parent else f"{shard}.{kind}"
                offset += int(shapes[sibling][0]) if sibling in shapes else 0
            break
    parameter = held.get(target)
    if parameter is None:
        return None
    data = parameter.detach()
    if not shape:
        return data
    view = data[offset : offset + int(shape[0])]
    if tuple(view.shape) != tuple(shape):
        # the layer keeps its weights in a form of its own kernel's (vLLM's CPU build packs
        # linear layers and leaves the parameter empty): nothing here to read back
        return None
    return view
