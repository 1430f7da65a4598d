"""Vector indexes for the semantic tier: exact search for small caches, HNSW for large ones.

All vectors are L2-normalised float32, so the score is the cosine similarity (higher = more
similar, 1.0 = same direction). One small protocol, three implementations:

- :class:`ExactIndex` — a numpy matrix; a query is one matrix-vector product. Exact, and the
  fastest choice while the matrix is small.
- :class:`HNSWIndex` — hnswlib's HNSW graph, chosen by measurement against usearch and faiss
  (``docs/results/ann-choice.txt``, from the dated record
  ``docs/records/2026-11-29-ann-choice.py``): the fastest query at 100k entries, recall@1
  0.998 with M=32, and deletion (faiss's HNSW has none). Approximate search can only miss a
  better candidate, never invent one: a miss costs a cold call.
- :class:`AutoIndex` — exact up to ``ann_from`` (10,000) entries, then moves everything into
  HNSW once and continues there. This is what the semantic tier uses. (Exact numpy search takes
  about 0.7 ms at 10k entries and passes 5 ms near 33k on this machine; HNSW is faster from
  about 3k on, but exact search never misses.)

Keys are non-negative ints chosen by the caller (row ids of the tier's entry table).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from continuum.errors import InvalidRequest


class VectorIndex(Protocol):
    dim: int

    def __len__(self) -> int: ...
    def add(self, key: int, vector: np.ndarray) -> None: ...
    def remove(self, key: int) -> None: ...
    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (key, cosine) pairs, best first."""
        ...


def _as_vector(vector: np.ndarray, dim: int) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    if v.shape[0] != dim:
        raise InvalidRequest(f"expected a {dim}-dimensional vector, got {v.shape[0]}")
    return v


class ExactIndex:
    kind = "exact"

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._keys = np.empty(0, dtype=np.int64)
        self._matrix = np.empty((0, dim), dtype=np.float32)
        self._n = 0
        self._row: dict[int, int] = {}

    def __len__(self) -> int:
        return self._n

    def add(self, key: int, vector: np.ndarray) -> None:
        v = _as_vector(vector, self.dim)
        if key in self._row:
            self._matrix[self._row[key]] = v
            return
        if self._n == len(self._keys):  # grow geometrically: amortised O(1) inserts
            cap = max(64, 2 * len(self._keys))
            self._keys = np.resize(self._keys, cap)
            grown = np.empty((cap, self.dim), dtype=np.float32)
            grown[: self._n] = self._matrix[: self._n]
            self._matrix = grown
        self._keys[self._n] = key
        self._matrix[self._n] = v
        self._row[key] = self._n
        self._n += 1

    def remove(self, key: int) -> None:
        row = self._row.pop(key, None)
        if row is None:
            return
        last = self._n - 1
        if row != last:  # move the last row into the hole
            self._matrix[row] = self._matrix[last]
            moved = int(self._keys[last])
            self._keys[row] = moved
            self._row[moved] = row
        self._n = last

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        if self._n == 0 or k <= 0:
            return []
        scores = self._matrix[: self._n] @ _as_vector(vector, self.dim)
        k = min(k, self._n)
        top = np.argpartition(-scores, k - 1)[:k] if k < self._n else np.arange(self._n)
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self._keys[i]), float(scores[i])) for i in top]

    def items(self) -> list[tuple[int, np.ndarray]]:
        return [(int(self._keys[i]), self._matrix[i]) for i in range(self._n)]


