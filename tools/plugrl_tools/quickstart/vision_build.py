"""Build the vision quickstart: tokenizer with the vision tokens, a warm-started tiny
Qwen2.5-VL-architecture model that miscounts many shapes, and the counting task's pictures in
verl's multimodal parquet layout."""

from __future__ import annotations

import collections
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import attrs

from plugrl.data.hf_loading import quiet_hf_loading
from plugrl_tools.quickstart import counting

logger = logging.getLogger("plugrl_tools.quickstart")

VISION_QUICKSTART_VERSION = "vision-2"

DEFAULT_VISION_DIR = Path("runs") / "quickstart-vision-assets"


@attrs.frozen
class VisionQuickstartSettings:
    """The counting task's size and imperfection, the model's size and the warm start's
    length."""

    num_warm_start: int = 800
    num_train: int = 2048
    num_val: int = 256
    many_fraction: float = 0.7
    miscount_probability: float = 0.65
    warm_start_epochs: int = 8
    warm_start_batch_size: int = 32
    warm_start_lr: float = 3e-3
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    vision_hidden_size: int = 32
    vision_depth: int = 2
    weight_std: float | None = 0.1
    max_prompt_length: int = 40
    max_response_length: int = 8


def tokenizer_texts() -> list[str]:
    """What the tokenizer is trained on: the question and every answer, so each is a few whole
    tokens."""
    question = counting.QUESTION.replace("<image>", "")
    answers = [counting.answer_text(n) for n in range(1, counting.MAX_SHAPES + 1)]
    return [question, *answers] * 4


def vision_language_model_sizes(
    settings: VisionQuickstartSettings = VisionQuickstartSettings(),
) -> dict[str, Any]:
    """The language model's sizes in a Qwen2 config's keys, the vocabulary the tokenizer's
    (built here in milliseconds): what ``plugrl plan`` sizes before the model is built."""
    from plugrl_qwen2_vl.tiny import make_tiny_vl_tokenizer

    return {
        "hidden_size": settings.hidden_size,
        "intermediate_size": settings.intermediate_size,
        "num_hidden_layers": settings.num_hidden_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "vocab_size": len(make_tiny_vl_tokenizer(tokenizer_texts())),
    }


def count_accuracy(scenes: list[counting.Scene], responses: list[str]) -> dict[str, float]:
    """Greedy accuracy over all pictures, over those of many shapes and those of few."""
    from plugrl.rewards.answers import parse_answer

    right: dict[str, list[bool]] = collections.defaultdict(list)
    for scene, response in zip(scenes, responses, strict=True):
        correct = parse_answer(response) == scene.count
        right["all"].append(correct)
        right["many" if scene.many else "few"].append(correct)
    return {name: sum(values) / len(values) for name, values in right.items()}


