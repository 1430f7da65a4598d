"""The semantic tier's entries: each stored answer with its embedding, one vector index per
partition, LRU eviction past a capacity, the id numbering, and the saved indexes.

An id names exactly one entry, in exactly one partition's index. With a fleet's shared log,
ids below :data:`LOCAL_IDS` come from the shared counter; this process numbers its own entries
(stored while the log was unreachable, loaded from saved metadata, or held before sharing)
from :data:`LOCAL_IDS` on, a range the counter never reaches.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from continuum.tiers.vectors import AutoIndex, HNSWIndex

LOCAL_IDS = 1 << 62


@dataclass(frozen=True, slots=True)
class SemanticEntry:
    id: int
    partition: str
    query: str
    version: int
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int


class SemanticEntries:
    def __init__(
        self,
        dim: int,
        *,
        capacity: int,
        ann_from: int,
        on_evict: Callable[[int], None] | None = None,
    ) -> None:
        self.dim = dim
        self.on_evict = on_evict  # told each evicted entry's id
        self.capacity = capacity
        self.ann_from = ann_from
        self.evictions = 0
        self.local_only = True  # False once a shared log numbers entries (see own_id)
        self._entries: OrderedDict[int, SemanticEntry] = OrderedDict()
        self._vectors: dict[int, np.ndarray] = {}
        self._indexes: dict[str, AutoIndex] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: int) -> bool:
        return entry_id in self._entries

    def get(self, entry_id: int) -> SemanticEntry | None:
        return self._entries.get(entry_id)

    def touch(self, entry_id: int) -> None:
        """Mark an entry just served (the last to be evicted)."""
        self._entries.move_to_end(entry_id)

    def index(self, partition: str) -> AutoIndex | None:
        return self._indexes.get(partition)

    def rows(self) -> list[tuple[SemanticEntry, np.ndarray]]:
        return [(e, self._vectors[i]) for i, e in self._entries.items()]

    def own_id(self) -> int:
        """An id no other entry here has; sharing a log, one of the local range."""
        if not self.local_only:
            self._next_id = max(self._next_id, LOCAL_IDS)
        self._next_id += 1
        return self._next_id - 1

    def share(self) -> None:
        """From now on ids come from a shared counter: entries held already were numbered
        here, and the counter hands out the same numbers, so they move to the local range."""
        self.local_only = False
        for entry, vector in self.rows():
            if entry.id < LOCAL_IDS:
                self.forget(entry.id)
                if self.on_evict is not None:  # what was learned under the old id goes with it
                    self.on_evict(entry.id)
                self.insert(dataclasses.replace(entry, id=self.own_id()), vector, index=True)

    def insert(self, entry: SemanticEntry, vector: np.ndarray, *, index: bool) -> None:
        old = self._entries.get(entry.id)
        if old is not None and old.partition != entry.partition:
            # an id is in exactly one partition's index: the one of the entry it names now
            self._indexes[old.partition].remove(entry.id)
        self._entries[entry.id] = entry
        self._vectors[entry.id] = vector
        part = self._indexes.get(entry.partition)
        if part is None:
            part = self._indexes[entry.partition] = AutoIndex(self.dim, ann_from=self.ann_from)
        if index:
            part.add(entry.id, vector)
        while len(self._entries) > self.capacity:
            oldest = next(iter(self._entries))
            self.forget(oldest)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(oldest)

    def replace(self, entry: SemanticEntry) -> None:
        """A held entry's new result (same id, partition, query and vector)."""
        assert self._entries[entry.id].partition == entry.partition
        self._entries[entry.id] = entry

    def forget(self, entry_id: int) -> None:
        old = self._entries.pop(entry_id)
        self._vectors.pop(entry_id, None)
        self._indexes[old.partition].remove(entry_id)

    # -- persistence -------------------------------------------------------------------------------
    def save_indexes(self, directory: Path) -> None:
        """Write each HNSW partition index next to the metadata (exact ones are rebuilt)."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, index in self._indexes.items():
            if isinstance(index.inner, HNSWIndex):
                index.inner.save(directory / _index_file(name))

    def load(
        self, rows: Sequence[tuple[SemanticEntry, np.ndarray]], directory: Path | None
    ) -> dict[str, int]:
        """Re-register saved entries (keeping their versions). A partition's HNSW index is read
        from ``directory`` when its file is there and holds exactly the saved entries; otherwise
        the index is rebuilt from the saved vectors.

        Saved ids are another process's numbering. They are kept only when no log is shared
        and no other entry here has them; otherwise the entry gets an id of this process's own
        (:meth:`own_id`), so no id can name two entries — with a shared log, the counter would
        hand a saved id to another entry, maybe another tenant's. An entry held already,
        identical (mirrored from the shared log it was saved from), is kept once."""
        comparable = [(e, v) for e, v in rows if v.shape == (self.dim,)]
        skipped = len(rows) - len(comparable)  # another embedder's dimension: never comparable
        if comparable and self.local_only:  # ids handed out later stay above the saved ones
            self._next_id = max(self._next_id, 1 + max(e.id for e, _ in comparable))
        by_partition: dict[str, list[tuple[SemanticEntry, np.ndarray]]] = {}
        taken: set[int] = set()
        for entry, vector in comparable:
            if self._entries.get(entry.id) == entry:
                continue
            if not self.local_only or entry.id in self._entries or entry.id in taken:
                entry = dataclasses.replace(entry, id=self.own_id())
            taken.add(entry.id)
            by_partition.setdefault(entry.partition, []).append((entry, vector))
        rebuilt = reused = 0
        for name, items in by_partition.items():
            saved = None
            if directory is not None and len(items) >= self.ann_from:
                saved = HNSWIndex.restore(self.dim, directory / _index_file(name))
                if saved is not None and not saved.holds([e.id for e, _ in items]):
                    saved = None
            for entry, vector in items:
                self.insert(entry, vector, index=saved is None)
            if saved is not None:
                self._indexes[name].adopt(saved)
                reused += 1
            else:
                rebuilt += 1
        return {
            "entries": len(rows) - skipped,
            "skipped": skipped,
            "indexes_loaded": reused,
            "indexes_rebuilt": rebuilt,
        }


def _index_file(partition: str) -> str:
    return partition.replace(":", "_") + ".hnsw"
