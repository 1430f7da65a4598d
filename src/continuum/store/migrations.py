"""Numbered schema migrations: the one way every continuum SQLite file changes shape (a Redis
store's keys change by the same numbered steps: :mod:`continuum.store.redis_schema`).

A store declares its schema as a list of :class:`Migration` — version 1 is the first schema, each
later one a step — and calls :func:`migrate` when it opens a file. The promises:

* The list is validated: versions are exactly ``1..N`` in order (``latest_version`` raises
  ``ValueError`` otherwise), so a gap or a duplicate fails at import, not in a user's file.
* Migrations run in order, each in ONE transaction: ``BEGIN IMMEDIATE``, the step,
  ``PRAGMA user_version=N``, ``COMMIT``. SQLite DDL is transactional, so a process killed in the
  middle leaves the file at the previous version and the next open completes the step.
* The version is read again inside each transaction, so two processes opening the same file
  at once apply each step once (the second waits on the lock, then finds it done).
* A file whose ``user_version`` is newer than the list raises :class:`StoreError` before
  anything is written: nothing in the file changes.
* A fresh file (``user_version`` 0) gets every migration.

A string migration may hold several statements (split with :func:`sqlite3.complete_statement`,
so ``;`` inside literals and triggers is safe). A callable migration gets the connection inside
the open transaction; it must not commit, and is refused if it does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from continuum.errors import StoreError


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: after it, the file's ``user_version`` is ``version``."""

    version: int
    name: str
    apply: str | Callable[[sqlite3.Connection], None]


@dataclass(frozen=True, slots=True)
class MigrationResult:
    """What :func:`migrate` did: the version found, the version left, the steps it ran."""

    before: int
    after: int
    applied: tuple[str, ...]


class Step(Protocol):
    """A numbered schema step of any store (SQLite's :class:`Migration`, Redis's steps)."""

    @property
    def version(self) -> int: ...
    @property
    def name(self) -> str: ...


def latest_version(migrations: Sequence[Step]) -> int:
    """The version a fully migrated file has; ``ValueError`` unless versions are 1..N in order."""
    if not migrations:
        raise ValueError("a schema needs at least one migration (version 1: the first schema)")
    for expected, m in enumerate(migrations, start=1):
        if m.version != expected:
            found = [x.version for x in migrations]
            raise ValueError(
                f"migration versions must be 1..{len(migrations)} in order, found {found}: "
                f"expected {expected} where {m.name!r} has {m.version}"
            )
        if not m.name:
            raise ValueError(f"migration {m.version} has no name")
    return len(migrations)


def schema_version(db: sqlite3.Connection) -> int:
    """The file's ``PRAGMA user_version`` (0 for a fresh file)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def check_version(
    db: sqlite3.Connection,
    migrations: Sequence[Migration],
    *,
    path: str | Path,
    what: str,
    option: str = "--store",
) -> int:
    """The file's version; :class:`StoreError` if it is newer than ``migrations`` (read only).

    ``what`` names the schema in the message ("history", "memory graph") and ``option`` the
    setting that points continuum at another file."""
    latest = latest_version(migrations)
    found = schema_version(db)
    if found > latest:
        raise StoreError(
            path,
            f"{what} schema {found} is newer than this continuum reads (schema version "
            f"{found} > {latest}): the file was written by a newer continuum. Upgrade "
            f"continuum, or point {option} at another file; nothing in this file was changed",
        )
    return found


def migrate(
    db: sqlite3.Connection,
    migrations: Sequence[Migration],
    *,
    path: str | Path,
    what: str,
    option: str = "--store",
) -> MigrationResult:
    """Bring the file up to the latest version, one transaction per step.

    Raises :class:`StoreError` for a newer file (nothing written) and lets ``sqlite3.Error``
    from a failing step through, with that step rolled back and earlier steps kept."""
    before = check_version(db, migrations, path=path, what=what, option=option)
    applied = [m.name for m in migrations[before:] if _apply(db, m)]
    return MigrationResult(before, schema_version(db), tuple(applied))


def _apply(db: sqlite3.Connection, m: Migration) -> bool:
    """Run one step in its own transaction; False if another connection already ran it."""
    if db.in_transaction:
        raise RuntimeError("migrate() needs a connection with no open transaction")
    db.execute("BEGIN IMMEDIATE")
    try:
        if schema_version(db) >= m.version:  # another process got there while we waited
            db.execute("ROLLBACK")
            return False
        if isinstance(m.apply, str):
            for statement in _statements(m.apply):
                db.execute(statement)
        else:
            m.apply(db)
        if not db.in_transaction:
            raise RuntimeError(
                f"migration {m.version} ({m.name}) committed its own transaction; "
                "a migration must leave the commit to migrate()"
            )
        db.execute(f"PRAGMA user_version={m.version:d}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return True


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script``, one at a time (``execute`` takes one; ``executescript``
    would commit the open transaction first)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if _has_sql(pending):
                yield pending
            pending = ""
    if _has_sql(pending):
        yield pending  # incomplete: execute() reports the syntax error


def _has_sql(text: str) -> bool:
    lines = (line.split("--", 1)[0] for line in text.splitlines())
    return any(line.strip(" \t;") for line in lines)


__all__ = [
    "Migration",
    "MigrationResult",
    "Step",
    "check_version",
    "latest_version",
    "migrate",
    "schema_version",
]
