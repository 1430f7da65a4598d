"""The semantic tier's verified mode on the real default model and embedder: near-misses are
answered cold and judged on their answers off the request path, vetted mappings are promoted,
the threshold is learned within delta, and every failed promotion is counted, never served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from continuum import GenerationParams, InvalidRequest, Session, TokenOp
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.backends.models import resolve_model
from continuum.engine.compose import semantic_tier
from continuum.engine.core import EngineConfig
from continuum.tiers.base import Hit, TierResult
from continuum.tiers.semantic import SemanticSettings, SemanticTier
from continuum.tiers.semantic_calibration import Calibration
from continuum.tiers.semantic_promotion import Promoter, Proposal
from continuum.tiers.verifier import JudgeVerifier
from tests.backends.test_gguf_file import write_tiny_gguf
from tests.conftest import model
from tests.tiers.test_verifier import _ask

PARAMS = GenerationParams(max_tokens=8)
K8S = "Explain what Kubernetes is."
K8S_AGAIN = "Can you tell me what Kubernetes is?"
K8S_ANSWER = (
    "Kubernetes is an open-source system that automates deploying, scaling and managing "
    "containerized applications across a cluster of machines."
)
K8S_ANSWER_AGAIN = (
    "Kubernetes is an open-source container orchestration platform: it deploys, scales and "
    "manages containerized applications on a cluster."
)


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeVerifier]:
    j = JudgeVerifier.open(model("qwen2.5-coder-0.5b"), threads=2, kind="answer", timeout_s=120)
    yield j
    j.close()


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


class Shared:
    """The module's judge, lent to tiers that close what they are given."""

    kind = "answer"

    def __init__(self, judge: JudgeVerifier) -> None:
        self.judge = judge
        self.identity = judge.identity

    def verify_answers(self, *texts: str):  # type: ignore[no-untyped-def]
        return self.judge.verify_answers(*texts)

    def close(self) -> None:
        pass


def _verified(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder, floor: float
) -> SemanticTier:
    """A verified tier on the module's judge: delta 0.5 serves after one accepted judgment
    ((0 + 1) / (1 + 2) <= 0.5), no exploration, judged from cosine ``floor`` on."""
    calibration = Calibration(0.5, explore=0)
    lent = Shared(judge)
    return SemanticTier(embedder, verifier=lent, calibration=calibration, threshold=floor)  # type: ignore[arg-type]


def _answered(tier: SemanticTier, text: str, answer: str) -> object:
    """Look ``text`` up; on a miss, store ``answer`` as its cold result (as the engine does)."""
    request = _ask(text)
    found = tier.lookup(request)
    if not isinstance(found, Hit):
        tier.record(request, TierResult(answer, (7,), "stop", 5))
    return found


def test_the_verified_mode_needs_a_judge_and_an_answer_judge_needs_it(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    with pytest.raises(InvalidRequest, match="off the request path: give calibration="):
        SemanticTier(embedder, verifier=Shared(judge))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="learns from a judge"):
        SemanticTier(embedder, calibration=Calibration(0.01))
    with pytest.raises(InvalidRequest, match=r"\(0, 0\.5\]"):
        Calibration(0.6)
    with pytest.raises(InvalidRequest, match="verify_answers"):
        judge.verify(K8S_AGAIN, K8S)
    with pytest.raises(InvalidRequest, match="'intent' or 'answer'"):
        JudgeVerifier(judge.backend, kind="both")  # type: ignore[arg-type]
    base = tmp_path / "base.gguf"  # a GGUF without a chat template: not an instruct model
    write_tiny_gguf(base, "tiny-base")
    with pytest.raises(InvalidRequest, match="instruct"):
        JudgeVerifier.open(resolve_model(str(base)), kind="answer")


@pytest.mark.slow
def test_a_near_miss_is_answered_cold_judged_off_the_path_and_promoted(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder
) -> None:
    tier = _verified(judge, embedder, 0.5)
    assert tier.promoter is not None and tier.calibration is not None
    _answered(tier, K8S, K8S_ANSWER)
    first = _answered(tier, K8S_AGAIN, K8S_ANSWER_AGAIN)
    assert not isinstance(first, Hit)  # nothing learned yet: answered cold, no judge on the path
    assert (first.outcome.outcome, first.outcome.reason) == ("near_miss", "unvetted")
    assert tier.promoter.drain(timeout=300)
    stats = tier.stats()["verified"]
    assert stats["proposed"] == 1 and stats["promoted"] == 1 and stats["observations"] == 1
    threshold = tier.calibration.threshold()
    assert threshold is not None and 0.5 <= threshold < 1.0
    again = tier.lookup(_ask(K8S_AGAIN))  # the vetted mapping: served the anchor's answer
    assert isinstance(again, Hit) and again.result is not None
    assert again.result.text == K8S_ANSWER
    assert tier.stats()["verified"]["pending"] == 0
    tier.close()


