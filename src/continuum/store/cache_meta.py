"""Cache metadata on disk: the memo table and the layer-KV snapshot index, in SQLite.

Written by ``Session.save_cache_metadata`` and read by ``load_cache_metadata`` in a new process.
The file is a plain SQLite database (WAL) written whole, with its format version twice
(``user_version`` and a ``meta.format_version`` row); nothing is pickled. Its schema is the
numbered migrations of :mod:`continuum.store.migrations`. :func:`load` reads the current format
and every earlier one without writing to the file (an older file is migrated in a copy in
memory) and refuses a newer one. Snapshot payloads are not in it: they are files named by
content hash in the snapshot directory, and only entries whose file still exists are
re-registered on load.
"""

from __future__ import annotations

import array
import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from continuum.errors import MetadataError
from continuum.store.base import CacheMetadata, CacheMetadataStore
from continuum.store.migrations import Migration, latest_version, migrate, schema_version

_V1 = """
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
# The semantic tier's entries (a v1 file has none). The meta row is rewritten too: a file says
# its format twice (user_version and meta.format_version), and load() checks both agree.
_V2_SEMANTIC = """
CREATE TABLE semantic (
    id INTEGER PRIMARY KEY, partition TEXT NOT NULL, query TEXT NOT NULL, version INTEGER NOT NULL,
    text TEXT NOT NULL, tokens BLOB NOT NULL, finish_reason TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL, vector BLOB NOT NULL
);
UPDATE meta SET value = '2' WHERE key = 'format_version';
"""
MIGRATIONS = (
    Migration(1, "meta, memo and layer-KV snapshot index", _V1),
    Migration(2, "semantic tier entries", _V2_SEMANTIC),
)
FORMAT_VERSION = latest_version(MIGRATIONS)


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
            migrate(db, MIGRATIONS, path=tmp, what="cache metadata")
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
    """Read a file written by :func:`save` of this or an earlier format; never writes to it.

    An older file is migrated in a copy in memory (the next ``save`` writes the current
    format); a newer one is refused with :class:`MetadataError`."""
    p = Path(path)
    if not p.is_file():
        raise MetadataError(p, "does not exist")
    try:
        db = _open_current(p)
        try:
            meta = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM meta")}
            version = meta.pop("format_version", None)  # the file's, not the caller's meta
            if version != FORMAT_VERSION:
                raise MetadataError(p, f"format version {version!r}, expected {FORMAT_VERSION}")
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


def _open_current(p: Path) -> sqlite3.Connection:
    """A connection in the current format: to ``p`` itself, or to a migrated copy in memory."""
    db = sqlite3.connect(p)
    try:
        version = schema_version(db)
        if version > FORMAT_VERSION:
            raise MetadataError(
                p,
                f"format version {version} is newer than this continuum reads ({FORMAT_VERSION}):"
                " it was written by a newer continuum; upgrade continuum to load it (the file"
                " was not changed)",
            )
        if version == FORMAT_VERSION:
            return db
        copy = sqlite3.connect(":memory:")
        db.backup(copy)
    except BaseException:
        db.close()
        raise
    db.close()
    try:
        migrate(copy, MIGRATIONS, path=p, what="cache metadata")
    except BaseException:
        copy.close()
        raise
    return copy


class CacheMetadataFile:
    """:func:`save` and :func:`load` bound to one path: the :class:`CacheMetadataStore`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def save(self, data: CacheMetadata) -> None:
        save(self.path, data)

    def load(self) -> CacheMetadata:
        return load(self.path)


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: CacheMetadataFile) -> CacheMetadataStore:
        return store


__all__ = ["FORMAT_VERSION", "MIGRATIONS", "CacheMetadata", "CacheMetadataFile", "load", "save"]
