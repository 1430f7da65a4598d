"""Progress as lines: what a log file or a CI console shows while a long step runs.

A terminal gets a live bar from the CLI; everything else (``continuum serve`` under a process
manager, a benchmark piped to a file, CI) gets :class:`LineProgress`: one line when a step
starts, one every few seconds while it runs, and one when it ends. Model assembly uses it when
its caller gives no progress of its own, so a fresh machine's first minute is never silent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO

Progress = Callable[[str, int, int], None]  # (what, done, total); total 0: not counted


class LineProgress:
    """A :data:`Progress` callback that writes a line to ``stream`` (stderr when None) when
    ``what`` changes, at most every ``every_s`` seconds while it stays, and when done reaches
    total. Byte counts over a megabyte are shown in MB."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.every_s = every_s
        self.clock = clock
        self._what = ""
        self._started = self._last = 0.0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = self.clock()
        if what != self._what:
            self._what, self._started = what, now
        elif now - self._last < self.every_s and not (total and done >= total):
            return
        self._last = now
        elapsed = f"{now - self._started:.0f} s"
        if not total:
            line = f"{what} ({elapsed})" if done == 0 else f"{what}: {done:,} ({elapsed})"
        else:
            line = f"{what}: {100 * done // total}% ({_amount(done, total)}, {elapsed})"
        print(line, file=self.stream or sys.stderr, flush=True)


def _amount(done: int, total: int) -> str:
    if total >= 1 << 20:
        return f"{done / (1 << 20):,.0f} of {total / (1 << 20):,.0f} MB"
    return f"{done:,} of {total:,}"


__all__ = ["LineProgress", "Progress"]
