"""The semantic tier shared through a real Redis: entries one worker stores are candidates on
another from its next lookup (the stream mirror), at the hit rate one process has alone, never
across tenants; the version is shared; an outage leaves each worker its own entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuum import Engine, EngineConfig, GenerationParams, ModelFile, TokenOp
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.bench.semantic import load_pairs
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_vectors import RedisVectorLog
from continuum.tiers.semantic import SemanticTier
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

PARAMS = GenerationParams(max_tokens=8)


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


def worker(embedder: SentenceTransformerEmbedder, url: str, **kw: object) -> SemanticTier:
    """A tier on its own connection, as another process's would be."""
    tier = SemanticTier(embedder, **kw)  # type: ignore[arg-type]
    tier.attach(RedisVectorLog(RedisTarget(url)))
    return tier


def part(tier: SemanticTier, context: str, namespace: str = "acme") -> str:
    return tier.partition(
        namespace=namespace,
        backend="llamacpp",
        model="sha256:m",
        op_name="ask",
        params=PARAMS,
        context=context,
    )


def store(tier: SemanticTier, partition: str, query: str, answer: str) -> None:
    vec = tier.embedder.embed([query])[0]
    tier.put(
        partition, query, vec, text=answer, tokens=(1, 2), finish_reason="stop", prompt_tokens=9
    )


