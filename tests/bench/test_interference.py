"""``bench interference``: gaps are split by whether they overlap the stateless request, and a
real run of ``continuum serve`` streams sessions around a real stateless request."""

from __future__ import annotations

import pytest

from continuum.backends.models import ModelFile
from continuum.bench.interference import _gaps, _pct, interference_table, run_interference

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_gaps_overlapping_the_request_are_during() -> None:
    stamps = [0.0, 0.1, 0.2, 1.2, 1.3]
    outside, during = _gaps(stamps, 0.25, 1.0)  # only 0.2 -> 1.2 overlaps
    assert during == pytest.approx([1000.0])
    assert outside == pytest.approx([100.0, 100.0, 100.0])
    assert _pct([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0 and _pct([5.0], 0.5) == 5.0


def test_a_real_run_measures_the_sessions_around_the_request(gemma: ModelFile) -> None:
    plan = {
        "sessions": 2,
        "prompt_tokens": 600,
        "reply_tokens": 160,
        "system_tokens": 50,
        "warmup": 4,
        "n_ctx": 2048,
    }
    result = run_interference("gemma3-270m", 1, 2, plan, {"continuum": ""})
    [row] = result["rows"]
    assert row["gaps_during"] > 0 and row["p50_outside_ms"] > 0
    assert row["stateless_ms"] >= row["stateless_ttft_ms"] > 0
    assert row["ratio"] == pytest.approx(row["p99_during_ms"] / row["p50_outside_ms"], rel=0.05)
    assert gemma.path.name in interference_table(result)


def test_a_malformed_compare_is_refused_with_one_line() -> None:
    from click.testing import CliRunner

    from continuum.cli.main import main

    for bad in ("no-equals", "=exe", "continuum=x"):
        r = CliRunner().invoke(main, ["bench", "interference", "--compare", bad, "--reps", "1"])
        assert r.exit_code == 2 and "NAME=EXE" in r.output and "Traceback" not in r.output
