"""Vector indexes for the semantic tier: exact search for small caches, HNSW for large ones.

All vectors are L2-normalised float32, so the score is the cosine similarity (higher = more
similar, 1.0 = same direction). One small protocol, three implementations:

- :class:`ExactIndex` — a numpy matrix; a query is one matrix-vector product. Exact, and the
  fastest choice while the matrix is small.
- :class:`HNSWIndex` — usearch's HNSW graph (chosen by measurement: see
  ``docs/results/ann-choice.txt``; ``scripts/ann_choice.py`` re-runs it). Approximate: its
  recall@1 is measured and reported there.
- :class:`AutoIndex` — exact up to ``ann_from`` entries, then moves everything into HNSW once
  and continues there. This is what the semantic tier uses.

Keys are non-negative ints chosen by the caller (row ids of the tier's entry table).
"""

from __future__ import annotations

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
    """usearch HNSW over inner product (= cosine on unit vectors)."""

    kind = "hnsw"

    def __init__(
        self,
        dim: int,
        *,
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 64,
    ) -> None:
        from usearch.index import Index

        self.dim = dim
        self._index = Index(
            ndim=dim,
            metric="ip",
            dtype="f32",
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )

    def __len__(self) -> int:
        return len(self._index)

    def add(self, key: int, vector: np.ndarray) -> None:
        if key in self._index:
            self._index.remove(key)
        self._index.add(key, _as_vector(vector, self.dim), threads=1)

    def add_many(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        self._index.add(keys, np.asarray(vectors, dtype=np.float32))

    def remove(self, key: int) -> None:
        if key in self._index:
            self._index.remove(key)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        if len(self._index) == 0 or k <= 0:
            return []
        m = self._index.search(_as_vector(vector, self.dim), k, threads=1)
        # usearch's "ip" distance is 1 - <a, b>
        return [(int(key), 1.0 - float(d)) for key, d in zip(m.keys, m.distances, strict=True)]

    def holds(self, keys: Sequence[int]) -> bool:
        """Whether the index holds exactly ``keys``."""
        return len(self._index) == len(keys) and all(k in self._index for k in keys)

    def save(self, path: Path) -> None:
        self._index.save(str(path))

    @classmethod
    def restore(cls, dim: int, path: Path) -> HNSWIndex | None:
        """Load a saved index, or None when the file is missing or unreadable (rebuild then)."""
        from usearch.index import Index

        if not path.is_file():
            return None
        try:
            loaded = Index.restore(str(path))
        except Exception:  # a torn or foreign file: the caller rebuilds from the vectors
            return None
        if loaded is None or loaded.ndim != dim:
            return None
        out = cls.__new__(cls)
        out.dim = dim
        out._index = loaded
        return out


class AutoIndex:
    """Exact search while small; HNSW from ``ann_from`` entries on."""

    def __init__(self, dim: int, *, ann_from: int = 20_000) -> None:
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
        hnsw = HNSWIndex(self.dim)
        items = self._exact.items()
        hnsw.add_many(
            np.array([k for k, _ in items], dtype=np.uint64), np.stack([v for _, v in items])
        )
        self._hnsw, self._exact = hnsw, None

    def adopt(self, hnsw: HNSWIndex) -> None:
        """Use a restored HNSW index (its entries must be this tier's entries)."""
        self._hnsw, self._exact = hnsw, None

    def remove(self, key: int) -> None:
        self.inner.remove(key)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        return self.inner.search(vector, k)
