"""The memory graph's Redis store, on a real redis-server: the same answers as the SQLite store
for any sequence of writes (SQLite is the oracle), transactions seen whole or not at all by
another client, and an outage that costs the tier its reuse but never a request."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum.errors import InvalidRequest, StoreError, StoreUnavailable
from continuum.store.base import GraphLog, NewNode, Node, NodeQuery
from continuum.store.graph import GraphStore, open_graph
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_graph import RedisGraphStore
from continuum.tiers.base import TierRequest, TierResult
from continuum.tiers.memory_graph import MemoryGraph, OpRecord
from tests.redis_server import RedisServer

KINDS = ("op", "result", "tool_call", "tool_result")
NAMESPACES = ("acme", "globex")
KEYS = ("k1", "k2", "k3")


def fresh_redis(url: str) -> RedisGraphStore:
    base = url.split("?")[0]
    return RedisGraphStore(RedisTarget(f"{base}?prefix=g{uuid.uuid4().hex[:12]}"), owns_target=True)


def comparable(n: Node) -> tuple[Any, ...]:
    emb = None if n.embedding is None else n.embedding.tolist()
    return (
        n.id,
        n.kind,
        n.namespace,
        n.run_id,
        n.key,
        n.label,
        n.text,
        n.hash,
        n.meta,
        emb,
        n.embedder,
        n.stale,
        n.stale_reason,
    )


write = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(NAMESPACES)),
    st.tuples(
        st.just("node"),
        st.sampled_from(KINDS),
        st.sampled_from(NAMESPACES),
        st.sampled_from(KEYS),
        st.sampled_from(("", "h1", "h2")),
        st.booleans(),
    ),
    st.tuples(st.just("entity"), st.sampled_from(NAMESPACES), st.sampled_from(("42", "lisbon"))),
    st.tuples(st.just("edge"), st.integers(1, 12), st.integers(1, 12), st.sampled_from(KINDS)),
    st.tuples(st.just("stale"), st.lists(st.integers(1, 12), max_size=4)),
)


def apply(store: GraphLog, step: tuple[Any, ...], runs: list[int]) -> Any:
    match step:
        case ("run", ns):
            runs.append(store.add_run(ns, f"run of {ns}"))
            return runs[-1]
        case ("node", kind, ns, key, h, embedded):
            return store.add_node(
                NewNode(
                    kind,
                    ns,
                    runs[-1] if runs else None,
                    key,
                    label=kind,
                    text=f"{kind} {key}",
                    hash=h,
                    meta={"n": len(runs)},
                    embedding=np.arange(4, dtype=np.float32) if embedded else None,
                    embedder="e",
                )
            )
        case ("entity", ns, name):
            return store.entity(ns, name)
        case ("edge", src, dst, kind):
            store.add_edges([(src, dst, kind)])
            return None
        case ("stale", ids):
            return store.mark_stale(ids, "changed")
    raise AssertionError(step)


def queries(runs: list[int]) -> list[NodeQuery]:
    out = []
    for ns in NAMESPACES:
        out.append(NodeQuery(ns))
        out.append(NodeQuery(ns, kinds=("op",), fresh=True, run_not=runs[-1] if runs else None))
        for key in KEYS:
            out.append(NodeQuery(ns, kinds=("tool_result",), key=key, hash_not="h1"))
            out.append(NodeQuery(ns, kinds=("op", "result"), key=key, newest_first=True))
    for run in runs:
        out.append(NodeQuery(run_id=run, kinds=("tool_result", "result"), below=8))
        out.append(NodeQuery(run_id=run, kinds=("tool_result",), key="k1", hash="h2"))
    return out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(write, max_size=20))
def test_redis_answers_every_query_as_sqlite_does(
    steps: list[tuple[Any, ...]], redis_url: str, tmp_path: Path
) -> None:
    sqlite = GraphStore(tmp_path / f"{uuid.uuid4().hex}.db")
    shared = fresh_redis(redis_url)
    try:
        runs_a: list[int] = []
        runs_b: list[int] = []
        for step in steps:
            assert apply(sqlite, step, runs_a) == apply(shared, step, runs_b), step
        assert runs_a == runs_b
        for q in queries(runs_a):
            assert [comparable(n) for n in shared.nodes(q)] == [
                comparable(n) for n in sqlite.nodes(q)
            ], q
        for i in range(1, 13):
            assert (shared.node(i) is None) == (sqlite.node(i) is None)
            for kind in KINDS:
                assert shared.targets(i, kind) == sqlite.targets(i, kind)
                assert shared.sources(i, kind) == sqlite.sources(i, kind)
        for ns in NAMESPACES:
            assert [r[:2] for r in shared.runs(ns)] == [r[:2] for r in sqlite.runs(ns)]
            names = ["42", "lisbon", "absent"]
            assert shared.entity_neighbours(ns, names) == sqlite.entity_neighbours(ns, names)
        assert shared.counts() == sqlite.counts()
    finally:
        sqlite.close()
        shared.close()


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisGraphStore]:
    s = fresh_redis(redis_url)
    yield s
    s.close()


def test_another_client_sees_a_transaction_whole_or_not_at_all(
    store: RedisGraphStore, redis_url: str
) -> None:
    other = RedisGraphStore(RedisTarget(f"{redis_url.split('?')[0]}?prefix={store.target.prefix}"))
    with store.transaction():
        op = store.add_node(NewNode("op", "ns", None, "k", text="Where is order 42 going?"))
        res = store.add_node(NewNode("result", "ns", None, "k", text="Lisbon"))
        with store.transaction():  # a nested block joins the outer one
            store.add_edges([(op, res, "produced")])
        assert other.nodes(NodeQuery("ns")) == [] and other.targets(op, "produced") == []
    assert [n.kind for n in other.nodes(NodeQuery("ns"))] == ["op", "result"]
    assert other.targets(op, "produced") == [res]
    with pytest.raises(RuntimeError, match="crash"), store.transaction():
        store.add_node(NewNode("op", "ns", None, "k2"))
        store.add_edges([(op, 99, "used")])
        raise RuntimeError("crash after the op and its edge")
    assert [n.key for n in other.nodes(NodeQuery("ns", kinds=("op",)))] == ["k"]
    assert other.targets(op, "used") == []
    assert store.counts() == {"op": 1, "result": 1}


def test_an_entity_is_one_node_however_many_ops_mention_it(store: RedisGraphStore) -> None:
    first = store.entity("ns", "42")
    assert store.entity("ns", "42") == first
    assert store.entity("other", "42") != first  # per namespace
    assert store.counts() == {"entity": 2}


def test_a_node_named_twice_is_marked_stale_once(store: RedisGraphStore) -> None:
    op = store.add_node(NewNode("op", "ns", None, "k"))
    assert store.mark_stale([op, op], "a tool returned something else") == 1  # as SQLite says
    assert store.mark_stale([op], "again") == 0


def test_a_query_names_its_namespace_or_run() -> None:
    with pytest.raises(InvalidRequest, match="namespace or its run_id"):
        NodeQuery(kinds=("op",))


def test_open_graph_takes_a_path_a_url_or_a_store(tmp_path: Path, redis_url: str) -> None:
    local = open_graph(tmp_path / "g.db")
    shared = open_graph(redis_url)
    try:
        assert isinstance(local, GraphStore) and isinstance(shared, RedisGraphStore)
        assert open_graph(local) is local
    finally:
        local.close()
        shared.close()
    with pytest.raises(StoreUnavailable, match="start Redis"):
        open_graph(f"redis://127.0.0.1:{free()}/0")


def free() -> int:
    from tests.redis_server import free_port

    return free_port()


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
