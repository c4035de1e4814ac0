"""The launcher interface: a scheduler that brings up a Ray cluster and runs a recipe on it
(``plugrl launch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plugrl.api._lazy import lazy_module

if TYPE_CHECKING:
    from plugrl.parts.launcher import (
        RECIPE_END,
        LaunchConfig,
        Launcher,
        LaunchJob,
        yaml_documents,
    )

__all__ = ["RECIPE_END", "LaunchConfig", "LaunchJob", "Launcher", "yaml_documents"]

__getattr__, __dir__ = lazy_module(
    __name__,
    {
        "RECIPE_END": ("plugrl.parts.launcher", "RECIPE_END"),
        "LaunchConfig": ("plugrl.parts.launcher", "LaunchConfig"),
        "LaunchJob": ("plugrl.parts.launcher", "LaunchJob"),
        "Launcher": ("plugrl.parts.launcher", "Launcher"),
        "yaml_documents": ("plugrl.parts.launcher", "yaml_documents"),
    },
)
