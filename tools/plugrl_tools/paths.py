"""The files a recipe reads before its first step, checked where the command runs."""

from __future__ import annotations

from pathlib import Path

from plugrl.recipe import Recipe


def missing_files(recipe: Recipe) -> list[tuple[str, str]]:
    """(key, path) of each file the recipe names that does not exist here: its data files and
    its reward function's file."""
    named = [("data.train_files", path) for path in recipe.data.train_files]
    named += [("data.val_files", path) for path in recipe.data.val_files]
    if recipe.reward.custom_function.path:
        named.append(("reward.custom_function.path", recipe.reward.custom_function.path))
    return [(key, path) for key, path in named if not Path(path).expanduser().exists()]
