"""The ``jsonl`` logger: every step's metrics as one JSON line in ``metrics.jsonl``."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register("jsonl", "plugrl_jsonl.logger:JsonlLogger")
