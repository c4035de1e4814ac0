"""What the experiment-tracker loggers share: scalar metrics, the recipe as parameters, the
run's outcome, and the id that lets a resumed run continue the tracker's run."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugrl.checkpoint import LATEST_FILE

if TYPE_CHECKING:
    from plugrl.recipe import Recipe


def scalars(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    """The numeric metrics as Python numbers (torch and numpy scalars unwrapped, booleans as
    0/1); anything else (a string, a list) is left out. NaN and infinities are kept: every
    tracker here takes them."""
    found: dict[str, int | float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            try:
                value = value.item()
            except (TypeError, ValueError):  # an array of several values
                continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)):
            found[str(key)] = value
    return found


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value as text)`` for every leaf of the recipe (``actor.optim.lr``);
    lists and empty mappings are written as JSON."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, dotted + ".")
        elif isinstance(value, (Mapping, list, tuple)):
            yield dotted, json.dumps(value, default=str)
        else:
            yield dotted, "null" if value is None else str(value)


def continues_earlier_run(recipe: Recipe, run_dir: Path) -> bool:
    """Whether this run resumes from a checkpoint, and so should continue the tracker's run of
    the same folder rather than start a new one (a run that starts over, with
    ``trainer.resume_mode=disable`` or no checkpoint yet, gets a new tracker run)."""
    mode = recipe.trainer.resume_mode
    if mode == "disable":
        return False
    if mode == "auto":
        return (run_dir / LATEST_FILE).exists()
    return True  # a checkpoint path


class RunIdFile:
    """A tracker's run id kept in the run folder (``wandb_run_id.txt``, ...)."""

    def __init__(self, run_dir: Path, tracker: str) -> None:
        self.path = Path(run_dir) / f"{tracker}_run_id.txt"

    def read(self) -> str | None:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def write(self, run_id: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"{run_id}\n", encoding="utf-8")
