"""The ``console`` logger: one line per step on standard error."""

from __future__ import annotations

from plugrl.api import hookimpl


@hookimpl
def register_loggers(register):
    register("console", "plugrl_console.logger:ConsoleLogger")
