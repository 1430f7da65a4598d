"""What continuum stores, as records and protocols, independent of where it is stored.

Four things are persisted, each behind one protocol that the layers above program against,
each with an embedded implementation and the Redis one a fleet shares:

    HistoryLog          the authoritative conversation log (DESIGN.md §3.1)
                        store.sqlite, store.redis_history
    SnapshotStore       serialised KV state: parked sessions and layer KV
                        store.snapshots, store.redis_snapshots
    GraphLog            the memory graph of ops, tool calls and results
                        store.graph, store.redis_graph
    CacheMetadataStore  the memo table and snapshot index saved for a restart
                        store.cache_meta, store.redis_cache_meta

(memo results and semantic entries, which the tiers keep in RAM, are shared through
``redis_results`` and ``redis_vectors``). The protocols name no SQLite, file or Redis types; the
records they exchange are defined here, and the concrete modules re-export them. The
protocols are ``runtime_checkable`` (``isinstance`` checks method names only; mypy and the tests
check signatures).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NewType, Protocol, runtime_checkable

import numpy as np

from continuum.messages import Message

SessionId = NewType("SessionId", str)


# -- conversation history ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoredMessage:
    message: Message
    identity: str
    gen_tokens: tuple[int, ...] | None = None
    gen_model: str | None = None


@dataclass(frozen=True, slots=True)
class ContinuityNote:
    """A compacted session's summary of ``history[:window]``, written by the model when those
    messages left the window. It is rendered after the wake prefix, in front of the window's
    first message, while the window starts at or after ``window``; the messages it summarises
    stay in the history."""

    window: int
    text: str


@dataclass(frozen=True, slots=True)
class SessionRecord:
    id: SessionId
    created_at: float
    model_digest: str
    chat_format: str
    system: str | None
    continuity: str | None
    config: dict[str, Any]
    turns: int
    tenant: str = ""  # the namespace that owns the session ("" for none)
    note: ContinuityNote | None = None  # the continuity note of its last compaction


def session_owner(config: dict[str, Any], tenant: str) -> tuple[str, dict[str, Any]]:
    """The tenant a new session belongs to and the config to store with it: ``tenant``, or
    a ``config["tenant"]`` alone (as sessions were before the tenant had a field of its own);
    one that disagrees with ``tenant`` is refused."""
    from continuum.errors import InvalidRequest

    in_config = config.get("tenant", tenant)
    if tenant and in_config != tenant:
        raise InvalidRequest(
            f"create_session got tenant {tenant!r} but config['tenant'] is {in_config!r}; "
            "pass one tenant"
        )
    owner = str(in_config)
    return owner, ({**config, "tenant": owner} if owner else config)


# what a reset records besides its turn (the resets table's columns, a bundle's reset fields)
RESET_FIELDS = ("reason", "detail", "tokens_dropped", "tokens_rebuilt")


@runtime_checkable
class HistoryLog(Protocol):
    """The authoritative log of sessions, messages, turns and resets; each turn is atomic."""

    def create_session(
        self,
        *,
        model_digest: str,
        chat_format: str,
        system: str | None,
        continuity: str | None,
        config: dict[str, Any],
        session_id: str | None = None,
        tenant: str = "",
    ) -> SessionId: ...

    def load_session(self, session_id: str) -> SessionRecord: ...

    def session_tenant(self, session_id: str) -> str: ...

    def count_sessions(self, tenant: str) -> int: ...

    def delete_session(self, session_id: str) -> bool: ...

    def messages(self, session_id: str) -> list[StoredMessage]: ...

    def turns(self, session_id: str) -> list[dict[str, Any]]: ...

    def resets(self, session_id: str) -> list[dict[str, Any]]:
        """Each rebuild of the session's KV: ``turn`` and :data:`RESET_FIELDS`, oldest first."""
        ...

    def commit_turn(
        self,
        session_id: str,
        *,
        keep: int,
        new: list[StoredMessage],
        finish_reason: str,
        metrics: dict[str, Any],
        system: str | None,
        note: ContinuityNote | None = None,
        expected_turn: int | None = None,
    ) -> int: ...

    def import_session(
        self,
        record: SessionRecord,
        messages: Sequence[StoredMessage],
        turns: Sequence[dict[str, Any]],
        resets: Sequence[dict[str, Any]],
    ) -> None:
        """Write a whole session moved from another store (a session bundle) — its row, its
        current messages, its turns and resets — in one step, or nothing:
        :class:`~continuum.errors.SessionExists` if the id is taken."""
        ...

    def put_response(
        self,
        tenant: str,
        response_id: str,
        parent: str | None,
        added: Sequence[Message],
        body: dict[str, Any],
        *,
        retention_s: float | None = None,
    ) -> None: ...

    def get_response(
        self, tenant: str, response_id: str, *, deleted_ok: bool = False
    ) -> tuple[dict[str, Any], list[Message]] | None: ...

    def delete_response(self, tenant: str, response_id: str) -> bool: ...

    def close(self) -> None: ...


