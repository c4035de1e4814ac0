"""The run folder: created and checked before anything is written, the model folders checked
before anything starts, and the recipe of each segment of a run kept beside its checkpoints."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugrl.errors import RecipeError
from plugrl.recipe import Recipe

logger = logging.getLogger("plugrl.run")


# Keys whose change between two segments of one run makes the resumed run another experiment.
WATCHED_ON_RESUME = ("data.train_batch_size", "rollout.n", "actor.optim.lr")
RECIPE_FILE = "recipe.yaml"


def _recipe_files(run_dir: Path) -> list[Path]:
    """``recipe.yaml``, then ``recipe.2.yaml``, ``recipe.3.yaml``...: one per segment."""
    files = [run_dir / RECIPE_FILE] if (run_dir / RECIPE_FILE).exists() else []
    numbered = []
    for path in run_dir.glob("recipe.*.yaml"):
        middle = path.name[len("recipe.") : -len(".yaml")]
        if middle.isdigit():
            numbered.append((int(middle), path))
    return files + [path for _, path in sorted(numbered)]


def _dotted(data: Mapping[str, Any], key: str) -> Any:
    value: Any = data
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def record_recipe(recipe: Recipe, run_dir: Path) -> Path:
    """Keep the recipe of each segment of a run: the first as ``recipe.yaml``, a resumed run
    whose recipe differs from the last one's as ``recipe.N.yaml`` (nothing is overwritten).
    Warns when a resume changes a key that makes it another experiment
    (:data:`WATCHED_ON_RESUME`)."""
    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    text = recipe.to_yaml()
    files = _recipe_files(run_dir)
    if files:
        last_text = files[-1].read_text(encoding="utf-8")
        if last_text == text:
            return files[-1]
        last = yaml.safe_load(last_text) or {}
        now = recipe.to_dict()
        for key in WATCHED_ON_RESUME:
            before, after = _dotted(last, key), _dotted(now, key)
            if before != after:
                logger.warning(
                    "this run continues %s, which used %s=%s; it now uses %s, so the steps "
                    "before and after are not one experiment",
                    run_dir,
                    key,
                    before,
                    after,
                )
        path = run_dir / f"recipe.{len(files) + 1}.yaml"
    else:
        path = run_dir / RECIPE_FILE
    path.write_text(text, encoding="utf-8")
    return path


def prepare_run_dir(recipe: Recipe) -> Path:
    """The run folder, created and checked writable, with a one-line error otherwise."""
    run_dir = recipe.run_dir
    key = "trainer.default_local_dir"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecipeError(
            f"cannot create the run folder {run_dir} ({exc.strerror}); choose a folder you can "
            "write to",
            key=key,
        ) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RecipeError(
            f"the run folder {run_dir} is not writable; choose a folder you can write to", key=key
        )
    return run_dir


MODEL_FILES = ("config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_folders(recipe: Recipe) -> None:
    """``model.path`` holds a Hugging Face model and the tokenizer folder a tokenizer: checked
    before anything is written or started, with the key and the fix in one line."""
    model = recipe.model
    if model.path is None:
        return
    for key, path, needed, what in (
        ("model.path", model.path, MODEL_FILES, "Hugging Face model"),
        (
            "model.tokenizer_path" if model.tokenizer_path else "model.path",
            model.tokenizer_path or model.path,
            TOKENIZER_FILES,
            "tokenizer",
        ),
    ):
        folder = Path(path)
        if not folder.is_dir():
            raise RecipeError(
                f"{folder} is not a folder; set a local Hugging Face model folder", key=key
            )
        if not any((folder / name).is_file() for name in needed):
            raise RecipeError(
                f"{folder} holds no {what} (none of {', '.join(needed)}); point it at a folder "
                "that save_pretrained wrote",
                key=key,
            )
