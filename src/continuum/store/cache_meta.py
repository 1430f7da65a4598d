"""Cache metadata on disk: the memo table and the layer-KV snapshot index, in SQLite.

Written by ``Session.save_cache_metadata`` and read by ``load_cache_metadata`` in a new process.
The file is a plain SQLite database (WAL) with a format version; nothing is pickled. Snapshot
payloads are not in it: they are files named by content hash in the snapshot directory, and
only entries whose file still exists are re-registered on load.
"""

from __future__ import annotations

import array
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from continuum.errors import MetadataError

FORMAT_VERSION = 2
_SEMANTIC = """
CREATE TABLE semantic (
    id INTEGER PRIMARY KEY, partition TEXT NOT NULL, query TEXT NOT NULL, version INTEGER NOT NULL,
    text TEXT NOT NULL, tokens BLOB NOT NULL, finish_reason TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL, vector BLOB NOT NULL
);
"""
# Migrations from an older format version to the next, applied in order on load; a file newer
# than this code is refused. 1 -> 2 adds the semantic tier's entries (none in a v1 file).
MIGRATIONS: dict[int, str] = {
    1: _SEMANTIC + "UPDATE meta SET value='2' WHERE key='format_version';",
}
_SCHEMA = (
    _SEMANTIC
    + """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE memo (
    key TEXT PRIMARY KEY, version INTEGER NOT NULL, text TEXT NOT NULL, tokens BLOB NOT NULL,
    finish_reason TEXT NOT NULL, prompt_tokens INTEGER NOT NULL
);
CREATE TABLE snapshots (
    namespace TEXT NOT NULL, tokens BLOB NOT NULL, snapshot_id TEXT NOT NULL,
    n_tokens INTEGER NOT NULL, nbytes INTEGER NOT NULL
);
"""
)


@dataclass(frozen=True, slots=True)
class CacheMetadata:
    meta: dict[str, Any]
    memo: list[tuple[str, int, str, tuple[int, ...], str, int]]
    snapshots: list[tuple[str, tuple[int, ...], str, int, int]]
    # (id, partition, query, version, text, tokens, finish_reason, prompt_tokens, vector)
    semantic: list[tuple[int, str, str, int, str, tuple[int, ...], str, int, bytes]] = field(
        default_factory=list
    )


def _pack(tokens: tuple[int, ...]) -> bytes:
    return array.array("i", tokens).tobytes()


def _unpack(blob: bytes) -> tuple[int, ...]:
    a = array.array("i")
    a.frombytes(blob)
    return tuple(a)


def save(path: str | Path, data: CacheMetadata) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(tmp)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA user_version={FORMAT_VERSION}")
            db.executescript(_SCHEMA)
            meta = {**data.meta, "format_version": FORMAT_VERSION}
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()]
            )
            db.executemany(
                "INSERT INTO memo VALUES (?, ?, ?, ?, ?, ?)",
                [(k, v, t, _pack(toks), f, n) for k, v, t, toks, f, n in data.memo],
            )
            db.executemany(
                "INSERT INTO snapshots VALUES (?, ?, ?, ?, ?)",
                [(ns, _pack(toks), sid, n, b) for ns, toks, sid, n, b in data.snapshots],
            )
            db.executemany(
                "INSERT INTO semantic VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(*row[:5], _pack(row[5]), *row[6:]) for row in data.semantic],
            )
            db.commit()
        finally:
            db.close()
        tmp.replace(p)  # atomic: a failed save never leaves a half-written file at `path`
    except (sqlite3.Error, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise MetadataError(p, f"could not be written ({e}); the previous file is unchanged") from e


def load(path: str | Path) -> CacheMetadata:
    p = Path(path)
    if not p.is_file():
        raise MetadataError(p, "does not exist")
    try:
        db = sqlite3.connect(p)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            while version in MIGRATIONS and version < FORMAT_VERSION:
                db.executescript(MIGRATIONS[version])
                version += 1
                db.execute(f"PRAGMA user_version={version}")
            meta = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}
            if meta.get("format_version") != FORMAT_VERSION or version != FORMAT_VERSION:
                raise MetadataError(
                    p, f"format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}"
                )
            memo = [
                (k, int(v), t, _unpack(toks), f, int(n))
                for k, v, t, toks, f, n in db.execute("SELECT * FROM memo")
            ]
            snaps = [
                (ns, _unpack(toks), sid, int(n), int(b))
                for ns, toks, sid, n, b in db.execute("SELECT * FROM snapshots")
            ]
            semantic = [
                (int(i), part, q, int(v), t, _unpack(toks), f, int(n), bytes(vec))
                for i, part, q, v, t, toks, f, n, vec in db.execute("SELECT * FROM semantic")
            ]
        finally:
            db.close()
    except (sqlite3.Error, ValueError, TypeError) as e:
        raise MetadataError(p, f"is corrupt or not a continuum metadata file ({e})") from None
    return CacheMetadata(meta, memo, snaps, semantic)
