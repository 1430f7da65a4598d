"""The SQLite history store: the authoritative log of sessions, messages, turns and resets."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from continuum.errors import SessionExists, SessionNotFound, StoreError
from continuum.hashing import message_identity
from continuum.store.sqlite import HistoryStore, StoredMessage

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "history.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(db_path) as s:
        yield s


def stored(role: str, content: str, tokens: tuple[int, ...] | None = None) -> StoredMessage:
    msg = {"role": role, "content": content}
    return StoredMessage(msg, message_identity(msg), tokens, DIGEST if tokens is not None else None)


def new_session(store: HistoryStore, session_id: str | None = None) -> str:
    return store.create_session(
        model_digest=DIGEST,
        chat_format="gemma",
        system="Be brief.",
        continuity=None,
        config={"n_ctx": 2048, "high_water": 1843},
        session_id=session_id,
    )


def commit(store: HistoryStore, sid: str, keep: int, *new: StoredMessage, **metrics: Any) -> int:
    return store.commit_turn(
        sid, keep=keep, new=list(new), finish_reason="stop", metrics=metrics, system="Be brief."
    )


def contents(store: HistoryStore, sid: str) -> list[str]:
    return [m.message["content"] for m in store.messages(sid)]


# -- sessions --------------------------------------------------------------------------------
def test_create_and_load_session(store: HistoryStore) -> None:
    sid = new_session(store)
    assert len(sid) == 32
    rec = store.load_session(sid)
    assert rec.id == sid
    assert rec.model_digest == DIGEST
    assert rec.chat_format == "gemma"
    assert rec.system == "Be brief."
    assert rec.continuity is None
    assert rec.config == {"n_ctx": 2048, "high_water": 1843}
    assert rec.turns == 0
    assert store.messages(sid) == []


def test_explicit_session_id(store: HistoryStore) -> None:
    assert new_session(store, "mine") == "mine"
    assert store.load_session("mine").id == "mine"


def test_unknown_session_is_not_found(store: HistoryStore) -> None:
    with pytest.raises(SessionNotFound) as info:
        store.load_session("doesnotexist")
    assert info.value.session_id == "doesnotexist"
    assert "no session 'doesnotexist'" in str(info.value)


# -- turns --------------------------------------------------------------------------------
def test_commit_turn_appends_in_order(store: HistoryStore) -> None:
    sid = new_session(store)
    assert commit(store, sid, 0, stored("user", "u1"), stored("assistant", "a1")) == 1
    assert commit(store, sid, 2, stored("user", "u2"), stored("assistant", "a2")) == 2
    assert contents(store, sid) == ["u1", "a1", "u2", "a2"]
    assert store.load_session(sid).turns == 2
    assert [t["turn"] for t in store.turns(sid)] == [1, 2]


def test_commit_turn_supersedes_from_keep(store: HistoryStore) -> None:
    sid = new_session(store)
    commit(store, sid, 0, stored("user", "u1"), stored("assistant", "a1"))
    commit(store, sid, 2, stored("user", "u2"), stored("assistant", "a2"))
    # an edit of message 2 (u2): keep the first two, replace the rest
    commit(store, sid, 2, stored("user", "u2-edited"), stored("assistant", "a2'"))
    assert contents(store, sid) == ["u1", "a1", "u2-edited", "a2'"]
    # superseded rows are kept in the log, never deleted
    with closing(sqlite3.connect(store.path)) as db:
        (n_superseded,) = db.execute(
            "SELECT COUNT(*) FROM messages WHERE superseded_at IS NOT NULL"
        ).fetchone()
    assert n_superseded == 2


def test_messages_keep_identity_and_body(store: HistoryStore) -> None:
    sid = new_session(store)
    msg = stored("user", "héllo ✓")
    commit(store, sid, 0, msg)
    assert store.messages(sid) == [msg]


def test_messages_are_per_session(store: HistoryStore) -> None:
    a, b = new_session(store), new_session(store)
    commit(store, a, 0, stored("user", "for a"))
    commit(store, b, 0, stored("user", "for b"))
    assert contents(store, a) == ["for a"]
    assert contents(store, b) == ["for b"]


def test_gen_tokens_round_trip(store: HistoryStore) -> None:
    sid = new_session(store)
    tokens = (0, 1, 2, 262_143, 2**31 - 1)
    commit(store, sid, 0, stored("user", "q"), stored("assistant", "a", tokens))
    user, assistant = store.messages(sid)
    assert user.gen_tokens is None and user.gen_model is None
    assert assistant.gen_tokens == tokens
    assert assistant.gen_model == DIGEST


def test_turn_metrics_and_resets_are_stored(store: HistoryStore) -> None:
    sid = new_session(store)
    reset = {
        "reason": "high_water",
        "detail": "rebuilt from bounded history",
        "tokens_dropped": 1800,
        "tokens_rebuilt": 600,
    }
    commit(store, sid, 0, stored("user", "q"), prompt_tokens_evaluated=12, resets=[])
    commit(store, sid, 1, stored("user", "q2"), prompt_tokens_evaluated=600, resets=[reset])
    assert store.resets(sid) == [{"turn": 2, **reset}]
    turns = store.turns(sid)
    assert turns[1] == {
        "turn": 2,
        "finish_reason": "stop",
        "metrics": {"prompt_tokens_evaluated": 600, "resets": [reset]},
    }


def test_commit_turn_records_system(store: HistoryStore) -> None:
    sid = new_session(store)
    store.commit_turn(sid, keep=0, new=[], finish_reason="stop", metrics={}, system="New.")
    assert store.load_session(sid).system == "New."


# -- failures leave the log unchanged ----------------------------------------------------------
def test_duplicate_session_id_changes_nothing(store: HistoryStore) -> None:
    new_session(store, "dup")
    commit(store, "dup", 0, stored("user", "u1"))
    with pytest.raises(SessionExists, match="exists already") as info:
        store.create_session(
            model_digest="sha256:other",
            chat_format="chatml",
            system=None,
            continuity=None,
            config={},
            session_id="dup",
        )
    assert info.value.session_id == "dup" and str(store.path) not in str(info.value)
    rec = store.load_session("dup")
    assert (rec.model_digest, rec.chat_format, rec.turns) == (DIGEST, "gemma", 1)
    assert contents(store, "dup") == ["u1"]
    # and the store is still usable afterwards
    commit(store, "dup", 1, stored("assistant", "a1"))
    assert contents(store, "dup") == ["u1", "a1"]


def test_failed_commit_turn_is_rolled_back(store: HistoryStore) -> None:
    sid = new_session(store)
    commit(store, sid, 0, stored("user", "u1"), stored("assistant", "a1"))
    broken_reset = {"reason": "divergence"}  # fails after supersede and inserts have run
    with pytest.raises(KeyError):
        commit(store, sid, 0, stored("user", "other"), resets=[broken_reset])
    assert contents(store, sid) == ["u1", "a1"]
    assert store.load_session(sid).turns == 1
    assert store.resets(sid) == []


def test_commit_turn_for_unknown_session_writes_nothing(store: HistoryStore) -> None:
    with pytest.raises(StoreError):
        commit(store, "ghost", 0, stored("user", "boo"))
    with closing(sqlite3.connect(store.path)) as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (0,)


# -- the database file -------------------------------------------------------------------------
def test_wal_journal_mode(store: HistoryStore) -> None:
    with closing(sqlite3.connect(store.path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_second_instance_sees_the_same_data(store: HistoryStore) -> None:
    sid = new_session(store)
    commit(store, sid, 0, stored("user", "u1"), stored("assistant", "a1", (5, 6)))
    with HistoryStore(store.path) as other:  # while the first is still open
        assert other.load_session(sid) == store.load_session(sid)
        assert other.messages(sid) == store.messages(sid)
        commit(other, sid, 2, stored("user", "u2"))
    assert contents(store, sid) == ["u1", "a1", "u2"]


def test_reopen_after_close(db_path: Path) -> None:
    with HistoryStore(db_path) as first:
        sid = new_session(first)
        commit(first, sid, 0, stored("user", "u1"), stored("assistant", "a1", (7,)))
        expected = first.messages(sid)
    with HistoryStore(db_path) as second:
        assert second.messages(sid) == expected
        assert second.load_session(sid).turns == 1


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


def _said(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_response_chain_is_stored_as_deltas_and_read_whole(store: HistoryStore) -> None:
    store.put_response("t", "r1", None, [_said("a"), _said("b")], {"id": "r1"})
    store.put_response("t", "r2", "r1", [_said("c")], {"id": "r2"})
    store.put_response("t", "r3", "r2", [_said("d")], {"id": "r3"})
    got = store.get_response("t", "r3")
    assert got is not None
    assert got[0] == {"id": "r3"} and [m["content"] for m in got[1]] == ["a", "b", "c", "d"]
    (added,) = store._db.execute("SELECT added FROM responses WHERE id = 'r3'").fetchone()
    assert json.loads(added) == [_said("d")]  # each row holds only what it added
    assert store.get_response("other", "r3") is None  # tenants never see each other's


def test_a_deleted_response_is_gone_but_its_children_continue_through_it(
    store: HistoryStore,
) -> None:
    store.put_response("t", "r1", None, [_said("a")], {"id": "r1"})
    store.put_response("t", "r2", "r1", [_said("b")], {"id": "r2"})
    assert store.delete_response("t", "r1") and not store.delete_response("t", "r1")
    assert store.get_response("t", "r1") is None
    assert store.get_response("t", "r1", deleted_ok=True) is not None
    got = store.get_response("t", "r2")
    assert got is not None and [m["content"] for m in got[1]] == ["a", "b"]
    assert not store.delete_response("t", "nope")


def test_responses_past_their_retention_are_purged_with_their_chain(
    store: HistoryStore,
) -> None:
    store.put_response("t", "old", None, [_said("a")], {"id": "old"})
    store._db.execute("UPDATE responses SET created_at = created_at - 100")
    store.put_response("t", "new", "old", [_said("b")], {"id": "new"}, retention_s=50)
    assert store.get_response("t", "old") is None
    assert store.get_response("t", "new") is None  # an ancestor is gone: it cannot continue
