"""How much of vLLM's own output a run shows (``rollout.engine_log_level``).

vLLM logs its start-up, every engine step's statistics and every weight reload at INFO, and its
engine-core processes (and a Ray worker's root logger) show all of it: hundreds of lines a run,
among them a warning at every weight push that the rotary embedding got no weights (it has
none to get). Unless asked, the engine shows vLLM's warnings and errors only, and leaves out
the few lines of start-up that say nothing to a plugrl user (each named below). Nothing here
imports vLLM.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
QUIET = "warning"
VERBOSE = "info"
LEVEL_VARIABLE = "VLLM_LOGGING_LEVEL"

# vLLM's warning after a weight reload, for a layer that got none of the pushed weights
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
RELOAD_MISSED = "%s: Failed to load weights"

# vLLM's warning at the first request that names a LoRA adapter, about adapters that bring
# tokenizers of their own (plugrl's adapters never do)
LORA_TOKENIZER_LOGGER = "vllm.v1.engine.input_processor"
LORA_TOKENIZER_NOTICE = "vLLM has deprecated support for supporting different tokenizers"


def engine_log_level(configured: str | None) -> str:
    """The level of vLLM's logging for a run: ``rollout.engine_log_level`` when set, else
    ``VLLM_LOGGING_LEVEL`` when the user set it, else ``info`` when plugrl itself logs at
    debug level (``plugrl -v``), else ``warning``."""
    if configured is not None:
        return configured
    chosen = os.environ.get(LEVEL_VARIABLE, "").lower()
    if chosen in LEVELS:
        return chosen
    return VERBOSE if logging.getLogger("plugrl").isEnabledFor(logging.DEBUG) else QUIET


def apply_engine_log_level(level: str) -> None:
    """vLLM's logging at ``level`` in this process and in the engine processes it starts
    (through ``VLLM_LOGGING_LEVEL``, read when vLLM configures its logging); when quieter
    than info, also the start-up lines that say nothing to a plugrl user:

    * ``torch.distributed.reduce_op`` FutureWarnings raised where vLLM's Triton dispatcher
      looks through torch's modules;
    * torch's "Triton not available" warning, which the same scan triggers on machines
      without Triton (every CPU);
    * the warning at the first request with a LoRA adapter (``rollout.lora_sync=adapters``)
      that adapters with tokenizers of their own are deprecated: plugrl's adapters have none.
    """
    numeric = getattr(logging, level.upper())
    os.environ[LEVEL_VARIABLE] = level.upper()
    logging.getLogger("vllm").setLevel(numeric)
    for handler in logging.getLogger("vllm").handlers:
        handler.setLevel(numeric)
    if numeric <= logging.INFO:
        return
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.reduce_op` is deprecated",
        category=FutureWarning,
        module=r"vllm\.",
    )
    logging.getLogger("torch._library.triton").setLevel(logging.ERROR)
    notices = logging.getLogger(LORA_TOKENIZER_LOGGER)
    if not any(isinstance(f, LoraTokenizerNotice) for f in notices.filters):
        notices.addFilter(LoraTokenizerNotice())


class LoraTokenizerNotice(logging.Filter):
    """Drops vLLM's notice that LoRA adapters with tokenizers of their own are deprecated."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LORA_TOKENIZER_NOTICE)


class RotaryReloadNotice(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for rotary embeddings after a weight
    reload: their cos/sin tables are computed from the model's config, never part of pushed
    weights, and vLLM keeps them as they are. The same warning for any other layer (a weight
    that did not arrive) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        args: Any = record.args
        return not (
            record.msg == RELOAD_MISSED
            and isinstance(args, tuple)
            and len(args) == 1
            and str(args[0]).endswith("RotaryEmbedding")
        )


def hide_rotary_reload_notice() -> None:
    """Install :class:`RotaryReloadNotice` on vLLM's reload logger, once per process (the
    process that reloads weights: vLLM's worker)."""
    reload_logger = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, RotaryReloadNotice) for f in reload_logger.filters):
        reload_logger.addFilter(RotaryReloadNotice())
