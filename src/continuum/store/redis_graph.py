"""The memory graph in Redis: the :class:`GraphLog` every process of a fleet shares.

The same nodes, edges and runs as :class:`~continuum.store.graph.GraphStore` (its docstring
draws them), laid out under the target's prefix ``P``::

    P:graph:ids                  counter  node ids (one sequence for every process)
    P:graph:run_ids              counter  run ids
    P:graph:node:<id>            hash     kind namespace run_id key label text hash meta
                                          embedding embedder created stale stale_reason
    P:graph:by_key:<ns,kind,key> zset     node ids (scored by id) of one key
    P:graph:by_kind:<ns,kind>    zset     node ids of one kind in one namespace
    P:graph:by_ns:<ns>           zset     node ids of one namespace
    P:graph:by_run:<run>         zset     node ids of one run
    P:graph:out:<src>:<kind>     set      edge targets;  P:graph:in:<dst>:<kind>  edge sources
    P:graph:entity:<ns,name>     string   the entity node's id
    P:graph:runs:<ns>            hash     run id -> [label, started]
    P:graph:counts               hash     kind -> nodes

(``<ns,kind,…>`` is the JSON list of those values, so no value can run into the next.)

A node hash or run entry this code cannot read (a field missing, bad JSON, a torn embedding:
another version's, or damaged by hand) is a :class:`~continuum.errors.StoreError` naming it,
never a raw KeyError or ValueError.

Every query is answered from the narrowest index its :class:`NodeQuery` names — a key, else a
run, else a kind in a namespace — and filtered with :meth:`NodeQuery.matches`, so it never
leaves its namespace or run (DESIGN.md §3.8).

Transactions. Writes inside :meth:`RedisGraphStore.transaction` are queued and sent as one
``MULTI``/``EXEC`` when the block ends, or dropped if it raises: another process sees a
recorded op whole or not at all, as with SQLite. Unlike SQLite, a read inside the block does not
see the block's own queued writes (the memory graph reads only what was committed before it).
Ids are taken from the counters at once, so a rolled-back block leaves a gap in them. An entity
is created at once, atomically, by a script (look up, else insert): it is a name shared by every
op that mentions it, and one no op points to is harmless.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from continuum.errors import StoreError
from continuum.store.base import GraphLog, NewNode, Node, NodeQuery
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_schema import ready

# KEYS: entity node-prefix by_key by_kind by_ns counts ids; ARGV: namespace name created
_ENTITY = """
local found = redis.call('GET', KEYS[1])
if found then return tonumber(found) end
local id = redis.call('INCR', KEYS[7])
local node = KEYS[2] .. id
redis.call('HSET', node, 'kind', 'entity', 'namespace', ARGV[1], 'run_id', '', 'key', ARGV[2],
  'label', '', 'text', '', 'hash', '', 'meta', '{}', 'embedder', '', 'created', ARGV[3],
  'stale', '0', 'stale_reason', '')
