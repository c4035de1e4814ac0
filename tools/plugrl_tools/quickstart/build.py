"""Build everything the quickstart run needs, here, from a seed: tokenizer, warm-started tiny
model, and the arithmetic task's train/validation parquet files."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from plugrl.data.hf_loading import quiet_hf_loading
from plugrl_tools.quickstart import arithmetic
from plugrl_tools.quickstart.counting import MANY_SHAPES
from plugrl_tools.quickstart.tool_build import (
    TOOL_QUICKSTART_VERSION,
    ToolQuickstartSettings,
    build_tool_into,
)
from plugrl_tools.quickstart.vision_build import (
    VISION_QUICKSTART_VERSION,
    VisionQuickstartSettings,
    build_vision_into,
)

logger = logging.getLogger("plugrl_tools.quickstart")

# Bump when anything below changes what gets built; a cached folder of another version is
# rebuilt.
QUICKSTART_VERSION = "2"
MANIFEST = "quickstart.json"
# Where the quickstart keeps its model and data unless told otherwise (beside the run folders).
DEFAULT_DIR = Path("runs") / "quickstart-assets"

# Seconds per example and epoch of a warm start, and of the rest of a build, on an idle 2-core
# x86 CPU, for the phase lines' rough estimates; the rest (imports, tokenizer, evaluation,
# writing) took 15-20 s of a build under a load average of 9. Under load the progress lines'
# own estimates are the ones to read.
OTHER_BUILD_S = 15.0
# a worked addition is about 50 tokens, through the 2-layer addition model: 600 examples x 10
# epochs took 37 s
WARM_START_EXAMPLE_S = 0.0062
# a tool conversation is about 90 tokens, through the 4-layer tool model, which trained about
# 4,000 tokens/s
TOOL_EXAMPLE_S = 0.0225
# a picture's example (34 tokens, 9 of them the picture's, through a 180k-parameter model and
# its vision tower): 800 pictures x 8 epochs took 29 s under load
VISION_EXAMPLE_S = 0.0019


def warm_start_seconds(settings: AnySettings) -> float:
    per_example = WARM_START_EXAMPLE_S
    if isinstance(settings, ToolQuickstartSettings):
        per_example = TOOL_EXAMPLE_S
    elif isinstance(settings, VisionQuickstartSettings):
        per_example = VISION_EXAMPLE_S
    return settings.warm_start_epochs * settings.num_warm_start * per_example


def _build_seconds(settings: AnySettings) -> float:
    return warm_start_seconds(settings) + OTHER_BUILD_S


def rough_duration(seconds: float) -> str:
    """``about 2 minutes on an idle 2-core CPU``: a figure to plan by, not a promise."""
    if seconds < 90:
        figure = f"about {max(10, round(seconds, -1)):.0f} s"
    else:
        figure = f"about {round(seconds / 60):.0f} minutes"
    return f"{figure} on an idle 2-core CPU, longer under load"


@attrs.frozen
class QuickstartSettings:
    """The task's size and difficulty and the warm start's length."""

    num_warm_start: int = 600
    num_train: int = 2048
    num_val: int = 256
    carry_fraction: float = 0.75
    forget_carry_probability: float = 0.65
    warm_start_epochs: int = 10
    warm_start_batch_size: int = 32
    warm_start_lr: float = 1e-3
    vocab_size: int = 512
    max_prompt_length: int = 32
    max_response_length: int = 48


@attrs.frozen
class QuickstartPaths:
    """Where the quickstart's files are, and what the warm start measured."""

    root: Path
    model_path: Path
    train_file: Path
    val_file: Path
    manifest: dict[str, Any]

    @property
    def warm_start_accuracy(self) -> float:
        """Greedy accuracy of the warm-started model on the validation prompts."""
        return float(self.manifest["warm_start"]["val_accuracy_greedy"])


def _paths(root: Path, manifest: dict[str, Any]) -> QuickstartPaths:
    return QuickstartPaths(
        root=root,
        model_path=root / "model",
        train_file=root / "data" / "train.parquet",
        val_file=root / "data" / "val.parquet",
        manifest=manifest,
    )


AnySettings = QuickstartSettings | ToolQuickstartSettings | VisionQuickstartSettings
"""The arithmetic task's settings, the tool task's (multiplication with a calculator), or the
vision task's (counting the shapes in a picture)."""


