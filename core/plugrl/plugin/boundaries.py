"""Checks of what a part hands back to the core, made where the core receives it.

A reward manager that returns one score per response instead of ``[B, R]`` token-level
scores, or an estimator that returns ``[B]`` advantages, would otherwise fail inside the next
part with a traceback that names neither. These checks stop the run with one line naming the
part, its plugin, what it returned and what was expected. They cost a shape comparison and
one pass over the values, nothing that grows with the model.

* :func:`check_reward_output`: a :class:`~plugrl.parts.reward.RewardOutput` whose
  ``token_level_scores`` are a finite float ``[B, R]`` tensor and whose ``extra`` columns hold
  one value per response;
* :func:`check_estimator_output`: ``(advantages, returns)``, each a float ``[B, R]`` tensor,
  finite on the response tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import TYPE_CHECKING, Any

from plugrl.errors import PluginError
from plugrl.parts.reward import RewardOutput

if TYPE_CHECKING:
    import torch

    from plugrl.data.batch import Batch
    from plugrl.plugin.manager import PluginManager

_SHAPE_MEANING = "one row per response and one column per response token"


def check_reward_output(
    output: Any, batch: Batch, manager: str, plugins: PluginManager
) -> RewardOutput:
    """``output``, what the reward manager registered as ``manager`` returned for ``batch``,
    once checked: a one-line :class:`~plugrl.errors.PluginError` naming the manager and its
    plugin when it is not a ``RewardOutput``, its ``token_level_scores`` are not a float
    tensor shaped like ``batch["response_mask"]`` or hold a value that is not finite, or a
    column of its ``extra`` does not hold one value per response."""
    who = _who("reward_managers", manager, plugins)
    if not isinstance(output, RewardOutput):
        raise PluginError(
            f"{who} returned {_kind(output)}; expected a plugrl.parts.reward.RewardOutput"
        )
    shape = _response_shape(batch)
    _check_tensor(who, "token_level_scores", output.token_level_scores, shape, mask=None)
    if not isinstance(output.extra, Mapping):
        raise PluginError(
            f"{who} returned extra of type {_kind(output.extra)}; expected a dict of columns "
            f"with one value per response ({shape[0]})"
        )
    for name, column in output.extra.items():
        if isinstance(column, (str, bytes)) or not isinstance(column, Sized):
            raise PluginError(
                f"{who} returned extra column {name!r} of type {_kind(column)}; expected a "
                f"list with one value per response ({shape[0]})"
            )
        if len(column) != shape[0]:
            raise PluginError(
                f"{who} returned extra column {name!r} with {len(column)} values; expected "
                f"{shape[0]}, one per response"
            )
    return output


def check_estimator_output(
    result: Any, batch: Batch, estimator: str, plugins: PluginManager
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)``, what the advantage estimator registered as ``estimator``
    returned for ``batch``, once checked: a one-line :class:`~plugrl.errors.PluginError`
    naming the estimator and its plugin when it is not a pair, or either is not a float tensor
    shaped like ``batch["response_mask"]``, finite on the response tokens."""
    who = _who("advantage_estimators", estimator, plugins)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise PluginError(f"{who} returned {_kind(result)}; expected (advantages, returns)")
    shape = _response_shape(batch)
    mask = batch["response_mask"]
    advantages, returns = result
    _check_tensor(who, "advantages", advantages, shape, mask)
    _check_tensor(who, "returns", returns, shape, mask)
    return advantages, returns


def _check_tensor(
    who: str, name: str, value: Any, shape: tuple[int, ...], mask: torch.Tensor | None
) -> None:
    """A float tensor of ``shape``, finite everywhere (or where ``mask`` is set)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise PluginError(
            f"{who} returned {name} of type {_kind(value)}; expected a float tensor of shape "
            f"{shape}, {_SHAPE_MEANING}"
        )
    if tuple(value.shape) != shape:
        raise PluginError(
            f"{who} returned {name} of shape {tuple(value.shape)}; expected {shape}, "
            f"{_SHAPE_MEANING}"
        )
    if not value.is_floating_point():
        raise PluginError(
            f"{who} returned {name} of dtype {value.dtype}; expected a floating-point tensor "
            "(torch.float32)"
        )
    finite = torch.isfinite(value.detach())
    if mask is not None:
        finite = finite | (mask.to(value.device) == 0)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        where = " on response tokens" if mask is not None else ""
        raise PluginError(
            f"{who} returned {name} with {len(bad)} values that are not finite (nan or "
            f"inf){where}, the first in row {int(bad[0, 0])}; every value must be a finite "
            "number"
        )


def _response_shape(batch: Batch) -> tuple[int, ...]:
    return tuple(batch["response_mask"].shape)


def _kind(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _who(kind: str, name: str, plugins: PluginManager) -> str:
    """``reward manager 'x' (plugin 'y')``: the part at fault and where it comes from."""
    from plugrl.plugin.registry import PART_KINDS

    label = f"{PART_KINDS[kind].human_name} {name!r}"
    try:
        plugin = plugins.registry(kind).get(name).plugin
    except PluginError:  # a part built outside the registry (a test, a script)
        return label
    return f"{label} (plugin {plugin!r})"
