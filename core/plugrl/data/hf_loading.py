"""Loading and saving Hugging Face models without transformers' progress bars and the warnings
known to be harmless.

transformers draws a "Loading weights" bar for every ``from_pretrained`` and a "Writing model
shards" bar for every ``save_pretrained``; a run loads and writes models in every worker, so
those bars, and peft asking transformers 5 for an attribute it renamed, reach every user at
every start. Inside :func:`quiet_hf_loading` they do not; transformers' own warnings and errors
(weights missing from a folder, say) still show.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

HARMLESS_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    # peft's get_peft_model reads PreTrainedModel.is_gradient_checkpointing, which
    # transformers 5 renamed (is_activation_checkpointing); the value is the same
    ("`is_gradient_checkpointing` is deprecated", FutureWarning),
)
"""(start of the message, category) of warnings a load prints that say nothing to a user."""

_lock = threading.Lock()
_depth = 0
_bars_were_enabled = True


@contextmanager
def quiet_hf_loading() -> Iterator[None]:
    """Within: no transformers progress bars and none of :data:`HARMLESS_WARNINGS`. Nested and
    concurrent uses (engines loading in threads) turn the bars back on only when the last one
    ends, and only if they were on before the first."""
    global _depth, _bars_were_enabled
    from transformers.utils import logging as hf_logging

    with _lock:
        if _depth == 0:
            _bars_were_enabled = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        _depth += 1
    try:
        with warnings.catch_warnings():
            for message, category in HARMLESS_WARNINGS:
                warnings.filterwarnings("ignore", message=message, category=category)
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _bars_were_enabled:
                hf_logging.enable_progress_bar()
