"""The samples dump (``trainer.rollout_data_dir``, ``trainer.validation_data_dir``): every
scored response of a training step or a validation as one JSON line, for reading what the
policy wrote and what the reward said of it.

A line holds ``prompt``, ``response`` (texts, special tokens skipped; ``prompt`` is what the
model was given, so for an agent loop's sample the prompt its loop rendered: an environment's
opening messages, the row's prompt with the tools' schemas; a multi-turn response includes the
tool results and observations appended between its turns), ``score`` (the
response's total reward score), ``ground_truth``, ``data_source``, ``step``, for a sample of
an agent loop ``num_turns``, ``finish_reason`` and ``turns`` (the conversation's messages, one
per turn: the model's, the tools', the environment's), and every extra column of the reward
output (``acc``, a judge's text, each component's ``<name>_score``...).
Values are made JSON-safe: tensors and NumPy values become numbers and lists, NaN and the
infinities ``null``, anything else unknown its ``str``.

A file is written whole to a temporary name beside it and then renamed, so a run killed while
writing leaves the previous file or the new one, never part of one.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

FIRST_COLUMNS = ("prompt", "response", "score", "ground_truth", "data_source", "step")
AGENT_COLUMNS = ("num_turns", "finish_reason", "turns")
"""What a line of an agent loop's sample adds, when its batch has the conversation."""
"""What every line holds, before the reward's extra columns (which cannot replace them)."""


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data: tensors and NumPy values through ``tolist()``, NaN and
    infinities as ``None``, mappings with string keys, tuples and sets as lists."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item) for item in value]
    if hasattr(value, "tolist"):  # torch tensors, NumPy arrays and scalars
        return json_safe(value.tolist())
    return str(value)


def prompt_text(tokenizer: Any, batch: Any, row: int) -> str:
    """The prompt the model was given for ``row`` of ``batch`` (a batch in the rollout layout),
    decoded with special tokens skipped: its ``prompts`` less the left padding. An agent
    loop's prompt is the one it rendered (an environment's opening messages), which may differ
    from the dataset row's ``raw_prompt_ids``."""
    if "prompts" in batch and "prompt_attention_mask" in batch:
        ids = batch["prompts"][row][batch["prompt_attention_mask"][row].bool()].tolist()
    else:
        ids = list(batch["raw_prompt_ids"][row])
    return tokenizer.decode(ids, skip_special_tokens=True)


def sample_rows(
    tokenizer: Any,
    batch: Any,
    scores: Sequence[float],
    extra: Mapping[str, Sequence[Any]],
    step: int,
) -> list[dict[str, Any]]:
    """One JSON-safe row per response of ``batch`` (a batch in the rollout layout:
    ``prompts`` and ``prompt_attention_mask`` (or ``raw_prompt_ids``), ``responses``,
    ``response_mask``, ``data_source``, ``ground_truth``)."""
    from plugrl.data.batch import response_attention_mask

    response_mask = response_attention_mask(batch)
    rows = []
    for row in range(len(batch)):
        mask = response_mask[row].bool()
        line: dict[str, Any] = {
            "prompt": prompt_text(tokenizer, batch, row),
            "response": tokenizer.decode(
                batch["responses"][row][mask].tolist(), skip_special_tokens=True
            ),
            "score": scores[row],
            "ground_truth": batch["ground_truth"][row],
            "data_source": batch["data_source"][row],
            "step": step,
        }
        if "messages" in batch and batch["messages"][row]:
            line["num_turns"] = batch["num_turns"][row]
            line["finish_reason"] = batch["finish_reason"][row]
            line["turns"] = batch["messages"][row]
        for name, column in extra.items():
            if name not in FIRST_COLUMNS and name not in AGENT_COLUMNS:
                line[name] = column[row]
        rows.append(json_safe(line))
    return rows


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Write ``rows`` to ``path``, one JSON object a line, replacing the file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
