"""The memory graph's storage: one SQLite file (WAL), shared by every process that opens it.

Nodes of five kinds, each in one table row, and typed edges between them:

    run            one agent run (a Session's lifetime in one process), per namespace
    op             a model call: canonical op key, op name, the final user turn, its embedding
    result         what an op returned (text, token ids, finish reason)
    tool_call      a tool invocation: tool key (name + canonical arguments)
    tool_result    what that invocation returned (canonical JSON) and its digest
    entity         a name, number or quoted string mentioned by an op or a result

    produced   op -> result, tool_call -> tool_result
    used       op -> tool_result | result   (the op's input contained that output)
    mentions   op | result -> entity

Every node carries its namespace and run; every query filters on namespace first (DESIGN.md
§3.8). ``stale`` marks nodes invalidated by a changed tool result.

Writes made inside :meth:`GraphStore.transaction` commit together when the block ends, or not at
all; every other write commits on its own. The memory graph records each op (its op and result
nodes, ``produced`` and ``used`` edges, entities and ``mentions``) and each tool call (call,
result, edge, mentions and the stale marks it causes) in one transaction, so a crash loses the op
or tool call in flight entirely and never leaves part of one; another process sees each one once
it is committed. A graph written by an older continuum, which committed each write on its own,
can hold an op without its result; :mod:`continuum.tiers.memory_graph` skips such ops on read.

The schema is a list of numbered migrations (:mod:`continuum.store.migrations`); a graph written
by a newer continuum is refused with nothing in it changed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from continuum.errors import StoreError
from continuum.store.base import GraphLog, NewNode, Node, NodeQuery
from continuum.store.migrations import Migration, latest_version, migrate

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, namespace TEXT NOT NULL, label TEXT NOT NULL, started REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    run_id INTEGER,
    key TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL DEFAULT '',
    hash TEXT NOT NULL DEFAULT '',
    meta TEXT NOT NULL DEFAULT '{}',
    embedding BLOB,
    embedder TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    stale INTEGER NOT NULL DEFAULT 0,
    stale_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS nodes_key ON nodes (namespace, kind, key);
CREATE INDEX IF NOT EXISTS nodes_run ON nodes (run_id, kind);
CREATE TABLE IF NOT EXISTS edges (
    src INTEGER NOT NULL, dst INTEGER NOT NULL, kind TEXT NOT NULL, PRIMARY KEY (src, dst, kind)
);
CREATE INDEX IF NOT EXISTS edges_dst ON edges (dst, kind);
"""
MIGRATIONS = (Migration(1, "runs, nodes and edges", _SCHEMA_V1),)
SCHEMA_VERSION = latest_version(MIGRATIONS)


_COLUMNS = (
    "id, kind, namespace, run_id, key, label, text, hash, meta, embedding, embedder, created, "
    "stale, stale_reason"
)


def _node(row: tuple[Any, ...]) -> Node:
    emb = np.frombuffer(row[9], dtype=np.float32).copy() if row[9] is not None else None
    return Node(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        json.loads(row[8]),
        emb,
        row[10],
        row[11],
        bool(row[12]),
        row[13],
    )


def _where(q: NodeQuery) -> tuple[str, list[Any]]:
    """``q`` as a SQL filter with its arguments (see :meth:`NodeQuery.matches`)."""
    terms: list[str] = []
    args: list[Any] = []
    for column, op, value in (
        ("namespace", "=", q.namespace),
        ("run_id", "=", q.run_id),
        ("key", "=", q.key),
        ("hash", "=", q.hash),
        ("hash", "!=", q.hash_not),
        ("run_id", "!=", q.run_not),
        ("id", "<", q.below),
    ):
        if value is not None:
            terms.append(f"{column}{op}?")
            args.append(value)
    if q.kinds:
        terms.append(f"kind IN ({','.join('?' * len(q.kinds))})")
        args.extend(q.kinds)
    if q.fresh:
        terms.append("stale=0")
    return " AND ".join(terms), args


class GraphStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
            # migrate before switching to WAL: a graph from a newer continuum is refused before
            # anything (the journal mode included) is written to it
            migrate(db, MIGRATIONS, path=self.path, what="memory graph", option="--graph")
            db.execute("PRAGMA journal_mode=WAL")
        except (sqlite3.Error, StoreError) as e:
            if db is not None:
                db.close()
            if isinstance(e, StoreError):
                raise
            raise StoreError(self.path, f"cannot be opened as a memory graph ({e})") from None
        self._db = db
        # one connection for every thread: a transaction holds the lock until it ends, so no
        # other thread reads its uncommitted rows or commits them early
        self._lock = threading.RLock()
        self._in_transaction = False

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def transaction(self) -> AbstractContextManager[None]:
        """Every write inside the block commits when it ends, or none does if it raises. It
        takes the file's write lock at once (``BEGIN IMMEDIATE``), so reads inside it, such as
        an entity looked up before it is inserted, are not raced by another process. A nested
        block joins the outer transaction."""
        return self._transaction()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            if self._in_transaction:
                yield
                return
            try:
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    self._in_transaction = True
                    try:
                        yield
                    finally:
                        self._in_transaction = False
            except sqlite3.Error as e:
                raise StoreError(self.path, f"write failed ({e}); nothing was recorded") from None

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """The connection for one write: it joins the open transaction, or commits alone."""
        try:
            with self._lock:
                if self._in_transaction:
                    yield self._db
                else:
                    with self._db:
                        yield self._db
        except sqlite3.Error as e:
            raise StoreError(self.path, f"write failed ({e}); nothing was recorded") from None

    def _write(self, sql: str, args: Sequence[Any] = ()) -> int:
        with self._writing() as db:
            return int(db.execute(sql, args).lastrowid or 0)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(self.path, f"read failed ({e})") from None

    # -- writes ----------------------------------------------------------------------------------
    def add_run(self, namespace: str, label: str) -> int:
        return self._write(
            "INSERT INTO runs (namespace, label, started) VALUES (?, ?, ?)",
            (namespace, label, time.time()),
        )

    def add_node(self, node: NewNode) -> int:
        embedding = node.embedding
        blob = None if embedding is None else np.asarray(embedding, np.float32).tobytes()
        return self._write(
            "INSERT INTO nodes (kind, namespace, run_id, key, label, text, hash, meta, embedding,"
            " embedder, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                node.kind,
                node.namespace,
                node.run_id,
                node.key,
                node.label,
                node.text,
                node.hash,
                json.dumps(node.meta),
                blob,
                node.embedder,
                time.time(),
            ),
        )

    def entity(self, namespace: str, name: str) -> int:
        with self.transaction():  # the lookup and the insert, as one
            rows = self._read(
                "SELECT id FROM nodes WHERE namespace=? AND kind='entity' AND key=?",
                (namespace, name),
            )
            return (
                int(rows[0][0]) if rows else self.add_node(NewNode("entity", namespace, None, name))
            )

    def add_edges(self, edges: Iterable[tuple[int, int, str]]) -> None:
        rows = list(edges)  # before the write: building them may itself write (entities)
        with self._writing() as db:
            db.executemany("INSERT OR IGNORE INTO edges VALUES (?, ?, ?)", rows)

    def mark_stale(self, ids: Iterable[int], reason: str) -> int:
        ids = list(ids)
        if not ids:
            return 0
        with self._writing() as db:
            cur = db.executemany(
                "UPDATE nodes SET stale=1, stale_reason=? WHERE id=? AND stale=0",
                [(reason, i) for i in ids],
            )
            return int(cur.rowcount)

    # -- reads -----------------------------------------------------------------------------------
    def nodes(self, query: NodeQuery) -> list[Node]:
        where, args = _where(query)
        order = "DESC" if query.newest_first else "ASC"
        rows = self._read(f"SELECT {_COLUMNS} FROM nodes WHERE {where} ORDER BY id {order}", args)
        return [_node(r) for r in rows]

    def node(self, node_id: int) -> Node | None:
        found = self._read(f"SELECT {_COLUMNS} FROM nodes WHERE id=?", (node_id,))
        return _node(found[0]) if found else None

    def targets(self, src: int, kind: str) -> list[int]:
        return [
            r[0]
            for r in self._read(
                "SELECT dst FROM edges WHERE src=? AND kind=? ORDER BY dst", (src, kind)
            )
        ]

    def sources(self, dst: int, kind: str) -> list[int]:
        return [
            r[0]
            for r in self._read(
                "SELECT src FROM edges WHERE dst=? AND kind=? ORDER BY src", (dst, kind)
            )
        ]

    def runs(self, namespace: str) -> list[tuple[int, str, float]]:
        return [
            (r[0], r[1], r[2])
            for r in self._read(
                "SELECT id, label, started FROM runs WHERE namespace=? ORDER BY id", (namespace,)
            )
        ]

    def entity_neighbours(self, namespace: str, names: Sequence[str]) -> dict[int, set[str]]:
        """op nodes of ``namespace`` mentioning any of ``names``: {op id: the names it shares}."""
        if not names:
            return {}
        marks = ",".join("?" * len(names))
        rows = self._read(
            "SELECT e.src, n.key FROM edges e JOIN nodes n ON n.id = e.dst "
            f"WHERE e.kind='mentions' AND n.kind='entity' AND n.namespace=? AND n.key IN ({marks})",
            (namespace, *names),
        )
        out: dict[int, set[str]] = {}
        for src, name in rows:
            out.setdefault(src, set()).add(name)
        return out

    def counts(self) -> dict[str, int]:
        return {k: n for k, n in self._read("SELECT kind, COUNT(*) FROM nodes GROUP BY kind")}


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: GraphStore) -> GraphLog:
        return store


__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "GraphLog",
    "GraphStore",
    "NewNode",
    "Node",
    "NodeQuery",
]
