"""``continuum bench compaction`` on the real fast model (Gemma 3 270M, a base model: its notes
are no summaries, so only the mechanics are pinned; the bench's figures are Qwen's): both modes
move the window, only ``summary`` writes notes, and the held-out set is the one committed."""

from __future__ import annotations

import pytest

from continuum.bench.compaction import (
    conversations,
    format_table,
    report_section,
    run_compaction,
)

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_the_held_out_conversations_are_four_with_five_late_checks_each() -> None:
    convs = conversations()
    assert [c["held_out"] for c in convs] == [False, True, True, True, True]
    for c in convs[1:]:
        checks = [i for i, t in enumerate(c["turns"]) if t["expect"] is not None]
        assert len(c["turns"]) == 16 and len(checks) == 5 and checks[0] >= 8


def test_both_modes_move_the_window_and_only_summary_writes_notes() -> None:
    r = run_compaction("gemma3-270m", reps=1, high_water=256, max_tokens=16, note_tokens=32, only=2)
    rows = {(row["conversation"], row["mode"]): row for row in r["rows"]}
    assert len(rows) == 4
    for (_, mode), row in rows.items():
        assert row["window_moves"] > 0 and row["checks"] == 5
        if mode == "window":
            assert row["compactions"] == 0 and row["summary_ms"] is None
        else:
            assert row["compactions"] > 0 and row["last_note"]
            assert 0 < row["summary_generated"] <= 32
            assert row["summary_evaluated"] < 80  # the conversation was resident
    table = format_table(r)
    assert "gemma-3-270m" in table.splitlines()[0]
    assert "held-out retention, window:" in table and "held-out retention, summary:" in table
    lines: list[str] = []
    misses: list[str] = []
    report_section(lines, misses, r)
    assert "## Compaction: summarised vs windowed" in lines and "continuum bench compaction" in (
        "\n".join(lines)
    )
    slower = [m for m in misses if "a turn that compacts takes" in m]
    moved = {(x["conversation"], x["mode"]): x["ttft_moved_ms"] for x in r["rows"]}
    assert bool(slower) == any(
        moved[(c, "summary")] > moved[(c, "window")] for c, m in moved if m == "summary"
    )  # every losing mode is listed
