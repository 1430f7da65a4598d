"""The memory graph's store: several writes in one transaction commit together or not at all,
seen from the writing connection and from another one on the same file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from continuum.errors import StoreError
from continuum.store.graph import GraphStore, NewNode


@pytest.fixture
def store(tmp_path: Path) -> Iterator[GraphStore]:
    s = GraphStore(tmp_path / "graph.db")
    yield s
    s.close()


def rows(path: Path) -> tuple[int, int]:
    """(nodes, edges) as another connection sees them."""
    db = sqlite3.connect(path)
    try:
        nodes = db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
        edges = db.execute("SELECT COUNT(*) FROM edges").fetchone()[0]
        return int(nodes), int(edges)
    finally:
        db.close()


def write_op(store: GraphStore) -> None:
    op = store.add_node(NewNode("op", "ns", None, "k", text="Where is order 42 going?"))
    res = store.add_node(NewNode("result", "ns", None, "k", text="Lisbon", meta={"tokens": [1]}))
    store.add_edges([(op, res, "produced"), (op, store.entity("ns", "42"), "mentions")])


def test_a_transaction_commits_every_write_at_its_end(store: GraphStore) -> None:
    with store.transaction():
        write_op(store)
        assert rows(store.path) == (0, 0)  # another connection sees nothing yet
        assert store.counts() == {"op": 1, "result": 1, "entity": 1}  # this one sees its own
        with store.transaction():  # a nested block joins the outer transaction
            store.add_node(NewNode("op", "ns", None, "k2"))
        assert rows(store.path) == (0, 0)
    assert rows(store.path) == (4, 2)


def test_a_failing_transaction_writes_nothing(store: GraphStore) -> None:
    store.add_node(NewNode("op", "ns", None, "before"))  # committed on its own, as before
    with pytest.raises(RuntimeError, match="crash"), store.transaction():
        write_op(store)
        raise RuntimeError("crash after the op, its result and its edges")
    assert rows(store.path) == (1, 0)
    assert store.counts() == {"op": 1}
    assert store.entity("ns", "42") > 0  # the rolled-back entity is created anew
    assert rows(store.path) == (2, 0)


def test_a_failed_write_inside_a_transaction_rolls_back_the_rest(store: GraphStore) -> None:
    with pytest.raises(StoreError, match="nothing was recorded"), store.transaction():
        store.add_node(NewNode("op", "ns", None, "k"))
        # a kind SQLite cannot bind: the second write of the transaction fails
        store.add_edges([(1, 2, "produced"), (1, 3, ["used"])])  # type: ignore[list-item]
    assert rows(store.path) == (0, 0)
    write_op(store)  # the store is usable afterwards
    assert rows(store.path) == (3, 2)


def test_another_writer_waits_for_the_transaction(store: GraphStore, tmp_path: Path) -> None:
    other = sqlite3.connect(store.path, timeout=0)
    try:
        with store.transaction():
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            write_op(store)
        other.execute("BEGIN IMMEDIATE")
        other.rollback()
    finally:
        other.close()
