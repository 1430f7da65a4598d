"""The SQLite memory graph's own behaviour: a write SQLite cannot bind rolls back its whole
transaction, and the transaction holds the file's write lock.

The :class:`~continuum.store.base.GraphLog` contract it shares with the Redis store (writes in a
transaction seen whole or not at all, what is written reads back) is tested on both in
``test_base_graph.py``."""

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
