"""Progress as lines: a line when a step starts, at most one every few seconds while it runs,
and one when it ends; counts in MB once they are bytes of files."""

from __future__ import annotations

import io

from continuum.backends.progress import LineProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_at_the_start_every_few_seconds_and_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, every_s=5.0, clock=clock)
    total = 400 << 20
    for step in range(1, 41):  # 40 blocks of 10 MB, 0.5 s apart: 20 s in all
        clock.now += 0.5
        progress("assembling m.gguf", step * (10 << 20), total)
    lines = out.getvalue().splitlines()
    assert lines[0] == "assembling m.gguf: 2% (10 of 400 MB, 0 s)"
    assert lines[-1] == "assembling m.gguf: 100% (400 of 400 MB, 20 s)"
    assert len(lines) == 5  # at 0, 5, 10, 15 s and the end: never one per block


def test_a_new_step_always_gets_its_line_and_uncounted_steps_read_plainly() -> None:
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, clock=clock)
    progress("restore at 1024 tokens", 0, 0)
    progress("restore at 1024 tokens", 0, 0)  # the same step, no time passed: no line
    progress("restore at 2048 tokens", 0, 0)
    clock.now += 6
    progress("turns", 3, 0)
    progress("prompts", 7, 12)
    assert out.getvalue().splitlines() == [
        "restore at 1024 tokens (0 s)",
        "restore at 2048 tokens (0 s)",
        "turns: 3 (0 s)",
        "prompts: 58% (7 of 12, 0 s)",
    ]
