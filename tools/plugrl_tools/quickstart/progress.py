"""Progress of the quickstart's build phases, shown as the training loop shows its steps: a bar
on a terminal, otherwise a line after the first unit, every tenth of the phase and at least
every half minute, so that a build under load is never minutes of silence."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

logger = logging.getLogger("plugrl_tools.quickstart")

LINES_PER_PHASE = 10
"""Progress lines of a phase away from a terminal (and one at its end)."""

LINE_EVERY_S = 30.0
"""The longest silence between two progress lines away from a terminal: under load a tenth of
a phase can take minutes."""


class Progress:
    """``done`` of ``total`` units of one phase: a tqdm bar when ``stream`` is a terminal,
    otherwise a line on the quickstart's logger after the first unit (the first estimate of
    the time left), every ``total // LINES_PER_PHASE`` units, after any unit that ends
    :data:`LINE_EVERY_S` seconds without a line, and at the last one, with the elapsed and
    the estimated remaining seconds and the figures given to :meth:`update` (``loss=0.41``)."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.clock = clock
        self.total = max(1, total)
        self.unit = unit
        self.done = 0
        self.started = clock()
        self.last_line = self.started
        self.every = max(1, self.total // LINES_PER_PHASE)
        stream = stream if stream is not None else sys.stderr
        self._bar: Any = None
        if stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, desc=what, unit=unit, file=stream, dynamic_ncols=True
            )

    def update(self, count: int = 1, **figures: float) -> None:
        self.done = min(self.total, self.done + count)
        if self._bar is not None:
            self._bar.update(count)
            if figures:
                self._bar.set_postfix({k: f"{v:.3f}" for k, v in figures.items()}, refresh=False)
            return
        now = self.clock()
        due = (
            self.done == 1
            or self.done % self.every == 0
            or self.done == self.total
            or now - self.last_line >= LINE_EVERY_S
        )
        if not due:
            return
        self.last_line = now
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done)
        shown = "".join(f", {name} {value:.3f}" for name, value in figures.items())
        logger.info(
            "%s: %d/%d %s%s (%.0f s, about %.0f s left)",
            self.what,
            self.done,
            self.total,
            self.unit,
            shown,
            elapsed,
            left,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
