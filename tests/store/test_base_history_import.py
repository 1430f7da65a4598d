"""``import_session`` on every :class:`~continuum.store.base.HistoryLog` implementation
(SQLite, and a real redis-server): a session read from one store and written into another of
its kind reads back the same, field for field, and goes on; a taken id changes nothing. (A
failed SQLite write is in ``test_sqlite.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from continuum.errors import SessionExists
from continuum.store.base import ContinuityNote, HistoryLog, SessionRecord
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.sqlite import HistoryStore
from tests.store.test_base_history import KINDS, commit, contents, new_session, stored


def open_named(kind: str, tmp_path: Path, request: pytest.FixtureRequest, name: str) -> Any:
    if kind == "sqlite":
        return HistoryStore(tmp_path / f"{name}.db")
    url: str = request.getfixturevalue("redis_url")
    return RedisHistoryStore(url.replace("?prefix=", f"?prefix={name}"))


@pytest.fixture(params=KINDS)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[HistoryLog, HistoryLog]]:
    """A source store and an empty target store of the same kind."""
    a = open_named(request.param, tmp_path, request, "a")
    b = open_named(request.param, tmp_path, request, "b")
    yield a, b
    a.close()
    b.close()


def everything(store: HistoryLog, sid: str) -> tuple[Any, ...]:
    return (
        store.load_session(sid),
        store.messages(sid),
        store.turns(sid),
        store.resets(sid),
        store.session_tenant(sid),
        store.count_sessions(store.session_tenant(sid)),
    )


def a_session(store: HistoryLog) -> str:
    sid = new_session(store, "moving", tenant="acme")
    reset = {"reason": "evicted", "detail": "reopened", "tokens_dropped": 0, "tokens_rebuilt": 4}
    commit(store, sid, 0, stored("user", "u1"), stored("assistant", "a1", (5, 6, 7)))
    commit(store, sid, 1, stored("assistant", "edited", (8,)), metrics={"resets": [reset]})
    commit(
        store,
        sid,
        2,
        stored("user", "u2"),
        stored("assistant", "a2", (9,)),
        note=ContinuityNote(1, "the user said u1"),
    )
    return sid


def move(a: HistoryLog, b: HistoryLog, sid: str, rec: SessionRecord | None = None) -> None:
    b.import_session(rec or a.load_session(sid), a.messages(sid), a.turns(sid), a.resets(sid))


def test_an_imported_session_reads_back_the_same(pair: tuple[HistoryLog, HistoryLog]) -> None:
    a, b = pair
    sid = a_session(a)
    move(a, b, sid)
    assert everything(b, sid) == everything(a, sid)
    assert contents(b, sid) == ["u1", "edited", "u2", "a2"]
    assert b.load_session(sid).note == ContinuityNote(1, "the user said u1")
    assert b.messages(sid)[1].gen_tokens == (8,)
    # and it goes on like any other session: the next turn is turn 4
    assert commit(b, sid, 4, stored("user", "u3"), expected_turn=3) == 4
    assert contents(b, sid)[-1] == "u3" and b.load_session(sid).turns == 4


def test_a_taken_id_is_refused_and_changes_nothing(pair: tuple[HistoryLog, HistoryLog]) -> None:
    a, b = pair
    sid = a_session(a)
    new_session(b, sid, tenant="other")
    commit(b, sid, 0, stored("user", "mine"))
    before = everything(b, sid)
    with pytest.raises(SessionExists):
        move(a, b, sid)
    assert everything(b, sid) == before
    assert b.count_sessions("acme") == 0
