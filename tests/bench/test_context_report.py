"""The report's one-context section: every result file renders with its command, a missed goal
becomes a line under "where we lose", and a file it does not know is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuum.bench.context_report import report_context
from continuum.bench.report import render_report
from continuum.errors import InvalidRequest

MEMORY = {
    "experiment": "memory",
    "model": "m.gguf",
    "n_ctx_per_slot": 8192,
    "slots": 4,
    "threads": 2,
    "reps": 3,
    "rows": [
        {"mode": "continuum", "rss_mb": 950, "peak_mb": 950, "runs": []},
        {"mode": "llama-server", "rss_mb": 469, "peak_mb": 469, "runs": []},
        {"mode": "llama-server-swa-full", "rss_mb": 891, "peak_mb": 891, "runs": []},
    ],
}
ROW = {
    "p50_outside_ms": 70.0,
    "p99_during_ms": 224.0,
    "max_during_ms": 4878.0,
    "ratio": 3.2,
    "stateless_ttft_ms": 36978.0,
    "stateless_ms": 37546.0,
}
INTERFERENCE = {
    "experiment": "interference",
    "model": "m.gguf",
    "threads": 2,
    "reps": 2,
    "sessions": 3,
    "prompt_tokens": 2000,
    "reply_tokens": 800,
    "system_tokens": 300,
    "warmup": 8,
    "n_ctx": 8192,
    "rows": [{"mode": "continuum", **ROW}, {"mode": "before", **ROW, "ratio": 273.4}],
}
SHARED = {
    "experiment": "shared_prefix",
    "model": "m.gguf",
    "threads": 2,
    "reps": 1,
    "lanes": 4,
    "sessions": 2,
    "system_tokens": 4000,
    "max_tokens": 8,
    "n_ctx": 8192,
    "prompt_tokens": 4100,
    "cold": {"decoded": 4130, "ttft_ms": 30000.0},
    "rows": [
        {"session": 1, "decoded": 4130, "ttft_ms": 31000.0},
        {"session": 2, "decoded": 30, "ttft_ms": 900.0},
    ],
}


def _write(tmp: Path, **files: dict[str, object]) -> Path:
    for name, data in files.items():
        (tmp / f"{name}.json").write_text(json.dumps(data))
    return tmp


def test_each_result_renders_and_every_missed_goal_is_listed(tmp_path: Path) -> None:
    results = _write(tmp_path, memory=MEMORY, interference=INTERFERENCE, shared_prefix=SHARED)
    lines: list[str] = []
    misses: list[str] = []
    report_context(lines, misses, results)
    text = "\n".join(lines)
    assert "## One context" in text and "--compare before=" in text
    assert "continuum bench memory -m m.gguf" in text and "| 2 | 30 |" in text
    assert len(misses) == 2  # memory 2.03x; interference 3.2x; the shared prefix met its goal
    assert "2.03x llama-server's 469 MB" in misses[0] and "1.07x its --swa-full" in misses[0]
    assert "3.20x their p50" in misses[1]
    assert "## One context" in render_report(results)


def test_a_met_goal_is_no_miss_and_an_unknown_file_is_refused(tmp_path: Path) -> None:
    fine = {**INTERFERENCE, "rows": [{"mode": "continuum", **ROW, "ratio": 1.2}]}
    lines: list[str] = []
    misses: list[str] = []
    report_context(lines, misses, _write(tmp_path, interference=fine))
    assert misses == []
    (tmp_path / "memory-x.json").write_text(json.dumps({"experiment": "eva"}))
    with pytest.raises(InvalidRequest, match=r"memory-x\.json"):
        report_context([], [], tmp_path)
