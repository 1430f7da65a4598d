"""The semantic tier: the guard, the vector indexes, the real embedder, the tier, and the engine
running it on the real default model."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum import (
    EngineConfig,
    GenerationParams,
    InvalidRequest,
    ModelFile,
    ReusePolicy,
    Session,
    TokenOp,
)
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.errors import EmbeddingError
from continuum.keys import OpKey
from continuum.store import cache_meta
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult
from continuum.tiers.features import Guard, entities, negations, numbers, quotes
from continuum.tiers.semantic import DEFAULT_THRESHOLD, SemanticTier, split_query
from continuum.tiers.semantic_entries import SemanticEntry
from continuum.tiers.vectors import AutoIndex, ExactIndex, HNSWIndex

PARAMS = GenerationParams(max_tokens=8)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def unit(rng: np.random.Generator, n: int, dim: int = 384) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    out: np.ndarray = v / np.linalg.norm(v, axis=1, keepdims=True)
    return out


# -- the guard -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "check"),
    [
        ("What is 2+3?", "What is 2+4?", "numbers"),
        ("What is 2+3?", "What is 2*3?", "numbers"),
        ("Convert 5 miles to km", "Convert fifty miles to km", "numbers"),
        ("Tell me about Paris, France", "Tell me about Paris, Texas", "entities"),
        ("Who founded Microsoft?", "Who founded Apple?", "entities"),
        ("Which foods contain gluten?", "Which foods do not contain gluten?", "negation"),
        ("Can I take it with food?", "Can't I take it with food?", "negation"),
        ('What does "ls -la" do?', 'What does "ls -lh" do?', "quotes"),
        ("Translate 'good morning' to Spanish", "Translate 'good night' to Spanish", "quotes"),
        ("Is it safe to eat raw chicken?", "Is it safe to eat cooked chicken?", "substitution"),
        ("How do I sort a list in python?", "How do I sort a list in rust?", "substitution"),
        ("How do I encrypt a file?", "How do I decrypt a file?", "substitution"),
    ],
)
def test_the_guard_rejects_requests_that_differ_in_what_matters(a: str, b: str, check: str) -> None:
    assert Guard().rejects(a, b) == check
    assert Guard().rejects(b, a) == check  # symmetric


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 2+3?", "How much is two plus three?"),
        ("What's 7 times 8?", "Multiply seven by eight."),
        ("What is the capital of France?", "Which city is the capital of France?"),
        ("what is the capital of france", "What is France's capital city?"),
        ("Convert 1,000 meters to feet", "convert one thousand meters into feet"),
        ("How do I reverse a string in Python?", "In Python, how can a string be reversed?"),
        ("Translate 'good morning' into Spanish.", "How do you say 'good morning' in Spanish?"),
    ],
)
def test_the_guard_passes_true_paraphrases(a: str, b: str) -> None:
    assert Guard().rejects(a, b) is None


def test_feature_extraction() -> None:
    assert numbers("twenty five apples, 3.5 kg and 1,000 m") == {"25": 1, "3.5": 1, "1000": 1}
    assert numbers("2 + 3")["op:+"] == 1
    assert quotes('run `ls -la` then "make test"') == {"ls -la", "make test"}
    assert quotes("it's John's book") == set()  # apostrophes are not quotes
    assert negations("I can't and won't, not ever") == 3
    assert {"new york", "iphone", "nasa"} <= entities("Compare New York and the iPhone. NASA?")
    assert "what" not in entities("What is this?")  # a sentence start is not a name


def test_guard_checks_are_named_and_can_be_turned_off() -> None:
    assert Guard(checks=()).rejects("What is 2+3?", "What is 2+4?") is None
    assert Guard(checks=("numbers",)).rejects("raw chicken", "cooked chicken") is None
    with pytest.raises(InvalidRequest, match="unknown guard checks"):
        Guard(checks=("vibes",))


# -- vector indexes ------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 30)), max_size=60),
    st.integers(0, 2**31),
)
def test_exact_index_matches_brute_force(ops: list[tuple[str, int]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = ExactIndex(8)
    oracle: dict[int, np.ndarray] = {}
    for op, key in ops:
        if op == "add":
            v = unit(rng, 1, 8)[0]
            index.add(key, v)
            oracle[key] = v
        else:
            index.remove(key)
            oracle.pop(key, None)
    assert len(index) == len(oracle)
    q = unit(rng, 1, 8)[0]
    got = index.search(q, 3)
    want = sorted(((k, float(v @ q)) for k, v in oracle.items()), key=lambda kv: -kv[1])[:3]
    assert [k for k, _ in got] == [k for k, _ in want]
    assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


def test_hnsw_agrees_with_exact_and_survives_save_and_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = unit(rng, 2000)
    exact, hnsw = ExactIndex(384), HNSWIndex(384)
    for i, v in enumerate(data):
        exact.add(i, v)
        hnsw.add(i, v)
    queries = data[:50] + 0.05 * unit(rng, 50)
    agree = sum(exact.search(q, 1)[0][0] == hnsw.search(q, 1)[0][0] for q in queries)
    assert agree >= 49
    assert hnsw.search(data[7], 1)[0] == (7, pytest.approx(1.0, abs=1e-5))
    hnsw.remove(7)
    assert hnsw.search(data[7], 1)[0][0] != 7
    hnsw.save(tmp_path / "i.hnsw")
    back = HNSWIndex.restore(384, tmp_path / "i.hnsw")
    assert back is not None and len(back) == 1999 and back.holds([i for i in range(2000) if i != 7])
    assert back.search(data[9], 1)[0][0] == 9
    (tmp_path / "bad.hnsw").write_bytes(b"not an index at all")
    assert HNSWIndex.restore(384, tmp_path / "bad.hnsw") is None
    assert HNSWIndex.restore(384, tmp_path / "missing.hnsw") is None
    assert HNSWIndex.restore(128, tmp_path / "i.hnsw") is None  # another dimension


def test_auto_index_promotes_to_hnsw_and_keeps_its_entries() -> None:
    rng = np.random.default_rng(2)
    data = unit(rng, 300)
    index = AutoIndex(384, ann_from=200)
    for i, v in enumerate(data):
        index.add(i, v)
        assert index.kind == ("exact" if i < 199 else "hnsw")
    assert len(index) == 300
    assert all(index.search(data[i], 1)[0][0] == i for i in (0, 150, 299))
    with pytest.raises(InvalidRequest, match="384-dimensional"):
        index.search(np.ones(10), 1)


# -- the embedder ----------------------------------------------------------------------------------
def test_the_default_embedder_works_offline_and_is_identified_by_its_weights(
    embedder: SentenceTransformerEmbedder,
) -> None:
    assert embedder.name == "all-MiniLM-L6-v2" and embedder.dim == 384
    v = embedder.embed(["What is the capital of France?", "Which city is France's capital?"])
    assert v.shape == (2, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > 0.8
    again = embedder.embed(["What is the capital of France?"])[0]
    assert np.allclose(again, v[0], atol=1e-6)  # deterministic
    assert embedder.identity.startswith("st:")


def test_embedder_bad_input(embedder: SentenceTransformerEmbedder) -> None:
    with pytest.raises(EmbeddingError, match="empty"):
        embedder.embed(["   "])
    with pytest.raises(InvalidRequest, match="not str"):
        embedder.embed([{"type": "image_url"}])  # type: ignore[list-item]
    with pytest.raises(InvalidRequest, match="list of strings"):
        embedder.embed("a bare string")
    long = "The quick brown fox jumps over the lazy dog. " * 100  # ~1,000 word pieces
    assert not embedder.fits(long) and embedder.fits("short")
    (v,) = embedder.embed([long])  # chunked into windows and averaged, stated in the docs
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_missing_extra_names_the_pip_command() -> None:
    code = (
        "import sys; sys.modules['sentence_transformers'] = None\n"
        "from continuum.backends.embedders import SentenceTransformerEmbedder\n"
        "from continuum.errors import MissingExtra\n"
        "try:\n    SentenceTransformerEmbedder()\n"
        "except MissingExtra as e:\n    print(e.pip_command, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'continuum[semantic]'" in out.stdout
    assert "sentence_transformers" in out.stdout


# -- the tier --------------------------------------------------------------------------------------
def _part(tier: SemanticTier, **kw: object) -> str:
    args: dict[str, object] = {
        "namespace": "ns",
        "backend": "llamacpp",
        "model": "sha256:m",
        "op_name": "ask",
        "params": PARAMS,
        "context": "",
    }
    args.update(kw)
    return tier.partition(**args)  # type: ignore[arg-type]


def _store(tier: SemanticTier, part: str, query: str, answer: str) -> None:
    vec = tier.embedder.embed([query])[0]
    tier.put(part, query, vec, text=answer, tokens=(1, 2), finish_reason="stop", prompt_tokens=9)


def test_tier_outcomes(embedder: SentenceTransformerEmbedder) -> None:
    tier = SemanticTier(embedder)
    part = _part(tier)
    assert tier.search(part, "What is the capital of France?").outcome == "miss"
    _store(tier, part, "What is the capital of France?", "Paris.")
    hit = tier.search(part, "Which city is the capital of France?")
    assert hit.outcome == "hit" and hit.entry is not None and hit.entry.text == "Paris."
    assert hit.score is not None and hit.score >= DEFAULT_THRESHOLD
    _store(tier, part, "What is 2+3?", "5")
    rejected = tier.search(part, "What is 2+4?")
    assert rejected.outcome == "guard_rejected" and rejected.reason == "numbers"
    assert rejected.score is not None and rejected.score >= DEFAULT_THRESHOLD
    near = tier.search(part, "How do volcanoes form?")
    assert near.outcome == "near_miss" and near.score is not None and near.score < tier.threshold
    assert tier.search(part, "").outcome == "ineligible"
    assert tier.search(part, "word " * 400).reason == "too_long"
    stats = tier.counts.as_dict()
    assert stats["hits"] == 1 and stats["near_misses"] == 1 and stats["guard_rejections"] == 1
    assert stats["guard_rejections_by_check"] == {"numbers": 1}
    assert stats["ineligible"] == {"empty": 1, "too_long": 1} and stats["misses"] == 1


def test_text_the_guard_cannot_judge_fails_closed(embedder: SentenceTransformerEmbedder) -> None:
    """Another script, code, another language: never compared, never stored (``ineligible``),
    while an English request beside them is served its paraphrase."""
    tier = SemanticTier(embedder)

    def ask(text: str) -> TierRequest:
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

    answer = TierResult("an answer", (1,), "stop", 3)
    for text, why in (
        ("如何退出vim编辑器", "script"),
        ("Как выйти из vim?", "script"),
        ("What does && mean in bash?", "code"),
        ("Why is x += 1 different from x = 1?", "code"),
        ("Wie beende ich den Editor vim?", "language"),
    ):
        for query in (text, text + " "):
            got = tier.lookup(ask(query))
            assert isinstance(got, Miss), text
            assert (got.outcome.outcome, got.outcome.reason) == ("ineligible", why), text
            tier.record(ask(query), answer)
    assert len(tier) == 0
    first = ask("What is the capital of France?")
    assert isinstance(tier.lookup(first), Miss)
    tier.record(first, answer)
    assert isinstance(tier.lookup(ask("Which city is the capital of France?")), Hit)
    assert tier.counts.as_dict()["ineligible"] == {"script": 4, "code": 4, "language": 2}


def test_only_the_same_partition_is_compared(embedder: SentenceTransformerEmbedder) -> None:
    tier = SemanticTier(embedder)
    _store(tier, _part(tier), "What is the capital of France?", "Paris.")
    q = "Which city is the capital of France?"
    assert tier.search(_part(tier), q).outcome == "hit"
    for other in (
        {"namespace": "tenant-b"},
        {"model": "sha256:other"},
        {"backend": "openai_http"},
        {"op_name": "translate"},
        {"params": GenerationParams(max_tokens=9)},
        {"context": '{"before":[{"role":"system","content":"Be terse."}]}'},
    ):
        assert tier.search(_part(tier, **other), q).outcome == "miss", other


def test_an_index_built_by_another_embedder_is_never_searched(
    embedder: SentenceTransformerEmbedder,
) -> None:
    class Renamed:  # the same weights under another identity stand for another embedder
        name, dim, max_tokens = "other", embedder.dim, embedder.max_tokens
        identity = "st:another-model"
        embed, fits = embedder.embed, embedder.fits

    mine, theirs = SemanticTier(embedder), SemanticTier(Renamed())
    assert _part(mine) != _part(theirs)


def test_versions_and_capacity(embedder: SentenceTransformerEmbedder) -> None:
    tier = SemanticTier(embedder, capacity=2)
    part = _part(tier)
    _store(tier, part, "What is the capital of France?", "Paris.")
    tier.bump_version()  # a resumed run (DESIGN.md §3.10)
    assert tier.search(part, "Which city is the capital of France?").outcome == "miss"
    _store(tier, part, "How tall is Mount Everest?", "8,849 m")
    _store(tier, part, "Who wrote Hamlet?", "Shakespeare")
    assert len(tier) == 2 and tier.evictions == 1
    assert tier.search(part, "Hamlet was written by whom?").outcome == "hit"
    with pytest.raises(InvalidRequest, match="cosine"):
        SemanticTier(embedder, threshold=1.5)


def test_split_query() -> None:
    assert split_query(None, "Tell me a joke") == ("", "Tell me a joke")
    ctx, q = split_query(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], None
    )
    assert q == "Q" and ctx is not None and '"S"' in ctx
    assert split_query([{"role": "tool", "content": "42"}], None) == (None, "not_user_turn")
    assert split_query([{"role": "user", "content": "  "}], None) == (None, "empty")


# -- the engine on the real model ---------------------------------------------------------------
def ask(text: str, system: str = "Answer briefly.", **params: object) -> TokenOp:
    return TokenOp(
        "ask",
        messages=({"role": "system", "content": system}, {"role": "user", "content": text}),
        params=GenerationParams(max_tokens=8, **params),  # type: ignore[arg-type]
    )


@pytest.fixture
def semantic_session(
    gemma: ModelFile, embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> Iterator[Session]:
    s = Session(
        "ns",
        model=gemma,
        n_ctx=1024,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
        semantic=SemanticTier(embedder),
    )
    yield s
    s.close()


def test_engine_serves_a_paraphrase_without_calling_the_backend(semantic_session: Session) -> None:
    s = semantic_session
    first = s.run(ask("What is the capital of France?"))
    assert first.metrics.hit_tier == "cold" and first.metrics.outcome_of("semantic") == "miss"
    calls = s.stats.backend_calls
    second = s.run(ask("Which city is the capital of France?"))
    m = second.metrics
    assert m.hit_tier == "semantic" and not m.backend_called and s.stats.backend_calls == calls
    assert second.text == first.text and second.tokens == first.tokens
    assert m.tokens_reused == m.prompt_tokens and m.prompt_tokens_evaluated == 0
    # a near-duplicate that changes a number is rejected by the guard and runs
    s.run(ask("What is 2+3?"))
    third = s.run(ask("What is 2+4?"))
    assert third.metrics.outcome_of("semantic") == "guard_rejected" and third.metrics.backend_called
    # another tenant, another system prompt: no candidates
    assert s.run(ask("Which city is France's capital?"), namespace="b").metrics.backend_called
    other = s.run(ask("Which city is the capital of France?", system="Answer in French."))
    assert other.metrics.outcome_of("semantic") == "miss" and other.metrics.backend_called
    report = s.metrics()["semantic"]
    assert report["hits"] == 1 and report["guard_rejections"] == 1


def test_engine_semantic_obeys_the_policy(semantic_session: Session) -> None:
    s = semantic_session
    s.run(ask("What is the capital of France?", temperature=0.8))
    sampled = s.run(ask("Which city is the capital of France?", temperature=0.8))
    assert sampled.metrics.backend_called and sampled.metrics.outcome_of("semantic") == "skipped"
    s.policy = ReusePolicy.always(nondeterministic=True)
    stored = s.run(ask("What's the capital city of France?", temperature=0.8))
    assert stored.metrics.outcome_of("semantic") == "miss"  # consulted now, and its result stored
    opted = s.run(ask("Which city is France's capital?", temperature=0.8))
    assert opted.metrics.hit_tier == "semantic" and opted.text == stored.text
    s.policy = ReusePolicy.never()
    assert (
        s.run(ask("Which city is the capital of France?", temperature=0.8)).metrics.tiers == ()
    )  # never(): no tier is consulted
    s.policy = ReusePolicy.always()
    tool_last = TokenOp(
        "ask",
        messages=(
            {"role": "user", "content": "What is the capital of France?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "content": "Paris", "tool_call_id": "1"},
        ),
        params=PARAMS,
    )
    assert s.run(tool_last).metrics.outcome_of("semantic") == "ineligible"
    assert s.metrics()["semantic"]["ineligible"] == {"not_user_turn": 1}


def test_semantic_entries_persist_in_the_cache_metadata(
    semantic_session: Session,
    embedder: SentenceTransformerEmbedder,
    tmp_path: Path,
    gemma: ModelFile,
) -> None:
    s = semantic_session
    s.run(ask("What is the capital of France?"))
    s.run(ask("Who wrote Hamlet?"))
    meta = tmp_path / "cache.db"
    s.save_cache_metadata(meta)
    fresh = Session(
        "ns",
        model=gemma,
        n_ctx=1024,
        n_slots=2,
        semantic=SemanticTier(embedder),
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
    )
    try:
        loaded = fresh.load_cache_metadata(meta)
        assert loaded["semantic"] == 2 and loaded["semantic_skipped"] == 0
        assert fresh.semantic is not None and len(fresh.semantic) == 2
        # resume bumps versions: loaded entries are kept but not served
        r = fresh.run(ask("Which city is the capital of France?"))
        assert r.metrics.outcome_of("semantic") == "miss" and r.metrics.backend_called
    finally:
        fresh.close()

    class Other:
        name, dim, max_tokens, identity = "other", 384, 256, "st:other"
        embed, fits = embedder.embed, embedder.fits

    third = Session(
        "ns",
        model=gemma,
        n_ctx=1024,
        n_slots=2,
        semantic=SemanticTier(Other()),
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
    )
    try:
        loaded = third.load_cache_metadata(meta)
        assert loaded["semantic"] == 0 and loaded["semantic_skipped"] == 2
    finally:
        third.close()


def test_large_partitions_persist_their_hnsw_index(
    embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    rng = np.random.default_rng(3)
    tier = SemanticTier(embedder, ann_from=50)
    part = _part(tier)
    vectors = unit(rng, 80)
    for i, v in enumerate(vectors):
        tier.put(part, f"q{i}", v, text=str(i), tokens=(), finish_reason="stop", prompt_tokens=1)
    tier.save_indexes(tmp_path / "idx")
    rows = tier.entries()
    again = SemanticTier(embedder, ann_from=50)
    assert again.load(rows, tmp_path / "idx")["indexes_loaded"] == 1
    index = again.store.index(part)
    assert index is not None and index.kind == "hnsw"
    assert again.search(part, "q5", vectors[5]).score == pytest.approx(1.0, abs=1e-5)
    for f in (tmp_path / "idx").iterdir():
        f.write_bytes(b"torn")
    rebuilt = SemanticTier(embedder, ann_from=50)
    assert rebuilt.load(rows, tmp_path / "idx") == {
        "entries": 80,
        "skipped": 0,
        "indexes_loaded": 0,
        "indexes_rebuilt": 1,
    }
    assert rebuilt.search(part, "q5", vectors[5]).score == pytest.approx(1.0, abs=1e-5)


def _stored(tier: SemanticTier, part: str, query: str, answer: str) -> SemanticEntry:
    vec = tier.embedder.embed([query])[0]
    return tier.put(
        part, query, vec, text=answer, tokens=(1,), finish_reason="stop", prompt_tokens=3
    )


def test_saved_entries_with_the_same_ids_are_all_kept_each_in_its_partition(
    embedder: SentenceTransformerEmbedder,
) -> None:
    """Two metadata files, each numbered from 1, loaded into one process: two entries, never
    one replacing the other (or answering for it)."""
    acme, globex = SemanticTier(embedder), SemanticTier(embedder)
    _stored(acme, _part(acme, namespace="acme"), "What is the capital of France?", "Paris.")
    _stored(globex, _part(globex, namespace="globex"), "What is the capital of France?", "G.")
    tier = SemanticTier(embedder)
    tier.load(acme.entries(), None)
    tier.load(globex.entries(), None)
    tier.load(acme.entries(), None)  # loaded again: held once
    assert len(tier) == 2
    q = "Which city is the capital of France?"
    for ns, answer in (("acme", "Paris."), ("globex", "G.")):
        found = tier.search(_part(tier, namespace=ns), q)
        assert found.outcome == "hit" and found.entry is not None and found.entry.text == answer
    _stored(tier, _part(tier, namespace="acme"), "Who wrote Hamlet?", "Shakespeare.")
    assert len({e.id for e, _ in tier.entries()}) == len(tier) == 3  # a new id is a free one


def test_an_entry_is_served_only_in_its_own_partition(
    embedder: SentenceTransformerEmbedder,
) -> None:
    """The invariant the lookup relies on, and the lookup's own check behind it: an id in a
    partition's index names an entry of that partition, or nothing is served."""
    tier = SemanticTier(embedder)
    acme, globex = _part(tier, namespace="acme"), _part(tier, namespace="globex")
    q = "What is the capital of France?"
    a = _stored(tier, acme, q, "Paris.")
    vec = tier.embedder.embed([q])[0]
    # an entry under a taken id (as a colliding shared id would be): the old index forgets it
    tier.store.insert(dataclasses.replace(a, partition=globex, text="G."), vec, index=True)
    assert tier.search(acme, q).outcome == "miss"
    assert tier.search(globex, q).entry.text == "G."  # type: ignore[union-attr]
    # and were an index ever to hold another partition's id, the lookup skips it
    index = tier.store.index(acme)
    assert index is not None
    index.add(a.id, vec)
    assert tier.search(acme, q).outcome == "miss"


def test_a_version_1_metadata_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE memo (key TEXT PRIMARY KEY, version INTEGER NOT NULL, text TEXT NOT NULL,"
        " tokens BLOB NOT NULL, finish_reason TEXT NOT NULL, prompt_tokens INTEGER NOT NULL);"
        "CREATE TABLE snapshots (namespace TEXT NOT NULL, tokens BLOB NOT NULL,"
        " snapshot_id TEXT NOT NULL, n_tokens INTEGER NOT NULL, nbytes INTEGER NOT NULL);"
        "PRAGMA user_version=1;"
    )
    db.execute("INSERT INTO meta VALUES ('format_version', '1')")
    db.execute("INSERT INTO meta VALUES ('backend', ?)", (json.dumps("llamacpp"),))
    db.commit()
    db.close()
    data = cache_meta.load(path)
    assert data.semantic == [] and data.meta["backend"] == "llamacpp"