# -- KV snapshots -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    """One KV state as the backend saved it, with what it is valid for.

    Kept in RAM as is (not encoded: encoding and hashing megabytes of KV would make parking
    slow); encoded with a checksummed header only when it is written to disk."""

    namespace: str
    tokens: tuple[int, ...]
    payload: bytes
    model: str  # the model file's digest
    ctx: dict[str, Any]  # the context config the state was made under
    prefix_hash: str  # the chained hash of ``tokens`` (DESIGN.md §3.5)

    @property
    def nbytes(self) -> int:
        """What the entry costs against a RAM budget: its payload and its int32 tokens."""
        return len(self.payload) + 4 * len(self.tokens)


class SnapshotHit(NamedTuple):
    entry: SnapshotEntry
    source: Literal["ram", "disk", "shared"]  # shared: a store other processes share (Redis)


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    ram_bytes: int
    ram_entries: int
    disk_bytes: int
    disk_files: int
    ram_evictions: int  # entries pushed out of the RAM budget
    disk_writes: int  # files written (durable puts, write-backs, flushes)
    disk_evictions: int  # files deleted to stay under the disk budget
    disk_errors: int  # writes that failed (full disk) or could not fit the disk budget
    tmp_swept: int  # stray temporary files of an interrupted write removed at start
    rejected: int = 0  # entries found corrupt, truncated or for another model/ctx (deleted)


@runtime_checkable
class SnapshotStore(Protocol):
    """KV snapshots by string key, in RAM and optionally on disk (write-back on RAM eviction).

    ``get`` verifies an entry is for ``model`` and ``ctx`` (and, from disk, intact) and raises
    :class:`~continuum.errors.SnapshotError` naming the key when it is not; the entry is then
    gone. A miss is ``None``."""

    def put(self, key: str, entry: SnapshotEntry, *, durable: bool = False) -> None: ...

    def get(self, key: str, *, model: str, ctx: dict[str, Any]) -> SnapshotHit | None: ...

    def delete(self, key: str) -> bool: ...

    def __contains__(self, key: object) -> bool: ...

    def flush(self, key: str) -> bool: ...

    def flush_all(self) -> int: ...

    def release_ram(self, key: str | None = None) -> int: ...

    def keys(self) -> list[str]: ...

    def stats(self) -> SnapshotStats: ...


# -- the memory graph -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Node:
    id: int
    kind: str
    namespace: str
    run_id: int | None
    key: str
    label: str
    text: str
    hash: str
    meta: dict[str, Any]
    embedding: np.ndarray | None
    embedder: str
    created: float
    stale: bool
    stale_reason: str


@dataclass(frozen=True, slots=True)
class NewNode:
    """A node to add to the graph: a :class:`Node` before the store gives it its id, its
    creation time and its (fresh) stale mark. ``embedder`` names the embedder that made
    ``embedding``, so a vector is only compared with one from the same embedder."""

    kind: str
    namespace: str
    run_id: int | None
    key: str
    label: str = ""
    text: str = ""
    hash: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    embedding: np.ndarray | None = None
    embedder: str = ""


@dataclass(frozen=True, slots=True)
class NodeQuery:
    """Which nodes :meth:`GraphLog.nodes` returns: every field that is set must hold. A query
    names its namespace or its run (runs belong to one namespace), so no query crosses tenants
    (DESIGN.md §3.8)."""

    namespace: str | None = None
    run_id: int | None = None
    kinds: tuple[str, ...] = ()  # any of these kinds (empty: any kind)
    key: str | None = None
    hash: str | None = None
    hash_not: str | None = None  # a hash other than this one
    fresh: bool = False  # not marked stale
    run_not: int | None = None  # of a run, another than this one
    below: int | None = None  # id < below
    newest_first: bool = False  # by id, descending (else ascending)

    def __post_init__(self) -> None:
        if self.namespace is None and self.run_id is None:
            from continuum.errors import InvalidRequest

            raise InvalidRequest("a NodeQuery names its namespace or its run_id")

    def matches(self, node: Node) -> bool:
        return (
            (self.namespace is None or node.namespace == self.namespace)
            and (self.run_id is None or node.run_id == self.run_id)
            and (not self.kinds or node.kind in self.kinds)
            and (self.key is None or node.key == self.key)
            and (self.hash is None or node.hash == self.hash)
            and (self.hash_not is None or node.hash != self.hash_not)
            and not (self.fresh and node.stale)
            and (self.run_not is None or node.run_id not in (None, self.run_not))
            and (self.below is None or node.id < self.below)
        )


@runtime_checkable
class GraphLog(Protocol):
    """Nodes, typed edges and runs of the memory graph; every query is per namespace (or per
    run, which belongs to one namespace)."""

    def transaction(self) -> AbstractContextManager[None]:
        """Writes inside commit together at its end, or not at all."""
        ...

    def add_run(self, namespace: str, label: str) -> int: ...

    def add_node(self, node: NewNode) -> int:
        """Write ``node``, fresh and created now; its new id."""
        ...

    def entity(self, namespace: str, name: str) -> int: ...

    def add_edges(self, edges: Iterable[tuple[int, int, str]]) -> None: ...

    def mark_stale(self, ids: Iterable[int], reason: str) -> int: ...

    def nodes(self, query: NodeQuery) -> list[Node]: ...

    def node(self, node_id: int) -> Node | None: ...

    def targets(self, src: int, kind: str) -> list[int]: ...

    def sources(self, dst: int, kind: str) -> list[int]: ...

    def runs(self, namespace: str) -> list[tuple[int, str, float]]: ...

    def entity_neighbours(self, namespace: str, names: Sequence[str]) -> dict[int, set[str]]: ...

    def counts(self) -> dict[str, int]: ...

    def close(self) -> None: ...


# -- cache metadata ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CacheMetadata:
    meta: dict[str, Any]
    memo: list[tuple[str, int, str, tuple[int, ...], str, int]]
    snapshots: list[tuple[str, tuple[int, ...], str, int, int]]
    # (id, partition, query, version, text, tokens, finish_reason, prompt_tokens, vector)
    semantic: list[tuple[int, str, str, int, str, tuple[int, ...], str, int, bytes]] = field(
        default_factory=list
    )


@runtime_checkable
class CacheMetadataStore(Protocol):
    """One saved :class:`CacheMetadata`, written whole and read back in a new process;
    :class:`~continuum.errors.MetadataError` for one that is missing, corrupt or newer."""

    def save(self, data: CacheMetadata) -> None: ...

    def load(self) -> CacheMetadata: ...


__all__ = [
    "CacheMetadata",
    "CacheMetadataStore",
    "ContinuityNote",
    "GraphLog",
    "HistoryLog",
    "NewNode",
    "Node",
    "NodeQuery",
    "SessionId",
    "SessionRecord",
    "SnapshotEntry",
    "SnapshotHit",
    "SnapshotStats",
    "SnapshotStore",
    "StoredMessage",
    "session_owner",
]
