"""Building the tracker loggers as a run does, and reading back what they wrote with each
tracker's own reader: nothing here stands in for a library."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from plugrl.parts.context import PartContext
from plugrl.plugin.build import build_part
from plugrl.plugin.manager import get_plugin_manager
from plugrl.recipe import Recipe, TrainerConfig
from plugrl.state.checkpoint import LATEST_FILE

PROJECT, EXPERIMENT = "plugrl-tests", "grpo-tiny"


def recipe(**trainer: Any) -> Recipe:
    return attrs.evolve(
        Recipe(),
        trainer=TrainerConfig(project_name=PROJECT, experiment_name=EXPERIMENT, **trainer),
    )


def make_logger(name: str, run_dir: Path, the_recipe: Recipe | None = None):
    """The logger registered as ``name``, built the way a run builds its loggers."""
    the_recipe = the_recipe or recipe()
    context = PartContext(recipe=the_recipe, plugins=get_plugin_manager(), run_dir=run_dir)
    return build_part("loggers", name, the_recipe.trainer, context)


def step_metrics(step: int) -> dict[str, Any]:
    """What a step reports, with the awkward values: NaN, infinity, numpy and torch scalars,
    a boolean, verl's ``@`` in a name, and a string no tracker plots."""
    return {
        "critic/score/mean": step / 10,
        "actor/pg_loss": float("nan"),
        "actor/grad_norm": float("inf"),
        "response_length/mean": np.float32(step * 2),
        "timing_s/step": torch.tensor(0.5),
        "val-core/plugrl/arithmetic/acc/mean@1": step / 4,
        "perf/total_num_tokens": 100 * step,
        "actor/clipped": True,
        "note": "not a number",
    }


def mark_checkpoint(run_dir: Path, step: int) -> None:
    """What a checkpointed run leaves: the step to resume from."""
    (run_dir / LATEST_FILE).write_text(f"{step}\n")


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6)


# ------------------------------------------------------------------------------- readers


def tensorboard_events(log_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, str]]:
    """``({tag: {step: value}}, {text tag: text})`` through TensorBoard's own event reader,
    which applies the purges of a resumed run as TensorBoard does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    scalars = {
        tag: {event.step: event.value for event in events.Scalars(tag)} for tag in tags["scalars"]
    }
    texts = {
        tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in tags["tensors"]
    }
    return scalars, texts


def wandb_run_folders(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def wandb_inspect(path: Path, *options: str) -> Any:
    """``wandb leet inspect --json``: W&B's reader of a run's ``.wandb`` transaction log."""
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *options, str(path)],
        capture_output=True,
        text=True,
        # offline, or the reader looks up W&B's server
        env={**os.environ, "WANDB_MODE": "offline"},
        stdin=subprocess.DEVNULL,
        timeout=120,
        check=True,
    )
    if "--summary" in options:
        return json.loads(result.stdout)
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def wandb_history(path: Path) -> dict[int, dict[str, Any]]:
    return {
        record["history"]["step"]["num"]: record["history"]["item"]
        for record in wandb_inspect(path)
        if record["type"] == "history"
    }


def swanlab_records(run_folder: Path) -> list[dict[str, Any]]:
    """The records of a SwanLab run file, read by the reader ``swanlab sync`` uses."""
    from google.protobuf.json_format import MessageToDict
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = run_folder.glob("run-*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    records = []
    try:
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            records.append(MessageToDict(record))
    finally:
        reader.close()
    return records


def swanlab_run_folders(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "swanlog").glob("run-*"))


def swanlab_scalars(run_folder: Path) -> dict[str, dict[int, Any]]:
    found: dict[str, dict[int, Any]] = {}
    for record in swanlab_records(run_folder):
        if "scalar" in record:
            scalar = record["scalar"]
            found.setdefault(scalar["key"], {})[int(scalar["step"])] = scalar["value"]["number"]
    return found


def mlflow_client(run_dir: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")


def mlflow_history(client, run_id: str, key: str) -> dict[int, float]:
    return {metric.step: metric.value for metric in client.get_metric_history(run_id, key)}
