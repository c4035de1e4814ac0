"""Built-in metric loggers: ``console`` (one line per step) and ``jsonl`` (metrics.jsonl)."""

from __future__ import annotations

import plugrl


@plugrl.hookimpl
def register_loggers(register):
    register("console", "plugrl_plugins.loggers.console:ConsoleLogger")
    register("jsonl", "plugrl_plugins.loggers.jsonl:JsonlLogger")