def build_vision_into(
    root: Path, seed: int, settings: VisionQuickstartSettings = VisionQuickstartSettings()
) -> dict[str, Any]:
    """Build the vision quickstart in ``root`` (an empty folder) and return its manifest."""
    import torch

    from plugrl_qwen2_vl.family import IMAGE_TEXT, assemble_processor
    from plugrl_qwen2_vl.tiny import (
        make_tiny_image_processor,
        make_tiny_vl_model,
        make_tiny_vl_tokenizer,
    )
    from plugrl_tools.quickstart.build import rough_duration, warm_start_seconds
    from plugrl_tools.quickstart.progress import Progress
    from plugrl_tools.quickstart.vision_warmstart import (
        GENERATION_BATCH_SIZE,
        encode_prompts,
        generate_responses,
        supervised_fine_tune,
    )

    started = time.perf_counter()
    logger.info(
        "pictures: drawing %d warm-start, %d training and %d validation pictures of 1 to %d "
        "shapes, from seed %d",
        settings.num_warm_start,
        settings.num_train,
        settings.num_val,
        counting.MAX_SHAPES,
        seed,
    )
    splits = counting.make_splits(
        seed,
        num_warm_start=settings.num_warm_start,
        num_train=settings.num_train,
        num_val=settings.num_val,
        many_fraction=settings.many_fraction,
    )
    examples = counting.warm_start_examples(
        splits.warm_start, seed, miscount_probability=settings.miscount_probability
    )
    tokenizer = make_tiny_vl_tokenizer(tokenizer_texts())
    model_dir = root / "model"
    # the processor is assembled from the saved tokenizer and image processor, as a run does
    # where AutoProcessor cannot load (no torchvision)
    tokenizer.save_pretrained(model_dir)
    make_tiny_image_processor().save_pretrained(model_dir)
    processor = assemble_processor(str(model_dir), "qwen2_5_vl", tokenizer)
    model = make_tiny_vl_model(
        tokenizer,
        seed=seed,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_hidden_layers,
        vision_hidden_size=settings.vision_hidden_size,
        vision_depth=settings.vision_depth,
        weight_std=settings.weight_std,
    )
    num_parameters = sum(p.numel() for p in model.parameters())
    logger.info(
        "model: a Qwen2.5-VL-architecture model of %dk parameters, from seed %d",
        round(num_parameters / 1000),
        seed,
    )
    warm_prompts = encode_prompts(processor, IMAGE_TEXT, [scene for scene, _ in examples])
    val_prompts = encode_prompts(processor, IMAGE_TEXT, splits.val)
    steps = settings.warm_start_epochs * math.ceil(len(examples) / settings.warm_start_batch_size)
    logger.info(
        "warm start: %d epochs of supervised training on %d pictures (%d steps of %d) so that "
        "the model reads the picture and writes the answer format; %s",
        settings.warm_start_epochs,
        len(examples),
        steps,
        settings.warm_start_batch_size,
        rough_duration(warm_start_seconds(settings)),
    )
    torch.manual_seed(seed)
    stats = supervised_fine_tune(
        model,
        tokenizer,
        warm_prompts,
        [response for _, response in examples],
        epochs=settings.warm_start_epochs,
        batch_size=settings.warm_start_batch_size,
        lr=settings.warm_start_lr,
        seed=seed,
    )
    eval_started = time.perf_counter()
    logger.info(
        "evaluation: greedy accuracy of the warm-started model on %d held-out pictures (seconds)",
        len(splits.val),
    )
    batches = math.ceil(len(val_prompts) / GENERATION_BATCH_SIZE)
    with Progress("evaluation", batches, "batches") as progress:
        responses = generate_responses(
            model,
            tokenizer,
            val_prompts,
            max_new_tokens=settings.max_response_length,
            progress=progress,
        )
    greedy = count_accuracy(splits.val, responses)
    eval_seconds = time.perf_counter() - eval_started
    logger.info(
        "data: writing the model and %d training and %d validation pictures (verl's multimodal "
        "parquet layout, each picture also as a PNG file)",
        len(splits.train),
        len(splits.val),
    )
    with quiet_hf_loading():
        model.save_pretrained(model_dir)
    data_dir = root / "data"
    counting.write_split(splits.train, "train", data_dir)
    counting.write_split(splits.val, "val", data_dir)
    manifest = {
        "version": VISION_QUICKSTART_VERSION,
        "seed": seed,
        "settings": attrs.asdict(settings),
        "data_source": counting.DATA_SOURCE,
        "model": {"parameters": num_parameters, "vocab_size": len(tokenizer)},
        "warm_start": {
            "examples": len(examples),
            "steps": stats.steps,
            "first_loss": stats.first_loss,
            "last_loss": stats.last_loss,
            "train_seconds": round(stats.seconds, 2),
            "val_accuracy_greedy": greedy["all"],
            "val_accuracy_greedy_many": greedy.get("many", math.nan),
            "val_accuracy_greedy_few": greedy.get("few", math.nan),
            "eval_seconds": round(eval_seconds, 2),
        },
        "build_seconds": round(time.perf_counter() - started, 2),
    }
    (root / "quickstart.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
