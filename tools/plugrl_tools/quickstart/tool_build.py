"""Build the tool quickstart: tokenizer with the tool tags, a warm-started tiny model that
calls the calculator imperfectly, and the multiplication task's parquet files."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import attrs

from plugrl.data.hf_loading import quiet_hf_loading
from plugrl_tools.quickstart import multiplication

logger = logging.getLogger("plugrl_tools.quickstart")

TOOL_QUICKSTART_VERSION = "tool-1"
DEFAULT_TOOL_DIR = Path("runs") / "quickstart-tool-assets"


@attrs.frozen
class ToolQuickstartSettings:
    """The tool task's size and imperfection and the warm start's length."""

    num_warm_start: int = 800
    num_train: int = 2048
    num_val: int = 256
    hard_fraction: float = 0.75
    guess_probability: float = 0.7
    bad_call_probability: float = 0.25
    warm_start_epochs: int = 8
    warm_start_batch_size: int = 32
    warm_start_lr: float = 1e-3
    vocab_size: int = 512
    max_prompt_length: int = 48
    max_response_length: int = 96
    max_turns: int = 3


def tool_task(seed: int, settings: ToolQuickstartSettings, toolbox: Any) -> tuple[Any, list, Any]:
    """The problems, the warm-start conversations, and the tokenizer trained on them."""
    from plugrl_tools.quickstart.tool_warmstart import make_tool_tokenizer

    logger.info(
        "tokenizer: training a byte-level BPE of %d tokens on %d warm-start conversations "
        "(seconds)",
        settings.vocab_size,
        settings.num_warm_start,
    )
    splits = multiplication.make_splits(
        seed,
        num_warm_start=settings.num_warm_start,
        num_train=settings.num_train,
        num_val=settings.num_val,
        hard_fraction=settings.hard_fraction,
    )
    conversations = multiplication.warm_start_conversations(
        splits.warm_start,
        seed,
        toolbox.run_arguments,
        guess_probability=settings.guess_probability,
        bad_call_probability=settings.bad_call_probability,
    )
    texts = [text for messages in conversations for text in multiplication.plain_text(messages)]
    tokenizer = make_tool_tokenizer(texts, vocab_size=settings.vocab_size)
    return splits, conversations, tokenizer


def build_tool_into(
    root: Path, seed: int, settings: ToolQuickstartSettings = ToolQuickstartSettings()
) -> dict[str, Any]:
    """Build the tool quickstart in ``root`` (an empty folder) and return its manifest."""
    import json

    import torch

    from plugrl_tools.quickstart.build import rough_duration, warm_start_seconds
    from plugrl_tools.quickstart.model import TOOL_MODEL_SIZES, build_tiny_model
    from plugrl_tools.quickstart.progress import Progress
    from plugrl_tools.quickstart.tool_warmstart import (
        GENERATION_BATCH_SIZE,
        Toolbox,
        conversation_tokens,
        evaluate,
    )
    from plugrl_tools.quickstart.warmstart import train_on_sequences

    started = time.perf_counter()
    toolbox = Toolbox()
    splits, conversations, tokenizer = tool_task(seed, settings, toolbox)
    logger.info("model: a Qwen2-architecture model of about 4M parameters, from seed %d", seed)
    model = build_tiny_model(tokenizer, seed, TOOL_MODEL_SIZES)
    steps = settings.warm_start_epochs * math.ceil(
        len(conversations) / settings.warm_start_batch_size
    )
    logger.info(
        "warm start: %d epochs on %d conversations (%d steps of %d) so that the model calls "
        "the calculator, imperfectly; %s",
        settings.warm_start_epochs,
        len(conversations),
        steps,
        settings.warm_start_batch_size,
        rough_duration(warm_start_seconds(settings)),
    )
    sequences = [conversation_tokens(tokenizer, c, toolbox.schemas()) for c in conversations]
    torch.manual_seed(seed)
    stats = train_on_sequences(
        model,
        tokenizer,
        sequences,
        epochs=settings.warm_start_epochs,
        batch_size=settings.warm_start_batch_size,
        lr=settings.warm_start_lr,
        seed=seed,
    )
    eval_started = time.perf_counter()
    batches = math.ceil(len(splits.val) / GENERATION_BATCH_SIZE)
    logger.info(
        "evaluation: greedy accuracy of the warm-started model on %d held-out problems, "
        "calling the calculator (seconds)",
        len(splits.val),
    )
    with Progress("evaluation", batches, "batches") as progress:
        greedy = evaluate(model, tokenizer, splits.val, toolbox, progress=progress)
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
    multiplication.write_parquet(splits.train, "train", root / "data" / "train.parquet")
    multiplication.write_parquet(splits.val, "val", root / "data" / "val.parquet")
    manifest = {
        "version": TOOL_QUICKSTART_VERSION,
        "seed": seed,
        "settings": attrs.asdict(settings),
        "data_source": multiplication.DATA_SOURCE,
        "model": {
            "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer),
        },
        "warm_start": {
            "examples": len(sequences),
            "steps": stats.steps,
            "first_loss": stats.first_loss,
            "last_loss": stats.last_loss,
            "train_seconds": round(stats.seconds, 2),
            "val_accuracy_greedy": greedy.accuracy,
            "val_accuracy_greedy_hard": greedy.hard_accuracy,
            "val_accuracy_greedy_easy": greedy.easy_accuracy,
            "val_tool_calls_greedy": greedy.tool_calls,
            "val_tool_errors_greedy": greedy.tool_errors,
            "eval_seconds": round(eval_seconds, 2),
        },
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (root / "quickstart.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
