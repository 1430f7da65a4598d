"""The memory graph's Redis store, on a real redis-server: what only it has. An outage, a
corrupt node or a refused command costs the tier its reuse but never a request, and Redis's
errors are continuum's.

The :class:`~continuum.store.base.GraphLog` contract it shares with the SQLite store (the same
answers for any sequence of writes, transactions seen whole or not at all by another client) is
tested on both in ``test_base_graph.py``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from continuum.errors import StoreError
from continuum.store.base import NewNode
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_graph import RedisGraphStore
from continuum.tiers.base import TierRequest, TierResult
from continuum.tiers.memory_graph import MemoryGraph, OpRecord
from tests.redis_server import RedisServer


def fresh_redis(url: str) -> RedisGraphStore:
    base = url.split("?")[0]
    return RedisGraphStore(RedisTarget(f"{base}?prefix=g{uuid.uuid4().hex[:12]}"), owns_target=True)


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisGraphStore]:
    s = fresh_redis(redis_url)
    yield s
    s.close()


def request(key: str) -> TierRequest:
    from continuum.params import GenerationParams
    from continuum.policy import ReusePolicy

    return TierRequest(
        namespace="ns",
        key=key,
        op_name="ask",
        backend="llamacpp",
        model="m",
        params=GenerationParams(temperature=0.0),
        policy=ReusePolicy.always(),
        prompt="What is the capital of Portugal?",
        tokens=(1, 2, 3),
    )


# the op the store-failure tests record, and request("k0") looks up
LISBON = OpRecord(
    "ns",
    "k0",
    op_name="ask",
    query="What is the capital of Portugal?",
    input_text="q",
    result=TierResult("Lisbon", (1,), "stop", 3),
    deterministic=True,
)


def test_an_outage_costs_the_tier_its_reuse_not_the_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    graph = MemoryGraph(server.url)
    try:
        graph.record_op(LISBON)
        server.kill()
        assert graph.lookup(request("k0")).outcome.reason == "store_unavailable"
        assert graph.record_tool("ns", "tool:t", "t", {}, {"a": 1}) == 0
        assert graph.surface_for(request("k0"), None) == ()
        assert graph.counts.store_errors == 3
        assert "store is unreachable" in caplog.text
        server.start()  # the AOF is replayed: the committed op is there
        graph.new_run("ns")
        assert graph.answer("ns", "k0").text == "Lisbon"
    finally:
        graph.close()
        server.stop()


def test_redis_errors_other_than_an_outage_are_store_errors(store: RedisGraphStore) -> None:
    store.target.client.set(store.target.key("graph", "ids"), "not a number")
    with pytest.raises(Exception) as e:
        store.add_node(NewNode("op", "ns", None, "k"))
    assert not isinstance(e.value, redis.RedisError)  # translated, never raw redis-py


def test_a_corrupt_node_or_a_refused_command_costs_the_tier_its_reuse_not_the_request(
    store: RedisGraphStore, caplog: pytest.LogCaptureFixture
) -> None:
    graph = MemoryGraph(store)
    op = graph.record_op(LISBON)
    graph.new_run("ns")
    assert graph.lookup(request("k0")).outcome.outcome == "hit"
    client, key = store.target.client, store.target.key
    node = key("graph", "node", str(op))
    result = TierResult("Lisbon", (1,), "stop", 3)

    client.hset(node, "meta", "{not json")  # a node hash damaged by hand
    with pytest.raises(StoreError, match=f"corrupt graph node {op}"):
        store.node(op)
    assert graph.lookup(request("k0")).outcome.reason == "store_error"
    client.hset(node, "meta", "[]")  # JSON, but not the object a node's meta is
    assert graph.lookup(request("k0")).outcome.reason == "store_error"
    client.hset(node, "meta", '{"deterministic": true, "prompt_tokens": 3}')
    client.hdel(node, "kind")  # a field missing
    assert graph.lookup(request("k0")).outcome.reason == "store_error"
    assert graph.surface_for(request("k1"), None) == ()
    client.hset(node, "kind", "op")
    assert graph.lookup(request("k0")).outcome.outcome == "hit"  # repaired: reuse is back

    client.hset(key("graph", "runs", '["ns"]'), "99", "not json")  # a run entry damaged
    assert graph.surface_for(request("k1"), None) == ()
    with pytest.raises(StoreError, match="corrupt graph run '99'"):
        store.runs("ns")

    by_key = key("graph", "by_key", '["ns","op","k0"]')
    client.delete(by_key)
    client.set(by_key, "not a sorted set")  # WRONGTYPE on every read and write of the index
    assert graph.lookup(request("k0")).outcome.reason == "store_error"
    graph.record(request("k0"), result)  # a committed turn is not failed by its recording
    by_run = key("graph", "by_run", str(graph.run_id("ns")))
    client.delete(by_run)
    client.set(by_run, "not a sorted set")
    assert graph.record_tool("ns", "tool:t", "t", {}, {"a": 1}) == 0  # the tool call stands
    assert graph.counts.store_errors == 8
    assert "the store failed" in caplog.text and "WRONGTYPE" in caplog.text