def _version(settings: AnySettings) -> str:
    if isinstance(settings, ToolQuickstartSettings):
        return TOOL_QUICKSTART_VERSION
    if isinstance(settings, VisionQuickstartSettings):
        return VISION_QUICKSTART_VERSION
    return QUICKSTART_VERSION


def _cached(root: Path, seed: int, settings: AnySettings) -> QuickstartPaths | None:
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (
        manifest.get("version") != _version(settings)
        or manifest.get("seed") != seed
        or manifest.get("settings") != attrs.asdict(settings)
    ):
        return None
    paths = _paths(root, manifest)
    needed = [paths.model_path / "config.json", paths.train_file, paths.val_file]
    return paths if all(p.exists() for p in needed) else None


def _task(
    seed: int, settings: QuickstartSettings
) -> tuple[arithmetic.TaskSplits, list[tuple[str, str]], Any]:
    """The problems, the warm-start examples, and the tokenizer trained on those examples."""
    from plugrl_tools.quickstart.model import train_tokenizer

    logger.info(
        "tokenizer: training a byte-level BPE of %d tokens on %d worked examples (seconds)",
        settings.vocab_size,
        settings.num_warm_start,
    )
    splits = arithmetic.make_splits(
        seed,
        num_warm_start=settings.num_warm_start,
        num_train=settings.num_train,
        num_val=settings.num_val,
        carry_fraction=settings.carry_fraction,
    )
    examples = arithmetic.warm_start_examples(
        splits.warm_start, seed, forget_carry_probability=settings.forget_carry_probability
    )
    tokenizer = train_tokenizer(
        [text for example in examples for text in example], vocab_size=settings.vocab_size
    )
    return splits, examples, tokenizer


