"""The semantic tier's judge on the real default model (Qwen2.5-Coder-0.5B-Instruct): what it
accepts, what it rejects, and that it fails closed — out of time, too long, bad text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from continuum import GenerationParams, InvalidRequest, ModelFileError, ReusePolicy, resolve_model
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.keys import OpKey
from continuum.tiers.base import TierRequest, TierResult
from continuum.tiers.features import Guard
from continuum.tiers.semantic import SemanticTier
from continuum.tiers.verifier import JudgeVerifier
from tests.conftest import model

PARAMS = GenerationParams(max_tokens=8)


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeVerifier]:
    # what it judges must not depend on how busy the machine is: the time budget (2 s by
    # default) gets room here, and running out of it has a test of its own
    j = JudgeVerifier.open(model("qwen2.5-coder-0.5b"), threads=2, timeout_s=60.0)
    yield j
    j.close()


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def _between(judge: JudgeVerifier) -> list[int]:
    return judge.backend.seq_tokens(0)


@pytest.mark.slow
def test_a_paraphrase_is_accepted_and_a_counterfactual_edit_is_not(judge: JudgeVerifier) -> None:
    head = _between(judge)
    same = judge.verify("Can you tell me what Kubernetes is?", "Explain what Kubernetes is.")
    assert same.accepted and same.reason == "" and same.margin is not None
    assert same.margin >= judge.threshold and same.ms > 0
    for a, b in [
        ("How do I convert euros to dollars?", "How do I convert dollars to euros?"),
        ("How do I delete a local git branch?", "How do I delete a remote git branch?"),
        ("Is it safe to turn the router off?", "Is it safe to turn the router on?"),
    ]:
        v = judge.verify(a, b)
        assert not v.accepted and v.reason == "judge" and v.margin is not None
        assert v.margin < judge.threshold
    assert _between(judge) == head  # only the instruction stays resident between judgments


@pytest.mark.slow
def test_the_judge_fails_closed(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder
) -> None:
    """Out of time (llama.cpp is stopped mid-decode), too long, text that is not text, empty:
    each a rejection with its reason, and the judge still works afterwards."""
    head = _between(judge)
    quick = JudgeVerifier(judge.backend.sibling(judge.backend.config), timeout_s=1e-6)
    try:
        late = quick.verify("Can you tell me what Kubernetes is?", "Explain what Kubernetes is.")
        assert not late.accepted and late.reason == "timeout" and late.margin is None
        assert quick.backend.seq_tokens(0) == _between(quick)
        tier = SemanticTier(embedder, verifier=quick)  # in the tier: a miss, never a hit
        stored = _ask("Explain what Kubernetes is.")
        tier.lookup(stored)
        tier.record(stored, TierResult("An orchestrator.", (1,), "stop", 3))
        timed_out = tier.lookup(_ask("Can you tell me what Kubernetes is?")).outcome
        assert (timed_out.outcome, timed_out.reason) == ("verifier_rejected", "timeout")
    finally:
        quick.close()
    huge = judge.verify("x" * (1 << 20), "Explain what Kubernetes is.")
    assert not huge.accepted and huge.reason == "too_long" and huge.ms < 60_000
    broken = judge.verify("caf\udce9 au lait?", "café au lait?")  # a lone surrogate: not UTF-8
    assert not broken.accepted and broken.reason == "invalid_text"
    empty = judge.verify("", "Explain what Kubernetes is.")
    assert not empty.accepted and empty.reason == "empty"
    assert _between(judge) == head
    again = judge.verify("Can you tell me what Kubernetes is?", "Explain what Kubernetes is.")
    assert again.accepted


def _ask(text: str) -> TierRequest:
    return TierRequest(
        "ns",
        OpKey("k:" + text),
        "ask",
        PARAMS,
        (1, 2, 3),
        ReusePolicy.always(),
        "llamacpp",
        "sha256:m",
        messages=({"role": "user", "content": text},),
    )


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_a_served_hit_is_one_the_judge_accepted(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder
) -> None:
    """With the guard off, the judge alone decides: a paraphrase is served, an edit the word
    rules would miss (good/bad are stopwords to them) is not, non-Latin text is never judged."""
    tier = SemanticTier(embedder, guard=Guard(checks=()), verifier=judge)
    answer = TierResult("A container orchestrator.", (1,), "stop", 3)
    for text in ("Explain what Kubernetes is.", "Suggest a good name for a pet dog."):
        req = _ask(text)
        assert tier.lookup(req).outcome.outcome in ("miss", "near_miss", "verifier_rejected")
        tier.record(req, answer)
    hit = tier.lookup(_ask("Can you tell me what Kubernetes is?"))
    assert hit.outcome.outcome == "hit"
    edit = tier.lookup(_ask("Suggest a bad name for a pet dog."))
    assert edit.outcome.outcome == "verifier_rejected" and edit.outcome.reason == "judge"
    judged = tier.counts.verifier_ms
    foreign = tier.lookup(_ask("フランスの首都はどこですか?"))
    assert foreign.outcome.outcome == "ineligible" and tier.counts.verifier_ms == judged
    stats = tier.stats()
    assert stats["hits"] == 1 and stats["verifier_rejections"] == {"judge": 1}
    assert stats["verifier_judgments"] >= 2 and stats["verifier_ms_median"] > 0


def test_bad_settings_are_refused(judge: JudgeVerifier) -> None:
    for bad in (
        {"threshold": float("nan")},
        {"threshold": "high"},
        {"timeout_s": 0},
        {"timeout_s": -1.0},
    ):
        with pytest.raises(InvalidRequest, match="judge's"):
            JudgeVerifier(judge.backend, **bad)  # type: ignore[arg-type]
    with pytest.raises(ModelFileError):
        JudgeVerifier.open(resolve_model("/no/such/model.gguf"))
