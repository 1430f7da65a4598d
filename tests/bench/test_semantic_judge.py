"""The judge's part of ``bench semantic`` on the real default model, on a few labelled pairs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from continuum.bench.semantic_judge import (
    cold_answer_ms,
    format_judge,
    judge_pairs,
    judge_sweep,
    report_judge,
)
from continuum.tiers.verifier import JudgeVerifier
from tests.conftest import model

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeVerifier]:
    j = JudgeVerifier.open(model("qwen2.5-coder-0.5b"), threads=2)
    yield j
    j.close()


def _pair(a: str, b: str, label: str, cosine: float, guard: str | None = None) -> dict[str, object]:
    return {"a": a, "b": b, "label": label, "kind": label, "cosine": cosine, "guard": guard}


def test_only_pairs_at_the_threshold_are_judged_and_the_sweep_counts_them(
    judge: JudgeVerifier,
) -> None:
    pairs = [
        _pair("Explain what Kubernetes is.", "Can you tell me what Kubernetes is?", "same", 0.9),
        _pair(
            "How do I convert dollars to euros?",
            "How do I convert euros to dollars?",
            "different",
            0.95,
        ),
        _pair(
            "Suggest a good name for a pet dog.",
            "Suggest a bad name for a pet dog.",
            "different",
            0.9,
            guard="substitution",
        ),
        _pair("What is Rust?", "What is Go?", "different", 0.5),  # below: never judged
        _pair("フランスの首都は?", "フランスの首都はどこ?", "same", 0.9),  # never judged
    ]
    judged, ms = judge_pairs(judge, pairs, threshold=0.8)
    assert len(ms) == 3 and [p["verdict"] for p in judged][3:] == ["not_judged"] * 2
    assert judged[0]["verdict"] == "" and judged[1]["verdict"] == "judge"
    row = next(r for r in judge_sweep(judged) if r["margin"] == judge.threshold)
    assert row["paraphrase_hit_judge"] == 0.5 and row["false_hits_guard+judge"] == 0
    assert row["false_hits_judge"] == 0  # the judge says no to both edits
    cold = cold_answer_ms(judge.backend, ["Explain what Kubernetes is."])
    assert len(cold) == 1 and cold[0] > 0
    result = {
        "identity": judge.identity,
        "model": judge.backend.model.name,
        "threads": 2,
        "default_margin": judge.threshold,
        "judge_ms_p50": ms[0],
        "judge_ms_p99": ms[-1],
        "cold_answer_ms_p50": cold[0],
        "cold_max_tokens": 256,
        "judge_share_of_cold_answer": ms[0] / cold[0],
        "sets": {"independent": {"judged": 3, "sweep": judge_sweep(judged), "default": row}},
    }
    assert "<- default" in "\n".join(format_judge(result))
    lines: list[str] = []
    misses: list[str] = []
    report_judge(lines, misses, result, 0.8)
    assert any("| independent | 3 | 0.2 (default) |" in ln for ln in lines)
    # 1 of 2 paraphrases and no false hit meet the goal; the latency goal is checked apart
    assert not any(m.startswith("semantic with the judge") for m in misses)
    late = result["judge_share_of_cold_answer"] > 0.05
    assert any(m.startswith("semantic judge latency") for m in misses) == late
