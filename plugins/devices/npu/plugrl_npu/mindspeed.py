"""MindSpeed's patches of Megatron, for ``actor.backend: megatron`` on ``npu``.

MindSpeed patches Megatron when ``mindspeed.megatron_adaptor`` is imported, which must come
before anything imports Megatron; then ``repatch(args)`` applies the patches again with the
run's settings (the recipe's ``actor.override_transformer_config``), before the backend calls
``initialize_model_parallel``. Both happen in the ``prepare_backend`` hook of each trainer
process.

A Megatron run on NPU without these patches fails late or runs slow, and a regression once
made the second step silently do nothing. So every step is checked: the adaptor imported
before Megatron, at least one patch applied, and MindSpeed's arguments holding the values that
were asked for. A failed check stops the run with one line; patches that MindSpeed registered
but did not apply are logged as a warning and in the lines ``prepare_backend`` returns.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from plugrl.api import PluginError

if TYPE_CHECKING:
    from plugrl.api import Recipe

logger = logging.getLogger("plugrl.npu")

ADAPTOR = "mindspeed.megatron_adaptor"
INSTALL = (
    "install MindSpeed from Ascend's repository, the branch that matches your Megatron "
    "(git clone https://gitcode.com/Ascend/MindSpeed && pip install -e MindSpeed)"
)
SHOWN_PATCHES = 5


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _actor_setting(recipe: Recipe, key: str) -> Any:
    """A key of the megatron backend's ``actor`` section, flat (``actor.<key>``) or under
    ``actor.megatron`` as in verl; ``None`` when the recipe has neither."""
    actor = recipe.actor
    if hasattr(actor, key):
        return getattr(actor, key)
    nested = getattr(actor, "megatron", None)
    if isinstance(nested, Mapping):
        return nested.get(key)
    return getattr(nested, key, None)


def repatch_arguments(recipe: Recipe) -> dict[str, Any]:
    """What ``repatch`` gets: ``actor.override_transformer_config``, with flash attention on
    unless the recipe says otherwise, and the context-parallel size when above 1."""
    arguments = dict(_actor_setting(recipe, "override_transformer_config") or {})
    arguments.setdefault("use_flash_attn", True)
    context_parallel = _actor_setting(recipe, "context_parallel_size")
    if context_parallel is not None and context_parallel > 1:
        arguments["context_parallel_size"] = context_parallel
    return arguments


@contextmanager
def _plain_argv() -> Iterator[None]:
    # the adaptor parses sys.argv at import (and keeps unknown --flags as its own settings):
    # in a Ray worker that is Ray's command line, in the driver plugrl's; the run's settings
    # reach MindSpeed through repatch instead
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        yield
    finally:
        sys.argv = saved


def import_adaptor() -> Any:
    """Import ``mindspeed.megatron_adaptor`` (MindSpeed patches Megatron as it is imported)."""
    if ADAPTOR in sys.modules:
        return sys.modules[ADAPTOR]
    # a missing MindSpeed first: installing it is the fix whatever else is wrong
    if not _present("mindspeed"):
        raise PluginError(f"actor.backend megatron on device npu needs MindSpeed: {INSTALL}")
    early = sorted(name for name in sys.modules if name.split(".")[0] == "megatron")
    if early:
        raise PluginError(
            f"{early[0]} was imported in this process before MindSpeed's adaptor, so its "
            "patches would not apply; do not import megatron before the run builds its parts "
            "(check reward functions and other plugins)"
        )
    with _plain_argv():
        return importlib.import_module(ADAPTOR)


def _patch_states() -> tuple[list[str], list[str]]:
    """(applied, registered but not applied) patch names from MindSpeed's patch manager."""
    manager = importlib.import_module("mindspeed.patch_utils").MindSpeedPatchesManager
    applied, idle = [], []
    for name, patch in manager.patches_info.items():
        (applied if getattr(patch, "is_applied", False) else idle).append(name)
    return applied, idle


def _arguments_not_taken(wanted: Mapping[str, Any]) -> list[str]:
    """``key=wanted (has actual)`` for each repatch argument MindSpeed's arguments lack."""
    try:
        get_args = importlib.import_module("mindspeed.args_utils").get_mindspeed_args
    except (ImportError, AttributeError):
        return []  # a MindSpeed without args_utils: the patch count is the check left
    current = get_args()
    wrong = []
    for key, value in wanted.items():
        actual = getattr(current, key, "<missing>")
        if actual != value:
            wrong.append(f"{key}={value!r} (has {actual!r})")
    return wrong


def _shown(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN_PATCHES} more" if len(names) > SHOWN_PATCHES else ""
    return ", ".join(names[:SHOWN_PATCHES]) + more


def apply_mindspeed(recipe: Recipe) -> list[str]:
    """Import the adaptor, ``repatch`` with the recipe's settings, check that it took; return
    one line per step for the log."""
    adaptor = import_adaptor()
    version = getattr(sys.modules.get("mindspeed"), "__version__", "unknown version")
    arguments = repatch_arguments(recipe)
    adaptor.repatch(arguments)
    applied, idle = _patch_states()
    shown_arguments = ", ".join(f"{key}={value!r}" for key, value in sorted(arguments.items()))
    if not applied:
        raise PluginError(
            f"MindSpeed applied no patch to Megatron after repatch({shown_arguments}) "
            f"({len(idle)} registered, none applied); Megatron would run unpatched on npu: "
            "check that the MindSpeed branch matches the installed Megatron"
        )
    not_taken = _arguments_not_taken(arguments)
    if not_taken:
        raise PluginError(
            "MindSpeed's arguments after repatch do not hold actor.override_transformer_config: "
            f"{'; '.join(not_taken)}; the patches were applied without the recipe's settings"
        )
    lines = [
        f"{ADAPTOR} imported before megatron (MindSpeed {version})",
        f"repatch({shown_arguments})",
        f"{len(applied)} MindSpeed patches applied: {_shown(applied)}",
    ]
    if idle:
        logger.warning(
            "MindSpeed registered %d patches that are NOT applied after repatch: %s",
            len(idle),
            ", ".join(idle),
        )
        lines.append(f"{len(idle)} MindSpeed patches registered but NOT applied: {_shown(idle)}")
    return lines
