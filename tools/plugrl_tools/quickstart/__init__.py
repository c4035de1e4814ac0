"""The quickstart: a tiny Qwen2-architecture model, a byte-level BPE tokenizer and a verifiable
arithmetic task, all built locally from a seed (nothing is downloaded), plus a short warm start
that leaves clear room for reinforcement learning. The tool task (``ToolQuickstartSettings``)
is three-digit multiplication, which the model does by calling a calculator tool.

``prepare_quickstart(out_dir)`` builds (or reuses) them and returns their paths;
``quickstart_overrides(paths)`` points a recipe at them. Importing this package is cheap: torch
and transformers load only when something is built.
"""

from __future__ import annotations

from plugrl_tools.quickstart.build import (
    DEFAULT_DIR,
    QUICKSTART_VERSION,
    QuickstartPaths,
    QuickstartSettings,
    describe,
    prepare_quickstart,
    quickstart_overrides,
    save_untrained_model,
)
from plugrl_tools.quickstart.tool_build import DEFAULT_TOOL_DIR, ToolQuickstartSettings

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_TOOL_DIR",
    "QUICKSTART_VERSION",
    "QuickstartPaths",
    "QuickstartSettings",
    "ToolQuickstartSettings",
    "describe",
    "prepare_quickstart",
    "quickstart_overrides",
    "save_untrained_model",
]