def test_a_second_worker_hits_the_first_ones_entries_as_one_process_does(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    pairs = [p for p in load_pairs("independent") if p["label"] == "same"]
    solo = SemanticTier(embedder)
    first, second = worker(embedder, redis_url), worker(embedder, redis_url)
    solo_hits = shared_hits = probe_hits = 0
    for i, pair in enumerate(pairs):
        store(solo, part(solo, str(i)), pair["a"], f"answer {i}")
        found = solo.search(part(solo, str(i)), pair["b"])
        solo_hits += found.outcome == "hit"
        store(first, part(first, str(i)), pair["a"], f"answer {i}")
        found = second.search(part(second, str(i)), pair["b"])
        if found.outcome == "hit":
            assert found.entry is not None and found.entry.text == f"answer {i}"
            shared_hits += 1
        # the probe: the same question from another tenant
        probe_hits += second.search(part(second, str(i), "globex"), pair["b"]).outcome == "hit"
    assert solo_hits > len(pairs) // 3  # the set exercises hits at all
    assert shared_hits >= 0.95 * solo_hits and probe_hits == 0
    assert second.shared_entries == len(pairs) and first.shared_entries == 0
    assert second.stats()["shared_errors"] == 0
    assert len({e.id for e, _ in first.entries()} | {e.id for e, _ in second.entries()}) == len(
        pairs
    )  # one id per entry across the fleet


def test_a_worker_started_later_mirrors_every_entry(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    first = worker(embedder, redis_url)
    store(first, part(first, ""), "What is the capital of France?", "Paris.")
    late = worker(embedder, redis_url)  # attach reads the log from its start
    assert len(late) == 1
    assert late.search(part(late, ""), "Which city is the capital of France?").outcome == "hit"


def test_the_version_is_shared_and_old_entries_are_not_served(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    a, b = worker(embedder, redis_url), worker(embedder, redis_url)
    store(a, part(a, ""), "What is the capital of France?", "Paris.")
    assert a.bump_version(at_least=4) == 5  # a resumed run saved at version 4
    q = "Which city is the capital of France?"
    assert b.search(part(b, ""), q).outcome == "miss" and b.version == 5
    assert worker(embedder, redis_url).version == 5


def test_an_outage_leaves_each_worker_its_own_entries(
    embedder: SentenceTransformerEmbedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        a = worker(embedder, server.url)
        server.kill()
        store(a, part(a, ""), "What is the capital of France?", "Paris.")
        assert a.search(part(a, ""), "Which city is the capital of France?").outcome == "hit"
        assert a.shared_errors >= 2 and "shared log failed" in caplog.text
        ((entry, _),) = a.entries()
        assert entry.id >= 1 << 62  # a local id: it can never collide with a shared one
    finally:
        server.stop()


def test_loaded_entries_never_share_an_id_with_another_tenants(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    """Entries loaded from saved metadata were numbered 1..N by the process that saved them; the
    shared counter hands out 1, 2, ... too. Tenant A's loaded entry and tenant B's new one must
    stay two entries, each served only to its own tenant."""
    saver = SemanticTier(embedder)  # the process that saved the metadata (no Redis)
    store(saver, part(saver, "", "acme"), "What is the capital of France?", "Paris.")
    ((saved, _),) = saver.entries()
    assert saved.id == 1
    w = worker(embedder, redis_url)
    assert w.load(saver.entries(), None)["entries"] == 1
    # the shared counter's first id, on this worker and on another
    store(w, part(w, "", "globex"), "What is the capital of France?", "Globex's answer.")
    other = worker(embedder, redis_url)
    store(other, part(other, "", "globex"), "What is the capital of Spain?", "Madrid, Globex.")
    q = "Which city is the capital of France?"
    a = w.search(part(w, "", "acme"), q)
    assert a.outcome == "hit" and a.entry is not None and a.entry.text == "Paris."
    b = w.search(part(w, "", "globex"), q)
    assert b.outcome == "hit" and b.entry is not None and b.entry.text == "Globex's answer."
    spain = w.search(part(w, "", "globex"), "Which city is the capital of Spain?")
    assert spain.entry is not None and spain.entry.text == "Madrid, Globex."  # mirrored
    assert len({e.id for e, _ in w.entries()}) == len(w) == 3
    # the loaded entry stays this process's own: another worker never sees tenant A's answer
    assert other.search(part(other, "", "acme"), q).outcome == "miss"


def test_entries_held_before_attaching_move_out_of_the_shared_counters_range(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    tier = SemanticTier(embedder)
    store(tier, part(tier, "", "acme"), "What is the capital of France?", "Paris.")
    tier.attach(RedisVectorLog(RedisTarget(redis_url)))
    store(tier, part(tier, "", "globex"), "What is the capital of France?", "Globex's answer.")
    found = tier.search(part(tier, "", "acme"), "Which city is the capital of France?")
    assert found.entry is not None and found.entry.text == "Paris."
    assert sorted(e.id >= 1 << 62 for e, _ in tier.entries()) == [False, True]


def test_a_malformed_shared_record_is_skipped_and_counted_not_raised(
    embedder: SentenceTransformerEmbedder, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Records another version (or a hand) wrote: each fails one way. Every worker skips them
    once, says so, and goes on mirroring what follows."""
    a, b = worker(embedder, redis_url), worker(embedder, redis_url)
    store(a, part(a, ""), "What is the capital of France?", "Paris.")
    target = RedisTarget(redis_url)
    vec = embedder.embed(["Who painted the Mona Lisa?"])[0].tobytes()
    good = {
        k: json.dumps(v)
        for k, v in {
            "id": 999,
            "partition": part(a, ""),
            "query": "Who painted the Mona Lisa?",
            "version": 1,
            "text": "Leonardo.",
            "tokens": [1],
            "finish_reason": "stop",
            "prompt_tokens": 3,
        }.items()
    } | {"vector": vec}
    bad = [
        {k: v for k, v in good.items() if k != "text"},  # a field missing
        good | {"tokens": "[1,"},  # not JSON
        good | {"tenant": '"acme"'},  # a field this version does not know
        good | {"id": '"999"'},  # a string id
        good | {"vector": vec[:5]},  # a torn vector
    ]
    for record in bad:
        target.client.xadd(target.key("semantic", "stream"), record)
    store(a, part(a, ""), "Who wrote Hamlet?", "Shakespeare.")
    found = b.search(part(b, ""), "Which city is the capital of France?")
    assert found.outcome == "hit" and found.entry is not None and found.entry.text == "Paris."
    later = b.search(part(b, ""), "Who is the author of Hamlet?")  # stored after the bad ones
    assert later.entry is not None and later.entry.text == "Shakespeare."
    assert b.shared_errors == len(bad) and b.shared_entries == 2
    assert "cannot read" in caplog.text and "fields missing ['text']" in caplog.text
    b.search(part(b, ""), "Which city is the capital of France?")
    assert b.shared_errors == len(bad)  # the cursor moved past them: each is counted once
    late = worker(embedder, redis_url)  # reads the stream from its start
    assert len(late) == 2 and late.shared_errors == len(bad)


def test_a_version_that_is_not_a_number_is_a_store_error_not_a_crash(
    embedder: SentenceTransformerEmbedder, redis_url: str
) -> None:
    a = worker(embedder, redis_url)
    store(a, part(a, ""), "What is the capital of France?", "Paris.")
    target = RedisTarget(redis_url)
    target.client.set(target.key("semantic", "version"), "two")
    errors = a.shared_errors
    assert a.search(part(a, ""), "Which city is the capital of France?").outcome == "hit"
    assert a.shared_errors == errors + 1 and a.version == 1


def test_a_version_bumped_during_an_outage_is_shared_once_the_log_is_back(
    embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        a, b = worker(embedder, server.url), worker(embedder, server.url)
        server.kill()
        assert a.bump_version() == 2  # a resumed run, the log unreachable: this process only
        server.start()  # the AOF is replayed: the shared version is still 1
        q = "Which city is the capital of France?"
        assert a.search(part(a, ""), q).outcome == "miss"  # syncs: the shared version moves up
        assert RedisVectorLog(RedisTarget(server.url)).version() == 2
        store(a, part(a, ""), "What is the capital of France?", "Paris.")
        found = b.search(part(b, ""), q)
        assert b.version == 2 and found.entry is not None and found.entry.text == "Paris."
        store(b, part(b, ""), "Who wrote Hamlet?", "Shakespeare.")
        back = a.search(part(a, ""), "Who is the author of Hamlet?")
        assert back.entry is not None and back.entry.text == "Shakespeare."
        assert a.version == 2  # moved up once, not bumped again
    finally:
        server.stop()


def test_vector_sets_are_reported_as_the_server_has_them(redis_url: str) -> None:
    target = RedisTarget(redis_url)
    major = int(target.client.info("server")["redis_version"].split(".")[0])
    assert RedisVectorLog(target).has_vector_sets() == (major >= 8)


def test_two_engines_on_one_redis_share_semantic_hits(
    gemma: ModelFile, embedder: SentenceTransformerEmbedder, redis_url: str, tmp_path: Path
) -> None:
    def engine(name: str) -> Engine:
        return Engine.open(
            model=gemma,
            n_ctx=1024,
            store=redis_url,
            semantic=SemanticTier(embedder),
            config=EngineConfig(snapshot_dir=tmp_path / name),
        )

    def ask(text: str) -> TokenOp:
        return TokenOp("answer", messages=({"role": "user", "content": text},), params=PARAMS)

    with engine("one") as one, engine("two") as two:
        first = one.run(ask("What is the capital of France?"), namespace="acme")
        again = two.run(ask("Which city is the capital of France?"), namespace="acme")
        other = two.run(ask("Which city is the capital of France?"), namespace="globex")
    assert first.metrics.hit_tier != "semantic"
    assert again.metrics.hit_tier == "semantic" and again.text == first.text
    assert other.metrics.hit_tier != "semantic"