@pytest.mark.slow
def test_rejected_timed_out_and_dropped_promotions_are_counted_and_never_served(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder
) -> None:
    tier = _verified(judge, embedder, 0.3)
    assert tier.promoter is not None and tier.calibration is not None
    _answered(
        tier, "How do I sort a list in Python?", "`sorted(xs)` returns it in ascending order."
    )
    wrong = "How do I sort a list in Python from largest to smallest?"  # the guard passes it
    _answered(tier, wrong, "`sorted(xs, reverse=True)` puts the largest first.")
    assert tier.promoter.drain(timeout=300)
    stats = tier.stats()["verified"]
    assert stats["rejected_judge"] == 1 and stats["judged_wrong"] == 1
    assert "promoted" not in stats
    assert tier.calibration.threshold() is None  # one wrong judgment: nothing is served
    assert not isinstance(tier.lookup(_ask(wrong)), Hit)
    tier.close()

    late = JudgeVerifier(judge.backend.sibling(judge.backend.config), kind="answer", timeout_s=1e-6)
    timed = SemanticTier(
        embedder, verifier=late, calibration=Calibration(0.5, explore=0), threshold=0.5
    )
    _answered(timed, K8S, K8S_ANSWER)
    _answered(timed, K8S_AGAIN, K8S_ANSWER_AGAIN)
    assert timed.promoter is not None and timed.promoter.drain(timeout=60)
    stats = timed.stats()["verified"]
    assert stats["rejected_timeout"] == 1 and stats["observations"] == 0  # no judgment made
    assert not isinstance(timed.lookup(_ask(K8S_AGAIN)), Hit)
    timed.close()  # closes its judge


@pytest.mark.slow
def test_a_full_queue_drops_proposals_and_a_closed_promoter_takes_none(
    judge: JudgeVerifier, embedder: SentenceTransformerEmbedder
) -> None:
    decided = []
    promoter = Promoter(Shared(judge), lambda p, v: decided.append(v), queue_size=1)  # type: ignore[arg-type]
    tier = SemanticTier(embedder)
    part = "p"
    vector = embedder.embed([K8S])[0]
    anchor = tier.put(
        part, K8S, vector, text=K8S_ANSWER, tokens=(1,), finish_reason="stop", prompt_tokens=3
    )
    new = tier.put(
        part,
        K8S_AGAIN,
        vector,
        text=K8S_ANSWER_AGAIN,
        tokens=(1,),
        finish_reason="stop",
        prompt_tokens=3,
    )
    results = [promoter.submit(Proposal(anchor, new, 0.9)) for _ in range(3)]
    assert results[0] and not all(results)  # one judged at a time, one waiting: the rest dropped
    assert promoter.drain(timeout=300)
    assert promoter.counts["dropped"] == results.count(False)
    assert len(decided) == results.count(True)
    promoter.close()
    assert not promoter.submit(Proposal(anchor, new, 0.9))
    for size in (0, -1, 1.5, True):
        with pytest.raises(InvalidRequest, match="queue_size"):
            Promoter(Shared(judge), lambda p, v: None, queue_size=size)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_engine_serves_a_third_wording_from_the_promoted_answer(
    embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    """Through a Session on the default model, with the intent judge ``serve --semantic-verifier
    verified`` uses: the paraphrase is answered cold (nobody waits on the judge), judged off
    the path and promoted, and a third wording is then served the first answer without a
    backend call."""
    judge = JudgeVerifier.open(model("qwen2.5-coder-0.5b"), threads=2, timeout_s=120)
    tier = SemanticTier(
        embedder, verifier=judge, calibration=Calibration(0.5, explore=0), threshold=0.5
    )
    s = Session(
        "ns",
        model=model("qwen2.5-coder-0.5b"),
        n_ctx=1024,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
        semantic=tier,
    )
    try:
        first = s.run(_op(K8S))
        second = s.run(_op(K8S_AGAIN))
        assert second.metrics.backend_called  # answered cold: no judgment on the request path
        assert second.metrics.outcome_of("semantic") == "near_miss"
        assert tier.promoter is not None and tier.promoter.drain(timeout=300)
        verified = s.metrics()["semantic"]["verified"]
        assert verified["promoted"] == 1 and verified["threshold"] is not None
        calls = s.stats.backend_calls
        third = s.run(_op("can you tell me what kubernetes is"))
        assert third.metrics.hit_tier == "semantic" and s.stats.backend_calls == calls
        assert third.text == first.text
    finally:
        s.close()


def _op(text: str) -> TokenOp:
    return TokenOp(
        "ask",
        messages=(
            {"role": "system", "content": "Answer in one short sentence."},
            {"role": "user", "content": text},
        ),
        params=GenerationParams(max_tokens=16),
    )


def test_serve_builds_the_verified_mode_from_its_settings(
    embedder: SentenceTransformerEmbedder,
) -> None:
    """``--semantic-verifier verified --semantic-delta D``: the intent judge, off the path."""
    settings = SemanticSettings(semantic=True, semantic_verifier="verified", semantic_delta=0.05)
    tier = semantic_tier(settings, embedder, object())  # type: ignore[arg-type]
    try:
        assert tier.calibration is not None and tier.calibration.delta == 0.05
        assert tier.promoter is not None and tier.promoter.judge.kind == "intent"
    finally:
        tier.close()
    other = SemanticSettings(semantic_verifier="judge", semantic_judge="smollm2-135m")
    tier = semantic_tier(other, embedder, object())  # type: ignore[arg-type]
    try:  # another judge model, by alias, on the request path
        assert tier.calibration is None and tier.verifier is not None
        judge_model = tier.verifier.backend.model  # type: ignore[attr-defined]
        assert judge_model.digest == resolve_model("smollm2-135m").digest
    finally:
        tier.close()
    with pytest.raises(ValueError, match="semantic_delta"):
        SemanticSettings(semantic_verifier="verified", semantic_delta=0.7)
