"""The layer KV tier: KV snapshots keyed by the prefix they hold, in the one snapshot store.

A hit restores the state with no prefill; the caller then decodes only the suffix. Snapshots
live in the engine's :class:`~continuum.store.snapshots.FileSnapshotStore` — the store parked
sessions use too, with one RAM budget (LRU) and one disk budget (least recently used files
deleted) — under the key ``layer:<prefix hash>``; this tier keeps the radix index of which
token prefix each holds, per namespace. Every snapshot carries its model digest, context config,
namespace, tokens and checksums; one that is corrupt, truncated or incompatible is refused by
the store with a :class:`SnapshotError`, dropped here and counted, and the lookup tries the
next (or misses). Nothing read back from disk is unpickled.

Parked sessions are entries too (:class:`~continuum.stateful.hooks.ParkedIndex`): the engine's
worker announces each parked snapshot with its wake prefix, and a stateless request of the same
tenant that starts with that prefix restores the snapshot into its working sequence and keeps
only the prefix — the tokens decoded as whole prompt batches, so the reuse is exact. A new
session of the tenant whose wake no lane holds starts from the same entries (from a parked
session's, or from what a stateless request left). Those snapshots are borrowed: the session
owns them, and leaving the index, or being read, never deletes one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuum.backends.base import KVBackend
from continuum.errors import SnapshotError
from continuum.metrics import TierOutcome
from continuum.stateful.hooks import IndexedPrefix
from continuum.store.base import SnapshotEntry, SnapshotHit, SnapshotStore
from continuum.store.snapshots import FileSnapshotStore
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss
from continuum.tiers.prefix_kv import PrefixMatch, RadixTrie
from continuum.tiers.state import BackendState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    snapshot_id: str  # the key in the snapshot store
    n_tokens: int
    nbytes: int
    borrowed: bool = False  # a parked session's snapshot: the session owns it, not this tier


class LayerKVTier:
    """A radix index per namespace over snapshots held in a snapshot store."""

    name = "layer_kv"

    def __init__(
        self,
        *,
        store: SnapshotStore | None = None,
        ram_budget_bytes: int = 256 << 20,
        directory: str | Path | None = None,
        disk_budget_bytes: int | None = None,
        max_entries: int = 4096,
        min_suffix: int = 8,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.store: SnapshotStore = store or FileSnapshotStore(
            ram_budget_bytes=ram_budget_bytes,
            directory=self.directory,
            disk_budget_bytes=disk_budget_bytes,
        )
        self.backend: KVBackend | None = None  # set by the engine: where lookups restore to
        self.min_suffix = min_suffix
        self.index: RadixTrie[SnapshotRef] = RadixTrie(max_entries, on_evict=self._forget)
        self.corrupt = 0
        # set by the engine: free context cells for a snapshot of N tokens before restoring it
        self.make_room: Callable[[int], None] | None = None
        # parked sessions by snapshot key: (namespace, wake prefix, ref); one per prefix indexed
        self._parked: dict[str, tuple[str, tuple[int, ...], SnapshotRef]] = {}

    # -- storing -------------------------------------------------------------------------------
    def put(self, namespace: str, tokens: Sequence[int], entry: SnapshotEntry) -> SnapshotRef:
        """Keep ``entry`` (the KV of exactly ``tokens``) and index it; written to disk at once,
        so a saved cache index can name it in another process."""
        key = f"layer:{entry.prefix_hash}"
        ref = SnapshotRef(key, len(tokens), entry.nbytes)
        self.store.put(key, entry, durable=True)
        self.index.insert(namespace, tokens, ref)
        return ref

    def holds(self, namespace: str, tokens: Sequence[int]) -> bool:
        m = self.index.longest(namespace, tokens)
        return m is not None and m.length == len(tokens) == len(m.key)

    def owns(self, namespace: str, tokens: Sequence[int]) -> bool:
        """A snapshot of this tier's own (not a parked session's) holds exactly ``tokens``."""
        ref = self.index.get(namespace, tokens)
        return ref is not None and not ref.borrowed

    def find(self, namespace: str, tokens: Sequence[int]) -> PrefixMatch[SnapshotRef] | None:
        return self.index.longest(namespace, tokens)

    def reach(self, namespace: str, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the longest snapshot prefix would restore (0: none)."""
        found = self.find(namespace, tokens)
        return 0 if found is None else max(0, min(found.length, len(tokens) - self.min_suffix))

    def load(self, ref: SnapshotRef, *, model: str, ctx: dict[str, Any]) -> SnapshotHit | None:
        """The snapshot and where it came from (``ram`` or ``disk``), or None if it is gone;
        SnapshotError if it failed its checks (the store deleted it)."""
        return self.store.get(ref.snapshot_id, model=model, ctx=ctx)

    def drop(self, namespace: str, tokens: Sequence[int], ref: SnapshotRef) -> None:
        """Forget a snapshot found corrupt, incompatible or gone (and delete it, if ours)."""
        self.corrupt += 1
        self.index.remove(namespace, tokens)
        self._parked.pop(ref.snapshot_id, None)
        self._forget(namespace, tuple(tokens), ref)

    def _forget(self, namespace: str, tokens: tuple[int, ...], ref: SnapshotRef) -> None:
        if not ref.borrowed:
            self.store.delete(ref.snapshot_id)

    # -- parked sessions (the ParkedIndex seam) -------------------------------------------------
    def parked(self, namespace: str, key: str, prefix: tuple[int, ...], nbytes: int) -> None:
        """A session's snapshot under ``key`` starts with ``prefix``: index it, unless an entry
        for exactly that prefix is there already (it serves the same tokens)."""
        self.unparked(key)
        ref = SnapshotRef(key, len(prefix), nbytes, borrowed=True)
        self._parked[key] = (namespace, prefix, ref)
        if prefix and not self.holds(namespace, prefix):
            self.index.insert(namespace, prefix, ref)

    def unparked(self, key: str) -> None:
        """The session under ``key`` is live again (or gone): forget its entry, and let another
        parked session with the same prefix take its place."""
        item = self._parked.pop(key, None)
        if item is None:
            return
        ns, prefix, ref = item
        if self.index.get(ns, prefix) is not ref:
            return
        self.index.remove(ns, prefix)
        for other_ns, other_prefix, other in self._parked.values():
            if other_ns == ns and other_prefix == prefix:
                self.index.insert(ns, prefix, other)
                break

    def prefix_snapshot(self, namespace: str, tokens: Sequence[int]) -> IndexedPrefix | None:
        """The snapshot serving the longest prefix of ``tokens`` (a new session's wake starts
        from it: the seam :class:`~continuum.stateful.hooks.ParkedIndex`)."""
        found = self.find(namespace, tokens)
        if found is None or not found.length:
            return None
        return IndexedPrefix(found.handle.snapshot_id, tuple(found.key), found.length)

    def reject(self, namespace: str, found: IndexedPrefix) -> None:
        ref = self.index.get(namespace, found.prefix)
        if ref is not None and ref.snapshot_id == found.key:
            self.drop(namespace, found.prefix, ref)

    def clear(self) -> None:
        """Forget every snapshot and delete them."""
        for ns, tokens, ref in list(self.index.entries()):
            self.index.remove(ns, tokens)
            self._forget(ns, tokens, ref)

    def restore_index(self, namespace: str, tokens: Sequence[int], ref: SnapshotRef) -> bool:
        """Re-register a snapshot listed in saved metadata, if the store still has it."""
        if ref.snapshot_id not in self.store:
            return False
        self.index.insert(namespace, tokens, ref)
        return True

    # -- the Tier protocol ---------------------------------------------------------------------
    def lookup(self, request: TierRequest) -> Hit | Miss:
        """Restore the longest snapshot prefix of the request into the backend's working
        sequence. A snapshot that fails its checks is dropped and counted, and the next one
        is tried; none left is a miss."""
        b = self.backend
        if b is None or not request.policy.enabled:
            return miss(self.name, "skipped", "policy" if b is not None else "no backend")
        ns, tokens = request.namespace, request.tokens
        limit = len(tokens) - self.min_suffix
        errors = 0
        while (found := self.find(ns, tokens)) is not None:
            n = min(found.length, limit)
            if not request.policy.allows_prefix(n):
                break
            try:
                hit = self.load(found.handle, model=request.model, ctx=b.context_config())
                if hit is None:
                    raise SnapshotError("the snapshot is gone")
                held = hit.entry.tokens
                if hit.entry.namespace != ns or held[: len(found.key)] != found.key:
                    raise SnapshotError("the snapshot holds another prefix")
                if self.make_room is not None:
                    self.make_room(len(held))
                b.restore(hit.entry.payload, held, n)
            except SnapshotError as e:
                log.info("layer KV snapshot dropped: %s", e)
                errors += 1
                self.drop(ns, found.key, found.handle)
                continue
            outcome = TierOutcome(self.name, "hit", tokens=n, source=hit.source, rejected=errors)
            return Hit(outcome, reused=n)
        return miss(self.name, rejected=errors)

    def record(self, request: TierRequest, result: TierResult) -> None:
        """Nothing: snapshots arrive when the prefix tier spills a pinned prefix."""

    def stats(self) -> dict[str, Any]:
        s = self.store.stats()
        return {
            "entries": len(self.index),
            "ram_bytes": s.ram_bytes,
            "disk_bytes": s.disk_bytes,
            "ram_evictions": s.ram_evictions,
            "disk_evictions": s.disk_evictions,
            "disk_errors": s.disk_errors,
            "corrupt": self.corrupt,
        }


def pinned_entry(
    kv: KVBackend, namespace: str, tokens: tuple[int, ...], handle: BackendState
) -> SnapshotEntry:
    """The KV of a pinned prefix as a snapshot (``llama_state_seq_get_data`` of its slot)."""
    return SnapshotEntry(
        namespace,
        tokens,
        kv.snapshot(handle.seq_id),
        handle.model,
        dict(kv.context_config()),
        handle.prefix_hash,
    )


__all__ = ["LayerKVTier", "SnapshotRef", "pinned_entry"]