class HNSWIndex:
    """hnswlib HNSW over inner product (= cosine on unit vectors), M=32, ef_search=64.

    Measured at 100k clustered vectors (docs/results/ann-choice.txt): 0.18 ms median query,
    recall@1 0.998 against exact search. Removal marks a node deleted; its slot is reused by a
    later insert. Capacity doubles as needed.
    """

    kind = "hnsw"
    M = 32
    EF_CONSTRUCTION = 128
    EF_SEARCH = 64

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        import hnswlib

        self.dim = dim
        self._index = hnswlib.Index(space="ip", dim=dim)
        self._index.init_index(
            max_elements=capacity,
            ef_construction=self.EF_CONSTRUCTION,
            M=self.M,
            allow_replace_deleted=True,
        )
        self._configure()
        self._keys: set[int] = set()

    def _configure(self) -> None:
        self._index.set_ef(self.EF_SEARCH)  # not stored in a saved index: set after every load
        self._index.set_num_threads(1)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def _reserve(self, n: int) -> None:
        capacity = self._index.get_max_elements()
        if self._index.get_current_count() + n > capacity:
            self._index.resize_index(max(2 * capacity, self._index.get_current_count() + n))

    def add(self, key: int, vector: np.ndarray) -> None:
        self.add_many(np.array([key]), _as_vector(vector, self.dim)[None, :])

    def add_many(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        fresh = [int(k) for k in keys if int(k) not in self._keys]
        self._reserve(len(fresh))
        self._index.add_items(
            np.asarray(vectors, dtype=np.float32),
            np.asarray(keys, dtype=np.int64),
            replace_deleted=True,
        )
        self._keys.update(int(k) for k in keys)

    def remove(self, key: int) -> None:
        if key in self._keys:
            self._index.mark_deleted(key)
            self._keys.discard(key)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        k = min(k, len(self._keys))
        if k <= 0:
            return []
        labels, distances = self._index.knn_query(_as_vector(vector, self.dim), k=k)
        # hnswlib's "ip" distance is 1 - <a, b>
        return [(int(key), 1.0 - float(d)) for key, d in zip(labels[0], distances[0], strict=True)]

    def holds(self, keys: Sequence[int]) -> bool:
        """Whether the index holds exactly ``keys``."""
        return self._keys == {int(k) for k in keys}

    def save(self, path: Path) -> None:
        self._index.save_index(str(path))
        header = {"dim": self.dim, "M": self.M, "keys": sorted(self._keys)}
        path.with_name(path.name + ".json").write_text(json.dumps(header))

    @classmethod
    def restore(cls, dim: int, path: Path) -> HNSWIndex | None:
        """Load a saved index, or None when it is missing, torn or of another dimension (the
        caller then rebuilds it from the stored vectors)."""
        import hnswlib

        try:
            header = json.loads(path.with_name(path.name + ".json").read_text())
            if header["dim"] != dim or header["M"] != cls.M or not path.is_file():
                return None
            out = cls.__new__(cls)
            out.dim = dim
            out._index = hnswlib.Index(space="ip", dim=dim)
            out._index.load_index(str(path), allow_replace_deleted=True)
            out._configure()
            out._keys = {int(k) for k in header["keys"]}
            if out._index.get_current_count() < len(out._keys):
                return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError):
            return None
        return out


class AutoIndex:
    """Exact search while small; HNSW from ``ann_from`` entries on."""

    def __init__(self, dim: int, *, ann_from: int = 10_000) -> None:
        self.dim = dim
        self.ann_from = ann_from
        self._exact: ExactIndex | None = ExactIndex(dim)
        self._hnsw: HNSWIndex | None = None

    @property
    def kind(self) -> str:
        return "exact" if self._exact is not None else "hnsw"

    @property
    def inner(self) -> ExactIndex | HNSWIndex:
        inner = self._exact if self._exact is not None else self._hnsw
        assert inner is not None
        return inner

    def __len__(self) -> int:
        return len(self.inner)

    def add(self, key: int, vector: np.ndarray) -> None:
        self.inner.add(key, vector)
        if self._exact is not None and len(self._exact) >= self.ann_from:
            self._promote()

    def _promote(self) -> None:
        assert self._exact is not None
        items = self._exact.items()
        hnsw = HNSWIndex(self.dim, capacity=2 * len(items))
        hnsw.add_many(
            np.array([k for k, _ in items], dtype=np.int64), np.stack([v for _, v in items])
        )
        self._hnsw, self._exact = hnsw, None

    def adopt(self, hnsw: HNSWIndex) -> None:
        """Use a restored HNSW index (its entries must be this tier's entries)."""
        self._hnsw, self._exact = hnsw, None

    def remove(self, key: int) -> None:
        self.inner.remove(key)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        return self.inner.search(vector, k)