redis.call('ZADD', KEYS[3], id, id)
redis.call('ZADD', KEYS[4], id, id)
redis.call('ZADD', KEYS[5], id, id)
redis.call('HINCRBY', KEYS[6], 'entity', 1)
redis.call('SET', KEYS[1], id)
return id
"""


def _tag(*values: object) -> str:
    return json.dumps(values, separators=(",", ":"))


def _text(value: bytes | None) -> str:
    return value.decode() if value is not None else ""


class RedisGraphStore:
    def __init__(self, target: RedisTarget, *, owns_target: bool = False) -> None:
        self.target = target
        self._owns = owns_target
        ready(target)
        self._lock = threading.RLock()
        self._pending: Any = None  # the open transaction's pipeline
        self._ids = target.key("graph", "ids")
        self._counts = target.key("graph", "counts")

    def close(self) -> None:
        if self._owns:
            self.target.close()

    def _key(self, *parts: str) -> str:
        return self.target.key("graph", *parts)

    def _node_key(self, node_id: int | str) -> str:
        return self._key("node", str(node_id))

    # -- transactions ----------------------------------------------------------------------------
    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside the block are sent together when it ends, or not at all if it raises;
        a nested block joins the outer one."""
        return self._transaction()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            if self._pending is not None:
                yield
                return
            self._pending = self.target.client.pipeline(transaction=True)
            try:
                yield
                self.target.call(self._pending.execute)
            finally:
                self._pending.reset()
                self._pending = None

    @contextmanager
    def _writing(self) -> Iterator[Any]:
        """A pipeline for one write: the open transaction's, or one sent when the block ends."""
        with self._transaction():
            yield self._pending

    # -- writes ----------------------------------------------------------------------------------
    def add_run(self, namespace: str, label: str) -> int:
        run = int(self.target.call(self.target.client.incr, self._key("run_ids")))
        with self._writing() as pipe:
            pipe.hset(self._key("runs", _tag(namespace)), str(run), _tag(label, time.time()))
        return run

    def add_node(self, node: NewNode) -> int:
        node_id = int(self.target.call(self.target.client.incr, self._ids))
        fields: dict[str, Any] = {
            "kind": node.kind,
            "namespace": node.namespace,
            "run_id": "" if node.run_id is None else node.run_id,
            "key": node.key,
            "label": node.label,
            "text": node.text,
            "hash": node.hash,
            "meta": json.dumps(node.meta),
            "embedder": node.embedder,
            "created": time.time(),
            "stale": 0,
            "stale_reason": "",
        }
        if node.embedding is not None:
            fields["embedding"] = np.asarray(node.embedding, np.float32).tobytes()
        with self._writing() as pipe:
            pipe.hset(self._node_key(node_id), mapping=fields)
            for index in self._indexes(node.kind, node.namespace, node.run_id, node.key):
                pipe.zadd(index, {str(node_id): node_id})
            pipe.hincrby(self._counts, node.kind, 1)
        return node_id

    def _indexes(self, kind: str, namespace: str, run_id: int | None, key: str) -> list[str]:
        out = [
            self._key("by_key", _tag(namespace, kind, key)),
            self._key("by_kind", _tag(namespace, kind)),
            self._key("by_ns", _tag(namespace)),
        ]
        if run_id is not None:
            out.append(self._key("by_run", str(run_id)))
        return out

    def entity(self, namespace: str, name: str) -> int:
        keys = [
            self._key("entity", _tag(namespace, name)),
            self._key("node", ""),
            *self._indexes("entity", namespace, None, name),
            self._counts,
            self._ids,
        ]
        return int(self.target.run("graph_entity", _ENTITY, keys, [namespace, name, time.time()]))

    def add_edges(self, edges: Iterable[tuple[int, int, str]]) -> None:
        rows = list(edges)  # before the write: building them may itself write (entities)
        if not rows:
            return
        with self._writing() as pipe:
            for src, dst, kind in rows:
                pipe.sadd(self._key("out", str(src), kind), str(dst))
                pipe.sadd(self._key("in", str(dst), kind), str(src))

    def mark_stale(self, ids: Iterable[int], reason: str) -> int:
        """Mark ``ids`` stale; the number that were not stale before (each counted once)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        client = self.target.client
        flags = self.target.call(
            lambda: [client.hmget(self._node_key(i), "kind", "stale") for i in ids]
        )
        fresh = [i for i, (kind, stale) in zip(ids, flags, strict=True) if kind and stale == b"0"]
        with self._writing() as pipe:
            for i in fresh:
                pipe.hset(self._node_key(i), mapping={"stale": 1, "stale_reason": reason})
        return len(fresh)

    # -- reads -----------------------------------------------------------------------------------
    def nodes(self, query: NodeQuery) -> list[Node]:
        ns, kinds = query.namespace, query.kinds
        if ns is not None and query.key is not None and kinds:
            index = [self._key("by_key", _tag(ns, kind, query.key)) for kind in kinds]
        elif query.run_id is not None:
            index = [self._key("by_run", str(query.run_id))]
        elif kinds:
            index = [self._key("by_kind", _tag(ns, kind)) for kind in kinds]
        else:
            index = [self._key("by_ns", _tag(ns))]
        ids: set[int] = set()
        for name in index:
            ids.update(int(m) for m in self.target.call(self.target.client.zrange, name, 0, -1))
        found = [n for n in self._load(sorted(ids)) if query.matches(n)]
        found.sort(key=lambda n: n.id, reverse=query.newest_first)
        return found

    def _load(self, ids: Sequence[int]) -> list[Node]:
        if not ids:
            return []

        def fetch() -> list[dict[bytes, bytes]]:
            pipe = self.target.client.pipeline(transaction=False)
            for i in ids:
                pipe.hgetall(self._node_key(i))
            return list(pipe.execute())

        rows = self.target.call(fetch)
        out = []
        for i, row in zip(ids, rows, strict=True):
            if not row:
                continue
            try:
                out.append(_node(i, row))
            except (KeyError, ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
                raise self._corrupt(f"graph node {i} ({self._node_key(i)})", e) from None
        return out

    def _corrupt(self, what: str, e: Exception) -> StoreError:
        why = f"field {e} missing" if isinstance(e, KeyError) else str(e)
        return StoreError(
            self.target.url,
            f"corrupt {what}: {why}; delete it (the memory graph loses only what it held) or "
            "restore Redis from a backup",
        )

    def node(self, node_id: int) -> Node | None:
        found = self._load([node_id])
        return found[0] if found else None

    def _members(self, name: str) -> list[int]:
        return sorted(int(m) for m in self.target.call(self.target.client.smembers, name))

    def targets(self, src: int, kind: str) -> list[int]:
        return self._members(self._key("out", str(src), kind))

    def sources(self, dst: int, kind: str) -> list[int]:
        return self._members(self._key("in", str(dst), kind))

    def runs(self, namespace: str) -> list[tuple[int, str, float]]:
        name = self._key("runs", _tag(namespace))
        raw = self.target.call(self.target.client.hgetall, name)
        out = []
        for run, value in raw.items():
            try:
                label, started = json.loads(value)
                out.append((int(run), str(label), float(started)))
            except (ValueError, TypeError) as e:  # bad JSON or numbers, not a [label, started] pair
                raise self._corrupt(f"graph run {_text(run)!r} (field of {name})", e) from None
        return sorted(out)

    def entity_neighbours(self, namespace: str, names: Sequence[str]) -> dict[int, set[str]]:
        """op nodes of ``namespace`` mentioning any of ``names``: {op id: the names it shares}."""
        out: dict[int, set[str]] = {}
        for name in names:
            found = self.target.call(
                self.target.client.get, self._key("entity", _tag(namespace, name))
            )
            if found is None:
                continue
            for src in self._members(self._key("in", _text(found), "mentions")):
                out.setdefault(src, set()).add(name)
        return out

    def counts(self) -> dict[str, int]:
        raw = self.target.call(self.target.client.hgetall, self._counts)
        return {_text(k): int(v) for k, v in raw.items() if int(v)}


def _node(node_id: int, row: dict[bytes, bytes]) -> Node:
    """The node a hash holds; KeyError, ValueError or TypeError when it cannot be read."""
    f = {_text(k): v for k, v in row.items()}
    blob = f.get("embedding")
    run = _text(f.get("run_id"))
    meta = json.loads(f.get("meta") or b"{}")
    if not isinstance(meta, dict):
        raise TypeError(f"meta is a JSON {type(meta).__name__}, not an object")
    return Node(
        node_id,
        _text(f["kind"]),
        _text(f["namespace"]),
        int(run) if run else None,
        _text(f["key"]),
        _text(f.get("label")),
        _text(f.get("text")),
        _text(f.get("hash")),
        meta,
        np.frombuffer(blob, dtype=np.float32).copy() if blob is not None else None,
        _text(f.get("embedder")),
        float(f.get("created") or 0),
        f.get("stale") == b"1",
        _text(f.get("stale_reason")),
    )


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: RedisGraphStore) -> GraphLog:
        return store


__all__ = ["RedisGraphStore"]
