"""The :class:`~continuum.store.base.GraphLog` contract, on every implementation: SQLite (a file
in tmp_path) and Redis (a real redis-server, a key prefix of the test's own).

Writes inside a transaction are seen by another store object on the same data (another
process) whole or not at all; what is written reads back; and for any sequence of writes both
stores answer every query alike (hypothesis, SQLite the oracle). ``Impl.rows`` counts nodes
and edges underneath the protocol, as another connection sees them. What only one store has
(SQLite's file locks and binding errors; Redis's outages, corrupt hashes and URLs) is tested in
``test_graph.py`` and ``test_redis_graph.py``. A behaviour the two stores do not share is
pinned as the contract and marked ``xfail(strict=True)`` on the store that breaks it.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum.errors import InvalidRequest
from continuum.store.base import GraphLog, NewNode, Node, NodeQuery
from continuum.store.graph import GraphStore
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_graph import RedisGraphStore
from tests.store.contract import KINDS, xfail_on


# -- the implementations ------------------------------------------------------------------------
@dataclass
class Impl:
    kind: str
    store: GraphLog
    open: Callable[[], GraphLog]  # another store object on the same data (another process)
    rows: Callable[[], tuple[int, int]]  # (nodes, edges) as another connection sees them


def sqlite_impl(path: Path) -> Impl:
    def rows() -> tuple[int, int]:
        db = sqlite3.connect(path)
        try:
            nodes = db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
            edges = db.execute("SELECT COUNT(*) FROM edges").fetchone()[0]
            return int(nodes), int(edges)
        finally:
            db.close()

    return Impl("sqlite", GraphStore(path), lambda: GraphStore(path), rows)


def redis_graph(url: str) -> RedisGraphStore:
    return RedisGraphStore(RedisTarget(url), owns_target=True)


def redis_impl(url: str, raw: RedisTarget) -> Impl:
    """The raw reads follow the key layout drawn in :mod:`continuum.store.redis_graph`."""
    client, key = raw.client, raw.key

    def rows() -> tuple[int, int]:
        nodes = len(list(client.scan_iter(match=key("graph", "node", "*"))))
        edges = sum(int(client.scard(n)) for n in client.scan_iter(match=key("graph", "out", "*")))
        return nodes, edges

    return Impl("redis", redis_graph(url), lambda: redis_graph(url), rows)


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    if request.param == "sqlite":
        made = sqlite_impl(tmp_path / "graph.db")
        yield made
        made.store.close()
        return
    url: str = request.getfixturevalue("redis_url")
    raw = RedisTarget(url)
    made = redis_impl(url, raw)
    yield made
    made.store.close()
    raw.close()


@pytest.fixture
def store(impl: Impl) -> GraphLog:
    return impl.store


def write_op(store: GraphLog) -> None:
    op = store.add_node(NewNode("op", "ns", None, "k", text="Where is order 42 going?"))
    res = store.add_node(NewNode("result", "ns", None, "k", text="Lisbon", meta={"tokens": [1]}))
    store.add_edges([(op, res, "produced"), (op, store.entity("ns", "42"), "mentions")])


OWN_READS = (
    "Redis queues a transaction's writes until it ends, so reads inside it do not see them; "
    "and it creates an entity at once, outside the transaction (see redis_graph's docstring)"
)


# -- transactions -------------------------------------------------------------------------------
@xfail_on("redis", OWN_READS)
def test_a_transaction_commits_every_write_at_its_end(impl: Impl) -> None:
    store = impl.store
    with store.transaction():
        write_op(store)
        assert impl.rows() == (0, 0)  # another connection sees nothing yet
        assert store.counts() == {"op": 1, "result": 1, "entity": 1}  # this one sees its own
        with store.transaction():  # a nested block joins the outer transaction
            store.add_node(NewNode("op", "ns", None, "k2"))
        assert impl.rows() == (0, 0)
    assert impl.rows() == (4, 2)


@xfail_on("redis", OWN_READS)
def test_a_failing_transaction_writes_nothing(impl: Impl) -> None:
    store = impl.store
    store.add_node(NewNode("op", "ns", None, "before"))  # committed on its own, as before
    with pytest.raises(RuntimeError, match="crash"), store.transaction():
        write_op(store)
        raise RuntimeError("crash after the op, its result and its edges")
    assert impl.rows() == (1, 0)
    assert store.counts() == {"op": 1}
    assert store.entity("ns", "42") > 0  # the rolled-back entity is created anew
    assert impl.rows() == (2, 0)


def test_another_store_sees_a_transaction_whole_or_not_at_all(impl: Impl) -> None:
    store, other = impl.store, impl.open()
    try:
        with store.transaction():
            op = store.add_node(NewNode("op", "ns", None, "k", text="Where is order 42 going?"))
            res = store.add_node(NewNode("result", "ns", None, "k", text="Lisbon"))
            with store.transaction():  # a nested block joins the outer one
                store.add_edges([(op, res, "produced")])
            assert other.nodes(NodeQuery("ns")) == [] and other.targets(op, "produced") == []
            assert impl.rows() == (0, 0)
        assert [n.kind for n in other.nodes(NodeQuery("ns"))] == ["op", "result"]
        assert other.targets(op, "produced") == [res] and impl.rows() == (2, 1)
        with pytest.raises(RuntimeError, match="crash"), store.transaction():
            store.add_node(NewNode("op", "ns", None, "k2"))
            store.add_edges([(op, 99, "used")])
            raise RuntimeError("crash after the op and its edge")
        assert [n.key for n in other.nodes(NodeQuery("ns", kinds=("op",)))] == ["k"]
        assert other.targets(op, "used") == [] and impl.rows() == (2, 1)
        assert store.counts() == {"op": 1, "result": 1} == other.counts()
    finally:
        other.close()


# -- what is written reads back -----------------------------------------------------------------
def test_a_node_reads_back_as_written(store: GraphLog) -> None:
    run = store.add_run("ns", "agent ✓")
    vector = np.array([0.5, -1.0, 3.25], dtype=np.float64)  # stored as float32
    meta = {"args": {"q": [1, None]}, "n": 2.5}
    new = NewNode("tool_result", "ns", run, "tool:t", "t", '{"a": 1} ✓', "h1", meta, vector, "e1")
    before = time.time()
    node_id = store.add_node(new)
    node = store.node(node_id)
    assert node is not None
    fields = (node_id, "tool_result", "ns", run, "tool:t", "t", new.text, "h1", meta, None, "e1")
    expected = Node(*fields, created=node.created, stale=False, stale_reason="")
    assert dataclasses.replace(node, embedding=None) == expected
    assert node.embedding is not None and node.embedding.dtype == np.float32
    assert node.embedding.tolist() == [0.5, -1.0, 3.25]
    assert before - 1 <= node.created <= time.time() + 1
    assert (node.stale, node.stale_reason) == (False, "")
    bare = store.node(store.add_node(NewNode("op", "ns", None, "k")))
    assert bare is not None and bare.embedding is None and bare.meta == {} and bare.run_id is None
    assert store.node(node_id + 1000) is None


def test_an_empty_embedding_reads_back_empty(store: GraphLog) -> None:
    node = store.node(store.add_node(NewNode("op", "ns", None, "k", embedding=np.zeros(0))))
    assert node is not None and node.embedding is not None and node.embedding.size == 0


def test_runs_are_per_namespace_in_order(store: GraphLog) -> None:
    before = time.time()
    first = store.add_run("acme", "one")
    other = store.add_run("globex", "elsewhere")
    second = store.add_run("acme", "two")
    assert first < second and len({first, other, second}) == 3
    runs = store.runs("acme")
    assert [(r[0], r[1]) for r in runs] == [(first, "one"), (second, "two")]
    assert all(before - 1 <= r[2] <= time.time() + 1 for r in runs)
    assert [r[0] for r in store.runs("globex")] == [other] and store.runs("initech") == []


def test_edges_are_a_set_read_in_id_order(store: GraphLog) -> None:
    a, b, c = (store.add_node(NewNode("op", "ns", None, k)) for k in "abc")
    store.add_edges([(a, c, "used"), (a, b, "used"), (a, b, "used"), (c, b, "used")])
    store.add_edges([(a, b, "used")])  # again: still one edge
    store.add_edges([])
    assert store.targets(a, "used") == [b, c] and store.targets(a, "produced") == []
    assert store.sources(b, "used") == [a, c] and store.sources(a, "used") == []


def test_entity_neighbours_are_the_ops_that_mention_the_names(store: GraphLog) -> None:
    op1 = store.add_node(NewNode("op", "ns", None, "k1"))
    op2 = store.add_node(NewNode("op", "ns", None, "k2"))
    elsewhere = store.add_node(NewNode("op", "other", None, "k1"))
    store.add_edges(
        [
            (op1, store.entity("ns", "42"), "mentions"),
            (op1, store.entity("ns", "lisbon"), "mentions"),
            (op2, store.entity("ns", "lisbon"), "mentions"),
            (elsewhere, store.entity("other", "42"), "mentions"),
        ]
    )
    got = store.entity_neighbours("ns", ["42", "lisbon", "absent"])
    assert got == {op1: {"42", "lisbon"}, op2: {"lisbon"}}
    assert store.entity_neighbours("other", ["42"]) == {elsewhere: {"42"}}
    assert store.entity_neighbours("ns", []) == {}


def test_an_entity_is_one_node_however_many_ops_mention_it(store: GraphLog) -> None:
    first = store.entity("ns", "42")
    assert store.entity("ns", "42") == first
    assert store.entity("other", "42") != first  # per namespace
    assert store.counts() == {"entity": 2}
    assert [n.key for n in store.nodes(NodeQuery("ns", kinds=("entity",)))] == ["42"]


def test_a_node_named_twice_is_marked_stale_once(store: GraphLog) -> None:
    op = store.add_node(NewNode("op", "ns", None, "k"))
    assert store.mark_stale([op, op], "a tool returned something else") == 1
    assert store.mark_stale([op], "again") == 0
    assert store.mark_stale([], "nothing") == 0 and store.mark_stale([op + 1000], "none") == 0
    node = store.node(op)
    assert node is not None and node.stale and node.stale_reason == "a tool returned something else"
    assert store.nodes(NodeQuery("ns", fresh=True)) == []


def test_a_query_names_its_namespace_or_run() -> None:
    with pytest.raises(InvalidRequest, match="namespace or its run_id"):
        NodeQuery(kinds=("op",))


# -- both stores answer alike ---------------------------------------------------------------------
GRAPH_KINDS = ("op", "result", "tool_call", "tool_result")
NAMESPACES = ("acme", "globex")
KEYS = ("k1", "k2", "k3")


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
        st.sampled_from(GRAPH_KINDS),
        st.sampled_from(NAMESPACES),
        st.sampled_from(KEYS),
        st.sampled_from(("", "h1", "h2")),
        st.booleans(),
    ),
    st.tuples(st.just("entity"), st.sampled_from(NAMESPACES), st.sampled_from(("42", "lisbon"))),
    st.tuples(
        st.just("edge"), st.integers(1, 12), st.integers(1, 12), st.sampled_from(GRAPH_KINDS)
    ),
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
    shared = redis_graph(f"{redis_url.split('?')[0]}?prefix=g{uuid.uuid4().hex[:12]}")
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
            for kind in GRAPH_KINDS:
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
