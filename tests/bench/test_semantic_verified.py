"""``bench semantic-verified`` end to end on a few pairs of the second held-out set and one group
of the groups set, on the real default model and embedder: the judge table, the verified streams,
the answer and margin cache, the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuum.bench.semantic_verified import MARGINS, VerifiedConfig, run_verified
from continuum.bench.semantic_verified_report import format_table, report_section

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_a_small_run_judges_streams_caches_and_reports(tmp_path: Path) -> None:
    cache = tmp_path / "answers.json"
    cfg = VerifiedConfig(
        judges=("qwen2.5-coder-0.5b:intent",),
        sets=("second", "groups"),
        limit=12,
        delta=0.5,
        answer_tokens=16,
        answers=str(cache),
        threads=2,
        reps=1,
        cold=1,
    )
    result = run_verified(cfg)
    table = result["tables"]["second"]["qwen2.5-coder-0.5b:intent"]
    assert [r["margin"] for r in table["sweep"]] == list(MARGINS)
    hits = [r["paraphrase_hit"] for r in table["sweep"]]
    assert hits == sorted(hits, reverse=True)  # a higher margin never accepts more
    assert table["judged"] >= 1 and table["ms_p50"] is not None and table["ms_p50"] > 0
    stream = result["stream"]
    if "skipped" not in stream:  # the small set's table allowed a margin within delta
        r = stream["sets"]["second"]
        assert r["stream"] == 12 and r["warm_up"] == 6
        assert sum(r["third_wording"].values()) == 12
        verified = r["tier"]["verified"]
        assert verified["pending"] == 0 and verified["delta"] == 0.5
        judged = verified.get("promoted", 0) + verified.get("rejected_judge", 0)
        assert verified["proposed"] >= 1 and verified["observations"] == judged
        g = stream["groups"]  # one group: 22 lines, the second half measured
        assert (g["stream"], g["warm_up"], g["measured"]) == (22, 11, 11)
        assert g["served_right"] + g["served_wrong"] <= g["measured"] and g["repeats"] >= 1
        verified = g["tier"]["verified"]
        judged = verified.get("promoted", 0) + verified.get("rejected_judge", 0)
        assert verified["pending"] == 0 and verified["observations"] == judged >= 1
        assert verified["groups_observed"] >= 1
        j = g["judged"]  # each judged pair counted once, by its truth
        assert j["same_pairs"] + j["other_pairs"] == verified["observations"]
        accepted = [r["same_accepted"] for r in j["sweep"]]
        assert accepted == sorted(accepted, reverse=True)
    saved = json.loads(cache.read_text())
    assert len(saved) == 2  # the answers and the judge's margins
    again = run_verified(cfg)  # read back: no answer generated, margins from the cache
    timed = again["tables"]["second"]["qwen2.5-coder-0.5b:intent"]["ms_p50"]
    assert timed is not None and timed > 0  # the judge timed on a sample all the same
    assert again["tables"] == result["tables"] | {
        "second": {
            "qwen2.5-coder-0.5b:intent": table | {"ms_p50": timed, "failed": {}},
        }
    }
    if "skipped" not in stream:  # the groups stream's judgments were cached: the same stream
        drop = {"tier"}  # (its timings)
        g, g2 = stream["groups"], again["stream"]["groups"]
        assert {k: v for k, v in g.items() if k not in drop} == {
            k: v for k, v in g2.items() if k not in drop
        }
    text = format_table(result)
    assert "second set" in text and "qwen2.5-coder-0.5b:intent" in text
    assert "skipped" in text or "groups (each line once" in text
    lines: list[str] = []
    misses: list[str] = []
    report_section(lines, misses, result)
    assert any("semantic-verified --judges qwen2.5-coder-0.5b:intent" in ln for ln in lines)
    assert misses  # 12 pairs cannot meet the goal: the page says so