def build_into(
    root: Path, seed: int, settings: QuickstartSettings = QuickstartSettings()
) -> dict[str, Any]:
    """Build the quickstart in ``root`` (an empty folder) and return its manifest."""
    import torch

    from plugrl_tools.quickstart.model import build_tiny_model
    from plugrl_tools.quickstart.progress import Progress
    from plugrl_tools.quickstart.warmstart import (
        GENERATION_BATCH_SIZE,
        accuracy,
        supervised_fine_tune,
    )

    started = time.perf_counter()
    splits, examples, tokenizer = _task(seed, settings)
    logger.info("model: a Qwen2-architecture model of about 2M parameters, from seed %d", seed)
    model = build_tiny_model(tokenizer, seed)
    num_parameters = sum(p.numel() for p in model.parameters())
    steps = settings.warm_start_epochs * math.ceil(len(examples) / settings.warm_start_batch_size)
    logger.info(
        "warm start: %d epochs of supervised training on %d worked examples (%d steps of %d) so "
        "that the model writes the answer format; %s",
        settings.warm_start_epochs,
        len(examples),
        steps,
        settings.warm_start_batch_size,
        rough_duration(warm_start_seconds(settings)),
    )
    # the warm start is short and runs where the user is: keep it reproducible for a seed
    torch.manual_seed(seed)
    stats = supervised_fine_tune(
        model,
        tokenizer,
        examples,
        epochs=settings.warm_start_epochs,
        batch_size=settings.warm_start_batch_size,
        lr=settings.warm_start_lr,
        seed=seed,
    )
    eval_started = time.perf_counter()
    batches = math.ceil(len(splits.val) / GENERATION_BATCH_SIZE)
    # greedy only: the run's first step reports the sampled accuracy anyway (its score)
    logger.info(
        "evaluation: greedy accuracy of the warm-started model on %d held-out problems "
        "(generation in batches of %d; seconds)",
        len(splits.val),
        GENERATION_BATCH_SIZE,
    )
    with Progress("evaluation", batches, "batches") as progress:
        greedy = accuracy(model, tokenizer, splits.val, progress=progress)
    eval_seconds = time.perf_counter() - eval_started

    logger.info(
        "data: writing the model and %d training and %d validation problems (verl's parquet "
        "schema)",
        len(splits.train),
        len(splits.val),
    )
    model_dir = root / "model"
    with quiet_hf_loading():
        model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    arithmetic.write_parquet(splits.train, "train", root / "data" / "train.parquet")
    arithmetic.write_parquet(splits.val, "val", root / "data" / "val.parquet")
    manifest = {
        "version": QUICKSTART_VERSION,
        "seed": seed,
        "settings": attrs.asdict(settings),
        "data_source": arithmetic.DATA_SOURCE,
        "model": {"parameters": num_parameters, "vocab_size": len(tokenizer)},
        "warm_start": {
            "examples": len(examples),
            "steps": stats.steps,
            "first_loss": stats.first_loss,
            "last_loss": stats.last_loss,
            "train_seconds": round(stats.seconds, 2),
            "val_accuracy_greedy": greedy,
            "eval_seconds": round(eval_seconds, 2),
        },
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def prepare_quickstart(
    out_dir: str | Path,
    *,
    seed: int = 0,
    force: bool = False,
    settings: AnySettings = QuickstartSettings(),
) -> QuickstartPaths:
    """The quickstart's model and data under ``out_dir``, built unless a build of the same
    version, seed and settings is already there (``force`` rebuilds). ``settings`` choose the
    task: :class:`QuickstartSettings` for two-digit addition,
    :class:`~plugrl_tools.quickstart.tool_build.ToolQuickstartSettings` for three-digit
    multiplication with the calculator tool,
    :class:`~plugrl_tools.quickstart.vision_build.VisionQuickstartSettings` for counting the
    shapes in a picture with a tiny vision-language model.

    The folder is written whole or not at all: the build happens in a sibling temporary folder
    that replaces ``out_dir`` at the end.
    """
    root = Path(out_dir)
    if not force:
        cached = _cached(root, seed, settings)
        if cached is not None:
            return cached
    if root.exists() and any(root.iterdir()) and not (root / MANIFEST).exists():
        raise FileExistsError(
            f"{root} exists and is not a quickstart folder; choose an empty or new folder"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    logger.info(
        "building the quickstart's tokenizer, model and data in %s, once (later runs reuse "
        "them); %s",
        root,
        rough_duration(_build_seconds(settings)),
    )
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        if isinstance(settings, ToolQuickstartSettings):
            manifest = build_tool_into(staging, seed, settings)
        elif isinstance(settings, VisionQuickstartSettings):
            manifest = build_vision_into(staging, seed, settings)
        else:
            manifest = build_into(staging, seed, settings)
        if root.exists():
            shutil.rmtree(root)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _paths(root, manifest)


def quickstart_overrides(paths: QuickstartPaths) -> list[str]:
    """Recipe overrides that point a run at the quickstart's model and data."""
    settings = paths.manifest["settings"]
    return [
        f"model.path={paths.model_path}",
        "model.dtype=float32",
        f"data.train_files={paths.train_file}",
        f"data.val_files={paths.val_file}",
        f"data.max_prompt_length={settings['max_prompt_length']}",
        f"data.max_response_length={settings['max_response_length']}",
    ]


def describe(paths: QuickstartPaths) -> str:
    """A few lines for the console: where things are and how good the warm start is."""
    warm = paths.manifest["warm_start"]
    return "\n".join(
        [
            f"quickstart folder: {paths.root}",
            f"  model:      {paths.model_path} ({paths.manifest['model']['parameters']:,} params)",
            f"  train data: {paths.train_file}",
            f"  val data:   {paths.val_file}",
            f"  warm start: {warm['examples']} examples, {warm['steps']} steps, "
            f"{warm['train_seconds']:.0f} s; greedy validation accuracy "
            f"{warm['val_accuracy_greedy']:.1%}",
            *(
                [
                    f"              pictures of {MANY_SHAPES} shapes or more "
                    f"{warm['val_accuracy_greedy_many']:.1%}, of fewer "
                    f"{warm['val_accuracy_greedy_few']:.1%}"
                ]
                if "val_accuracy_greedy_many" in warm
                else []
            ),
            *(
                [
                    f"              calculator calls {warm['val_tool_calls_greedy']:.2f} and "
                    f"errors {warm['val_tool_errors_greedy']:.2f} per problem"
                ]
                if "val_tool_calls_greedy" in warm
                else []
            ),
        ]
    )


def save_untrained_model(
    out_dir: str | Path, seed: int = 0, settings: QuickstartSettings = QuickstartSettings()
) -> Path:
    """The quickstart's tokenizer and a freshly initialised (not warm-started) model, saved as a
    Hugging Face folder: a second-scale fixture for tests of parts that need a real model."""
    from plugrl_tools.quickstart.model import build_tiny_model

    _splits, _examples, tokenizer = _task(seed, settings)
    model = build_tiny_model(tokenizer, seed)
    path = Path(out_dir)
    with quiet_hf_loading():
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
