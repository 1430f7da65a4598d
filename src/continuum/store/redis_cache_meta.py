"""Cache metadata in Redis: the :class:`CacheMetadataStore` of ``save_cache_metadata("redis://…")``.

One hash, ``P:cache_meta``, written whole in one ``MULTI``/``EXEC`` (a failed save leaves the
previous one), with the same format version as the SQLite file
(:data:`continuum.store.cache_meta.FORMAT_VERSION`): ``meta``, ``memo``, ``snapshots`` and
``semantic`` are JSON, and the semantic vectors are one float32 blob in row order. Nothing is
pickled. A metadata hash from a newer continuum is refused with nothing changed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from continuum.errors import MetadataError
from continuum.store.base import CacheMetadata, CacheMetadataStore
from continuum.store.cache_meta import FORMAT_VERSION
from continuum.store.redis_client import RedisTarget


class RedisCacheMetadata:
    def __init__(self, target: RedisTarget, *, owns_target: bool = False) -> None:
        self.target = target
        self._owns = owns_target
        self._key = target.key("cache_meta")

    def close(self) -> None:
        if self._owns:
            self.target.close()

    def save(self, data: CacheMetadata) -> None:
        vectors = [np.frombuffer(row[8], dtype=np.float32) for row in data.semantic]
        fields = {
            "format_version": str(FORMAT_VERSION),
            "meta": json.dumps(data.meta),
            "memo": json.dumps(data.memo),
            "snapshots": json.dumps(data.snapshots),
            "semantic": json.dumps([row[:8] for row in data.semantic]),
            "dims": json.dumps([len(v) for v in vectors]),
            "vectors": np.concatenate(vectors).tobytes() if vectors else b"",
        }

        def write() -> None:
            pipe = self.target.client.pipeline(transaction=True)
            pipe.delete(self._key)
            pipe.hset(self._key, mapping=fields)
            pipe.execute()

        self.target.call(write)

    def load(self) -> CacheMetadata:
        raw: dict[bytes, bytes] = self.target.call(self.target.client.hgetall, self._key)
        if not raw:
            raise MetadataError(self.target.url, "holds no saved cache metadata")
        try:
            version = int(raw[b"format_version"])
        except (KeyError, ValueError):
            raise MetadataError(self.target.url, "is not continuum cache metadata") from None
        if version > FORMAT_VERSION:
            raise MetadataError(
                self.target.url,
                f"format version {version} is newer than this continuum reads ({FORMAT_VERSION}):"
                " upgrade continuum to load it (nothing was changed)",
            )
        try:
            return _decode(raw)
        except (KeyError, ValueError, TypeError) as e:
            raise MetadataError(self.target.url, f"is corrupt ({e})") from None


def _decode(raw: dict[bytes, bytes]) -> CacheMetadata:
    memo: list[Any] = json.loads(raw[b"memo"])
    snaps: list[Any] = json.loads(raw[b"snapshots"])
    rows: list[Any] = json.loads(raw[b"semantic"])
    dims: list[int] = json.loads(raw[b"dims"])
    flat = np.frombuffer(raw[b"vectors"], dtype=np.float32)
    if len(dims) != len(rows) or sum(dims) != len(flat):
        raise ValueError("the semantic vectors do not match their rows")
    offsets = np.cumsum([0, *dims])
    semantic = [
        (
            int(i),
            str(p),
            str(q),
            int(v),
            str(t),
            tuple(toks),
            str(f),
            int(n),
            flat[offsets[k] : offsets[k + 1]].tobytes(),
        )
        for k, (i, p, q, v, t, toks, f, n) in enumerate(rows)
    ]
    return CacheMetadata(
        dict(json.loads(raw[b"meta"])),
        [(str(k), int(v), str(t), tuple(toks), str(f), int(n)) for k, v, t, toks, f, n in memo],
        [(str(ns), tuple(toks), str(sid), int(n), int(b)) for ns, toks, sid, n, b in snaps],
        semantic,
    )


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: RedisCacheMetadata) -> CacheMetadataStore:
        return store


__all__ = ["RedisCacheMetadata"]
