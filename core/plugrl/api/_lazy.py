"""Names of the plugin API resolved on first use.

A plugin's ``__init__`` imports the API to register its parts, and registration must stay
light (``plugrl --help`` and ``plugrl plugins`` import every plugin): so each API module lists
where its names live and imports a name's home only when a plugin reads the name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_module(
    module_name: str, exports: dict[str, tuple[str, str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of API module ``module_name``, whose name ``n`` is
    attribute ``exports[n][1]`` of module ``exports[n][0]`` (a submodule when the module has
    no such attribute)."""

    def __getattr__(name: str) -> Any:
        try:
            home, attribute = exports[name]
        except KeyError:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}") from None
        module = importlib.import_module(home)
        try:
            value = getattr(module, attribute)
        except AttributeError:
            value = importlib.import_module(f"{home}.{attribute}")
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
