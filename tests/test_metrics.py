"""``Metrics``: one vocabulary for every request, and how it is shown (``to_dict``)."""

from __future__ import annotations

import dataclasses

import pytest

from continuum.metrics import Metrics, Reset, ResetReason, TierOutcome


def test_a_stateless_request_shows_only_what_it_measured() -> None:
    m = Metrics(hit_tier="cold", prompt_tokens=40, prompt_tokens_evaluated=40, backend_called=True)
    d = m.to_dict()
    # a stateless request keeps no sequence: no context figures, no client bytes, no prefill
    assert not {"context_used", "context_limit", "high_water", "wire_chars", "prefill_ms"} & set(d)
    assert d["prompt_tokens"] == d["prompt_tokens_evaluated"] == 40 and d["tokens_reused"] == 0
    assert "compaction" not in d and d["resets"] == [] and d["tiers"] == []


def test_a_turn_shows_its_context_resets_and_tiers() -> None:
    reset = Reset(ResetReason.HIGH_WATER, "moved", tokens_dropped=10, tokens_rebuilt=4)
    m = Metrics(
        hit_tier="prefix_kv",
        prompt_tokens=50,
        prompt_tokens_evaluated=8,
        tokens_reused=42,
        prefill_ms=3.5,
        context_used=60,
        context_limit=4096,
        high_water=3500,
        wire_chars=12,
        resets=(reset,),
        tiers=(TierOutcome("memo", "miss"), TierOutcome("prefix_kv", "hit", tokens=42)),
    )
    d = m.to_dict()
    assert d["context_used"] == 60 and d["prefill_ms"] == 3.5 and d["wire_chars"] == 12
    assert d["resets"] == [reset.to_dict()] and d["resets"][0]["reason"] == "high_water"
    assert d["tiers"] == [
        {"tier": "memo", "outcome": "miss"},
        {"tier": "prefix_kv", "outcome": "hit", "tokens": 42},
    ]
    assert m.outcome_of("prefix_kv") == "hit" and m.outcome_of("semantic") == ""
    assert m.tier("layer_kv") is None


def test_an_unknown_reuse_is_shown_as_unknown_never_as_zero() -> None:
    m = Metrics(prompt_tokens=30, prompt_tokens_evaluated=30, reuse_known=False)
    assert m.to_dict()["tokens_reused"] == "unknown"


def test_metrics_are_frozen_and_named() -> None:
    m = Metrics(prompt_tokens=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.prompt_tokens = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Metrics("cold", 3)  # type: ignore[misc]  # keyword-only: no positional records
