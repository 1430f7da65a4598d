"""``bench speculative`` runs end to end on tiny sizes (Gemma 3 270M), and its command refuses
bad values naming the option
(tests/cli/test_bench_options.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from continuum.bench.speculative import SpeculativeConfig, format_table, run_speculative


@pytest.mark.slow  # 9 s alone: the full run's (pyproject's markers)
def test_each_task_is_timed_with_and_without_drafts() -> None:
    cfg = SpeculativeConfig(
        model="gemma3-270m", threads=2, reps=2, tasks=("json", "prose"), max_tokens=24
    )
    r = run_speculative(cfg)
    assert [row["task"] for row in r["rows"]] == ["json", "prose"]
    for row in r["rows"]:
        assert row["plain_tok_s"] > 0 and row["draft_tok_s"] > 0
        assert row["speedup"] == pytest.approx(row["draft_tok_s"] / row["plain_tok_s"])
        assert row["same_tokens"] == row["runs"] == 2  # greedy: drafting changes no token
        assert 0 <= row["accepted_share"] <= 1
    table = format_table(r)
    assert "gemma-3-270m" in table and "| json |" in table and "drafting tok/s" in table
    json.dumps(r)


def test_an_unknown_task_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="tasks must be among edit-file"):
        SpeculativeConfig(tasks=("poetry",))
