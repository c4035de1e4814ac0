"""LoRA adapters through peft: the actor's model wrapped before sharding, its weights merged
on the way out, its adapters written as a PEFT folder.

peft renames what it wraps: the Hugging Face weight ``model.layers.0.self_attn.q_proj.weight``
becomes ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` beside
``...q_proj.lora_A.default.weight`` and ``...q_proj.lora_B.default.weight``. Engines and
exports get the Hugging Face names and the merged weight ``W + (alpha / r) B A``; checkpoints
keep peft's names, as they hold the adapters alone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from plugrl.api import RecipeError
from plugrl.api.data import quiet_hf_loading
from plugrl_fsdp2.config import LORA_INSTALL

if TYPE_CHECKING:
    from plugrl.api import Recipe

PEFT_PREFIX = "base_model.model."
"""What peft puts before every name of the model it wraps."""

ADAPTER = "default"
"""The name of the one adapter the backend trains."""

ADAPTER_FOLDER = "lora_adapter"
"""The PEFT adapter folder an export writes inside the merged model's folder."""


def require_peft() -> Any:
    """The ``peft`` module, or a :class:`RecipeError` saying how to install it."""
    try:
        import peft
    except ImportError:
        raise RecipeError(
            f"is set but peft is not installed; {LORA_INSTALL}", key="model.lora_rank"
        ) from None
    return peft


def _adapter_config(recipe: Recipe) -> Any:
    """The :class:`peft.LoraConfig` of the recipe's ``model.lora_*`` keys, or of the adapter
    folder ``model.lora_adapter_path`` names."""
    peft = require_peft()
    settings = recipe.model
    if settings.lora_adapter_path:
        folder = Path(settings.lora_adapter_path)
        if not (folder / "adapter_config.json").is_file():
            raise RecipeError(
                f"{str(folder)!r} is not a PEFT adapter folder (no adapter_config.json); give "
                "a folder written by save_pretrained of a peft model, or unset it",
                key="model.lora_adapter_path",
            )
        config = peft.PeftConfig.from_pretrained(str(folder))
        if not isinstance(config, peft.LoraConfig):
            raise RecipeError(
                f"{str(folder)!r} holds a {type(config).__name__} adapter; the fsdp2 backend "
                "trains LoRA adapters only",
                key="model.lora_adapter_path",
            )
        config.inference_mode = False
        return config
    return peft.LoraConfig(
        r=settings.lora_rank,
        lora_alpha=settings.lora_alpha,
        target_modules=settings.target_modules,
        exclude_modules=settings.exclude_modules,
        # dropout would make the log-probs of one sequence differ between two forwards
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap(model: torch.nn.Module, recipe: Recipe, *, load_adapter: bool) -> torch.nn.Module:
    """``model`` with LoRA adapters on its target modules, only the adapters trainable.

    ``load_adapter``: read ``model.lora_adapter_path``'s weights into the adapters (a model
    built on the meta device gets the structure alone; its weights come from rank 0).
    """
    peft = require_peft()
    config = _adapter_config(recipe)
    try:
        with quiet_hf_loading():
            wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:
        from_folder = recipe.model.lora_adapter_path
        key = "model.lora_adapter_path" if from_folder else "model.target_modules"
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise RecipeError(
            f"peft could not put adapters on {type(model).__name__}: {reason}; name modules "
            "the model has (all-linear, or names such as q_proj and v_proj)",
            key=key,
        ) from None
    if load_adapter and recipe.model.lora_adapter_path:
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(recipe.model.lora_adapter_path)
        file = folder / "adapter_model.safetensors"
        if not file.is_file():
            raise RecipeError(
                f"{str(folder)!r} has no adapter_model.safetensors; give a folder written by "
                "save_pretrained of a peft model",
                key="model.lora_adapter_path",
            )
        result = set_peft_model_state_dict(wrapped, load_file(file), adapter_name=ADAPTER)
        missing = [name for name in result.missing_keys if ".lora_" in name]
        if missing or result.unexpected_keys:
            raise RecipeError(
                f"{str(file)!r} does not fit the model's adapters: missing {missing[:2]}, "
                f"unexpected {list(result.unexpected_keys)[:2]}; is it an adapter of another "
                "model?",
                key="model.lora_adapter_path",
            )
    return wrapped


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """Forwards inside run the model the adapters started from (peft's ``disable_adapter``).

    peft also marks the adapters frozen meanwhile; they stay trainable here, because FSDP2
    reads which parameters train (and so the dtype their gradients are reduced in) at its
    first forward, which may be this one. Gradients are off in this block anyway."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    with model.disable_adapter():  # type: ignore[operator]
        for parameter in trainable:
            parameter.requires_grad_(True)
        yield


def hf_name(peft_name: str) -> str | None:
    """The Hugging Face name of a wrapped model's weight, or ``None`` for an adapter weight."""
    if ".lora_" in peft_name:
        return None
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


@attrs.frozen
class Adapter:
    """The two factors of one adapted layer and its scale: ``W + scaling * B @ A``
    (transposed for a weight stored ``(in, out)``, as GPT-2's Conv1D stores it)."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scaling: float
    transposed: bool = False


def adapters(model: torch.nn.Module) -> dict[str, Adapter]:
    """Each adapted layer's factors, by the state-dict name of the weight they change."""
    from peft.tuners.lora import LoraLayer

    found: dict[str, Adapter] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            found[f"{name}.base_layer.weight"] = Adapter(
                lora_a=module.lora_A[ADAPTER].weight,
                lora_b=module.lora_B[ADAPTER].weight,
                scaling=float(module.scaling[ADAPTER]),
                transposed=bool(getattr(module, "fan_in_fan_out", False)),
            )
    return found


def merge(
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    transposed: bool = False,
) -> torch.Tensor:
    """``weight + scaling * lora_b @ lora_a`` (its transpose with ``transposed``), computed in
    float32, in ``weight``'s dtype."""
    delta = (lora_b.float() @ lora_a.float()) * scaling
    if transposed:
        delta = delta.T
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)


def factor_names(peft_weight_name: str) -> tuple[str, str]:
    """The names an adapter-only weight sync gives the two factors of the adapter on the
    wrapped weight ``peft_weight_name`` (``...q_proj.base_layer.weight``): a PEFT adapter
    file's ``...q_proj.lora_A.weight`` and ``...q_proj.lora_B.weight``, which vLLM's LoRA
    loader reads."""
    module = peft_weight_name.removesuffix(".base_layer.weight")
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


def adapter_state_name(peft_name: str) -> str:
    """The name a PEFT adapter file gives a weight (peft's names without the adapter's)."""
    return peft_name.replace(f".{ADAPTER}.", ".")


def write_adapter_folder(
    folder: Path, *, model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]], base: str
) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` to ``folder``:
    ``weights`` are the adapter's full tensors in peft's names, ``base`` the model folder
    recorded as the adapter's base."""
    from safetensors.torch import save_file

    config = model.peft_config[ADAPTER]  # type: ignore[index, union-attr]
    folder.mkdir(parents=True, exist_ok=True)
    state = {adapter_state_name(name): tensor.contiguous() for name, tensor in weights}
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    saved = copy.copy(config)
    saved.base_model_name_or_path = base
    saved.inference_mode = True
    saved.save_pretrained(str(folder))
