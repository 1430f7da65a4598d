"""``bench draft-cost`` runs end to end on tiny sizes (Gemma 3 270M) and its command refuses bad
values naming the option."""

from __future__ import annotations

import json

import pytest

from continuum.bench.draft_cost import DraftCostConfig, format_table, run_draft_cost


def test_every_draft_length_is_timed_and_compared_with_single_steps() -> None:
    cfg = DraftCostConfig(model="gemma3-270m", threads=2, reps=1, contexts=(32, 48), max_draft=3)
    r = run_draft_cost(cfg)
    assert [t["context"] for t in r["tables"]] == [32, 48]
    for t in r["tables"]:
        assert [row["k"] for row in t["rows"]] == [1, 2, 3]
        for row in t["rows"]:
            assert row["step_ms"] > 0 and row["verify_ms"] > 0
            assert row["cost_in_steps"] == pytest.approx(row["verify_ms"] / row["step_ms"])
            assert row["break_even"] == pytest.approx(row["cost_in_steps"] - 1)
            assert 0 <= row["same_argmax"] <= row["k"]
        one = t["rows"][0]  # one row is the same call as a decoding step: the same logits
        assert one["same_argmax"] == 1 and one["max_abs_diff"] == 0
    table = format_table(r)
    assert "gemma-3-270m" in table and "| 3 |" in table and "verify / step" in table
    json.dumps(r)
