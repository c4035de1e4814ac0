"""plugrl: reinforcement-learning post-training for LLMs where every part is a plugin.

A plugin author needs one name from this module, :data:`hookimpl`, to mark hook
implementations, and the interfaces of :mod:`plugrl.parts` that their classes implement
(docs/plugins.md).
"""

from importlib.metadata import PackageNotFoundError, version

import pluggy

try:
    __version__ = version("plugrl")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

PROJECT_NAME = "plugrl"
ENTRY_POINT_GROUP = "plugrl"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks hook implementations: ``@plugrl.hookimpl`` above ``def register_reward_functions(...)``."""

__all__ = ["ENTRY_POINT_GROUP", "PROJECT_NAME", "__version__", "hookimpl"]
