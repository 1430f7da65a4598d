"""The SQLite history store's own behaviour: its file (WAL, a path that is not a database, a
schema from a newer release) and its transactions.

The :class:`~continuum.store.base.HistoryLog` contract it shares with the Redis store is tested
on both in ``test_base_history.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from continuum.errors import SessionNotFound, StoreError
from continuum.store.sqlite import HistoryStore
from tests.store.test_base_history_import import a_session


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "history.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(db_path) as s:
        yield s


# -- the database file -------------------------------------------------------------------------
def test_wal_journal_mode(store: HistoryStore) -> None:
    with closing(sqlite3.connect(store.path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_directory_path_is_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open") as info:
        HistoryStore(tmp_path)
    assert info.value.path == str(tmp_path)


def test_garbage_file_is_store_error(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"this is not an sqlite database at all\0" * 200)
    with pytest.raises(StoreError, match="writable SQLite file") as info:
        HistoryStore(path)
    assert str(path) in str(info.value)


def test_newer_schema_is_store_error(db_path: Path) -> None:
    HistoryStore(db_path).close()
    with closing(sqlite3.connect(db_path)) as db:
        db.execute("PRAGMA user_version=99")
    with pytest.raises(StoreError, match="schema version 99"):
        HistoryStore(db_path)


# -- transactions --------------------------------------------------------------------------------
def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    """Two turns numbered alike break the turns table's key halfway through the import: the
    transaction rolls back the session row and messages written before it. (Redis numbers the
    turns it imports by their order, so the same import succeeds there.)"""
    with HistoryStore(tmp_path / "a.db") as a, HistoryStore(tmp_path / "b.db") as b:
        sid = a_session(a)
        turns = a.turns(sid)
        with pytest.raises(StoreError, match="nothing was written"):
            b.import_session(a.load_session(sid), a.messages(sid), [turns[0], turns[0]], [])
        with pytest.raises(SessionNotFound):
            b.load_session(sid)
        assert b.messages(sid) == [] and b.turns(sid) == [] and b.count_sessions("acme") == 0
