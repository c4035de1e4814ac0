"""``plugrl plot RUN_DIR``: a PNG of reward and validation accuracy per step."""

from __future__ import annotations

from pathlib import Path

from plugrl.errors import PlugrlError
from plugrl.run.metrics import METRICS_FILE, read_metrics

PLOT_FILE = "progress.png"
REWARD_KEY = "critic/score/mean"


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw training reward and validation accuracy per step; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out_path = Path(out) if out else run_dir / PLOT_FILE
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
