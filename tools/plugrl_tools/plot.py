"""``plugrl plot RUN_DIR``: a PNG of reward and validation accuracy per step, and, for a run
whose validation responses name their pictures, a row of those pictures with what the model
answered at the first and the last validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from plugrl.errors import PlugrlError
from plugrl.run.metrics import METRICS_FILE, read_metrics

PLOT_FILE = "progress.png"
REWARD_KEY = "critic/score/mean"
PICTURES = 8
"""Validation pictures shown under the curves, at most."""


@attrs.frozen
class PictureRow:
    """A validation picture and what the model answered about it, first and last."""

    image: Path
    ground_truth: str
    first: str
    last: str
    first_score: float
    last_score: float


def _dump_step(path: Path) -> int:
    try:
        return int(path.stem.removeprefix("val_"))
    except ValueError:
        return -1


def _answers_by_image(path: Path) -> dict[str, dict[str, Any]]:
    """The first line per picture of a validation dump (a picture sampled n times has n)."""
    answers: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short
            continue
        image = record.get("image") if isinstance(record, dict) else None
        if isinstance(image, str):
            answers.setdefault(image, record)
    return answers


def _short(record: dict[str, Any]) -> str:
    """What the model answered: the scorer's parsed answer, else the response's start."""
    pred = record.get("pred")
    if pred is not None:
        return str(pred)
    response = str(record.get("response", "")).strip().replace("\n", " ")
    return response if len(response) <= 10 else response[:9] + "…"


def picture_rows(run_dir: str | Path, limit: int = PICTURES) -> tuple[list[PictureRow], int, int]:
    """Up to ``limit`` validation pictures of the run with the answers of its first and last
    validation, and those two steps; pictures whose score changed come first. Nothing when
    the run has no validation dump (``trainer.validation_data_dir``) whose lines name an
    ``image`` file found beside its first validation file."""
    import yaml

    run_dir = Path(run_dir)
    try:
        recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return [], 0, 0
    dump_dir = (recipe.get("trainer") or {}).get("validation_data_dir")
    val_files = (recipe.get("data") or {}).get("val_files") or []
    if isinstance(val_files, str):
        val_files = [val_files]
    if not dump_dir or not val_files:
        return [], 0, 0
    dumps = sorted(Path(dump_dir).glob("val_*.jsonl"), key=_dump_step)
    if len(dumps) < 2:
        return [], 0, 0
    data_dir = Path(val_files[0]).parent
    first, last = _answers_by_image(dumps[0]), _answers_by_image(dumps[-1])
    rows = []
    for image, after in last.items():
        before = first.get(image)
        if before is None or not (data_dir / image).is_file():
            continue
        rows.append(
            PictureRow(
                image=data_dir / image,
                ground_truth=str(after.get("ground_truth")),
                first=_short(before),
                last=_short(after),
                first_score=float(before.get("score") or 0.0),
                last_score=float(after.get("score") or 0.0),
            )
        )
    # the pictures whose answer got better show what was learned; sorted is stable
    rows = sorted(rows, key=lambda row: row.last_score <= row.first_score)
    return rows[:limit], _dump_step(dumps[0]), _dump_step(dumps[-1])


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw training reward and validation accuracy per step (and the validation pictures of
    :func:`picture_rows`, when there are any); returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    reward = [
        (r["step"], r[REWARD_KEY]) for r in records if isinstance(r.get(REWARD_KEY), (int, float))
    ]
    accuracy: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        for key, value in record.items():
            if key.startswith("val-core/") and "/acc/" in key and isinstance(value, (int, float)):
                accuracy.setdefault(key.removeprefix("val-core/"), []).append(
                    (record["step"], value)
                )
    if not reward and not accuracy:
        raise PlugrlError(
            f"{run_dir / METRICS_FILE} has no {REWARD_KEY} or val-core accuracy to plot yet"
        )
    pictures, first_step, last_step = picture_rows(run_dir)
    if pictures:
        fig = plt.figure(figsize=(11, 6.6))
        grid = fig.add_gridspec(2, PICTURES, height_ratios=[3, 1.7])
        ax_reward = fig.add_subplot(grid[0, : PICTURES // 2])
        ax_acc = fig.add_subplot(grid[0, PICTURES // 2 :])
    else:
        fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    if reward:
        ax_reward.plot(*zip(*reward, strict=True), marker=".", label="train reward (mean score)")
    ax_reward.set(xlabel="step", ylabel=REWARD_KEY, title="Training reward")
    ax_reward.grid(alpha=0.3)
    for name, points in sorted(accuracy.items()):
        ax_acc.plot(*zip(*points, strict=True), marker="o", label=name)
    ax_acc.set(xlabel="step", ylabel="accuracy", title="Validation accuracy", ylim=(0, 1))
    ax_acc.grid(alpha=0.3)
    if accuracy:
        ax_acc.legend(fontsize=8)
    for column, row in enumerate(pictures):
        ax = fig.add_subplot(grid[1, column])
        with Image.open(row.image) as picture:
            ax.imshow(picture.convert("RGB"))
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(
            f"truth {row.ground_truth}\nstep {first_step}: {row.first}\n"
            f"step {last_step}: {row.last}",
            fontsize=8,
            color="tab:green" if row.last_score > 0 else "tab:red",
        )
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out_path = Path(out) if out else run_dir / PLOT_FILE
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
