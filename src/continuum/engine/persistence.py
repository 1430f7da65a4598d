"""Cross-process persistence of the reuse stack's index (seed 003: ``save_cache_metadata``).

``save`` writes the memo table, the layer-KV snapshot index and the semantic entries to one
SQLite metadata file (or, given a ``redis://`` URL, to one Redis hash); pinned prefixes are
snapshotted first so a new process can restore them. ``load`` reloads it; resuming bumps the
memo and semantic versions, so entries stored before the resume are kept but not served
(DESIGN.md §3.10).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from continuum.errors import MetadataError
from continuum.keys import OpKey
from continuum.store import cache_meta
from continuum.store.stores import StoreAddress
from continuum.tiers.layer_kv import SnapshotRef, pinned_entry
from continuum.tiers.memo import MemoEntry
from continuum.tiers.semantic_entries import SemanticEntry

if TYPE_CHECKING:
    from continuum.engine.core import Engine


def _snapshot_pinned(engine: Engine) -> None:
    kv = engine.kv_backend
    if engine.prefix is None or kv is None:
        return
    for ns, tokens, handle in list(engine.prefix.trie.entries()):
        if not engine.layer.owns(ns, tokens):
            engine.layer.put(ns, tokens, pinned_entry(kv, ns, tokens, handle))


def semantic_identity(engine: Engine) -> str:
    return engine.semantic.embedder.identity if engine.semantic is not None else ""


def save(engine: Engine, path: str | Path, namespace: str) -> None:
    with engine.claim():
        _snapshot_pinned(engine)
        b, sem = engine.backend, engine.semantic
        data = cache_meta.CacheMetadata(
            meta={
                "namespace": namespace,
                "backend": b.name,
                "model": b.model_identity,
                "memo_version": engine.memo.version,
                "snapshot_dir": str(engine.layer.directory),
                "embedder": semantic_identity(engine),
                "semantic_version": sem.version if sem else 0,
            },
            memo=[
                (e.key, e.version, e.text, e.tokens, e.finish_reason, e.prompt_tokens)
                for e in engine.memo.entries()
            ],
            snapshots=[
                (ns, toks, ref.snapshot_id, ref.n_tokens, ref.nbytes)
                for ns, toks, ref in engine.layer.index.entries()
                if not ref.borrowed  # a parked session's snapshot is the session's own
            ],
            semantic=[
                (
                    e.id,
                    e.partition,
                    e.query,
                    e.version,
                    e.text,
                    e.tokens,
                    e.finish_reason,
                    e.prompt_tokens,
                    np.asarray(v, dtype=np.float32).tobytes(),
                )
                for e, v in (sem.entries() if sem else [])
            ],
        )
        address = StoreAddress.parse(path)
        with address.cache_metadata() as store:
            store.save(data)
        if sem is not None and (indexes := address.index_dir()) is not None:
            sem.save_indexes(indexes)


def load(engine: Engine, path: str | Path) -> dict[str, int]:
    with engine.claim():
        with StoreAddress.parse(path).cache_metadata() as store:
            data = store.load()
        b = engine.backend
        for field_, mine in (("backend", b.name), ("model", b.model_identity)):
            if data.meta.get(field_) != mine:
                raise MetadataError(
                    path, f"was saved for {field_} {data.meta.get(field_)!r}, not {mine!r}"
                )
        for k, v, text, toks, finish, n in data.memo:
            engine.memo.put(MemoEntry(OpKey(k), v, text, toks, finish, n))
        saved = data.meta.get("memo_version", 1)
        engine.memo.bump_version(int(saved))
        restored = sum(
            engine.layer.restore_index(ns, toks, SnapshotRef(sid, n, nbytes))
            for ns, toks, sid, n, nbytes in data.snapshots
        )
        semantic, skipped = _load_semantic(engine, data, path)
        return {
            "memo": len(data.memo),
            "snapshots": restored,
            "snapshots_missing": len(data.snapshots) - restored,
            "semantic": semantic,
            "semantic_skipped": skipped,  # made by another embedder (or none configured)
        }


def _load_semantic(
    engine: Engine, data: cache_meta.CacheMetadata, path: str | Path
) -> tuple[int, int]:
    sem = engine.semantic
    if sem is None or data.meta.get("embedder") != semantic_identity(engine):
        return 0, len(data.semantic)
    rows = [
        (SemanticEntry(i, part, q, v, t, toks, f, n), np.frombuffer(vec, dtype=np.float32).copy())
        for i, part, q, v, t, toks, f, n, vec in data.semantic
    ]
    loaded = sem.load(rows, StoreAddress.parse(path).index_dir())
    sem.bump_version(at_least=int(data.meta.get("semantic_version") or 0))
    return loaded["entries"], loaded["skipped"]


def report(engine: Engine, stats: Any) -> dict[str, Any]:
    """The metrics of a namespace view (``Session.metrics()``): its totals and the tiers'."""
    lookups = sorted(stats.lookup_ms)
    memo = engine.memo
    snaps = engine.snapshots.stats()
    return {
        "ops": stats.ops,
        "backend_calls": stats.backend_calls,
        "calls_eliminated": stats.calls_eliminated,
        "tokens_sent": stats.tokens_sent,
        "tokens_saved": stats.tokens_saved,
        "hits": dict(stats.hits),
        "hit_rate": stats.hit_rate(),
        "snapshot_errors": stats.snapshot_errors,
        "snapshot_write_errors": snaps.disk_errors,
        "evictions": {
            "memo": memo.evictions,
            "prefix_kv": engine.prefix.trie.evictions if engine.prefix is not None else 0,
            "snapshots_ram": snaps.ram_evictions,
            "snapshots_disk": snaps.disk_evictions,
        },
        "bytes_resident": {
            "memo": memo.bytes_resident(),
            "snapshots_ram": snaps.ram_bytes,
            "snapshots_disk": snaps.disk_bytes,
        },
        "lookup_ms_median": lookups[len(lookups) // 2] if lookups else 0.0,
        "semantic": engine.semantic.stats() if engine.semantic is not None else None,
        "memory_graph": engine.graph.stats() if engine.graph is not None else None,
    }
