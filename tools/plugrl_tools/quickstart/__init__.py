"""The quickstart: a tiny Qwen2-architecture model, a byte-level BPE tokenizer and a verifiable
arithmetic task, all built locally from a seed (nothing is downloaded), plus a short warm start
that leaves clear room for reinforcement learning. The tool task (``ToolQuickstartSettings``)
is three-digit multiplication, which the model does by calling a calculator tool. The vision
task (``VisionQuickstartSettings``) is counting the shapes drawn in a picture, with a tiny
Qwen2.5-VL-architecture model.

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
from plugrl_tools.quickstart.vision_build import DEFAULT_VISION_DIR, VisionQuickstartSettings

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_TOOL_DIR",
    "DEFAULT_VISION_DIR",
    "QUICKSTART_VERSION",
    "QuickstartPaths",
    "QuickstartSettings",
    "ToolQuickstartSettings",
    "VisionQuickstartSettings",
    "describe",
    "prepare_quickstart",
    "quickstart_overrides",
    "save_untrained_model",
]
