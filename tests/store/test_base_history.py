"""The :class:`~continuum.store.base.HistoryLog` contract, on every implementation: SQLite (a
file in tmp_path) and Redis (a real redis-server, a key prefix of the test's own).

Every test here runs on both stores (``impl`` is parametrised), so the two cannot drift; so do
those of ``test_base_history_import.py`` (moving a session between stores) and
``test_base_history_responses.py`` (stored responses), on the same fixture. What only one of
them has (SQLite's file, WAL and migrations; Redis's outages, races and key
prefixes) is tested in ``test_sqlite.py`` and ``test_redis_history.py``. A few checks read the
store underneath the protocol (``Impl.superseded``, ``Impl.rows``, ``Impl.added``): what the
log keeps that the protocol does not return. A behaviour the two stores do not share is
pinned as the contract and marked ``xfail(strict=True)`` on the store that breaks it.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum.errors import (
    InvalidRequest,
    SessionExists,
    SessionNotFound,
    TurnConflict,
)
from continuum.hashing import message_identity
from continuum.messages import Message
from continuum.store.base import ContinuityNote, HistoryLog, StoredMessage
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.sqlite import HistoryStore
from tests.store.contract import KINDS

DIGEST = "sha256:" + "ab" * 32


# -- the implementations ------------------------------------------------------------------------
@dataclass
class Impl:
    """One implementation under test: its store, another on the same data, and raw reads."""

    kind: str
    store: HistoryLog
    open: Callable[[], HistoryLog]  # another store object on the same data (another process)
    where: str  # the file or URL the store is at (errors must not leak it)
    superseded: Callable[[str], int]  # superseded messages kept for a session
    rows: Callable[[], int]  # messages (superseded too), turns and resets kept, all sessions
    added: Callable[[str, str], list[Message] | None]  # what one stored response row holds


def sqlite_impl(path: Path) -> Impl:
    def query(sql: str, *args: Any) -> Any:
        with closing(sqlite3.connect(path)) as db:
            return db.execute(sql, args).fetchone()

    def rows() -> int:
        return sum(query(f"SELECT COUNT(*) FROM {t}")[0] for t in ("messages", "turns", "resets"))

    def added(tenant: str, rid: str) -> list[Message] | None:
        row = query("SELECT added FROM responses WHERE tenant = ? AND id = ?", tenant, rid)
        return None if row is None else list(json.loads(row[0]))

    return Impl(
        "sqlite",
        HistoryStore(path),
        lambda: HistoryStore(path),
        str(path),
        lambda sid: query(
            "SELECT COUNT(*) FROM messages WHERE session_id = ? AND superseded_at IS NOT NULL", sid
        )[0],
        rows,
        added,
    )


def redis_impl(url: str, raw: RedisTarget) -> Impl:
    """The raw reads follow the key layout drawn in :mod:`continuum.store.redis_history`."""
    client, key = raw.client, raw.key

    def rows() -> int:
        lists = ("messages", "superseded", "turns", "resets")
        names = [n for what in lists for n in client.scan_iter(match=key(what, "*"))]
        return sum(int(client.llen(n)) for n in names)

    def added(tenant: str, rid: str) -> list[Message] | None:
        value = client.hget(key("response", json.dumps([tenant, rid])), "added")
        return None if value is None else list(json.loads(value))

    store = RedisHistoryStore(url)
    return Impl(
        "redis",
        store,
        lambda: RedisHistoryStore(url),
        store.path,
        lambda sid: int(client.llen(key("superseded", "{" + sid + "}"))),
        rows,
        added,
    )


def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    """The implementation ``request.param`` names, closed after the test (``impl``'s body)."""
    if request.param == "sqlite":
        made = sqlite_impl(tmp_path / "nested" / "history.db")
        yield made
        made.store.close()
        return
    url: str = request.getfixturevalue("redis_url")
    raw = RedisTarget(url)
    made = redis_impl(url, raw)
    yield made
    made.store.close()
    raw.close()


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    yield from opened(request, tmp_path)


@pytest.fixture
def history(impl: Impl) -> HistoryLog:
    return impl.store


# -- helpers ------------------------------------------------------------------------------------
def stored(role: str, content: str, tokens: tuple[int, ...] | None = None) -> StoredMessage:
    msg = {"role": role, "content": content}
    return StoredMessage(msg, message_identity(msg), tokens, DIGEST if tokens is not None else None)


def new_session(store: HistoryLog, session_id: str | None = None, tenant: str = "") -> str:
    return store.create_session(
        model_digest=DIGEST,
        chat_format="gemma",
        system="Be brief.",
        continuity=None,
        config={"n_ctx": 2048, "high_water": 1843},
        session_id=session_id,
        tenant=tenant,
    )


def commit(
    store: HistoryLog,
    sid: str,
    keep: int,
    *new: StoredMessage,
    metrics: dict[str, Any] | None = None,
    **kw: Any,
) -> int:
    return store.commit_turn(
        sid,
        keep=keep,
        new=list(new),
        finish_reason="stop",
        metrics={} if metrics is None else metrics,
        system="Be brief.",
        **kw,
    )


def contents(store: HistoryLog, sid: str) -> list[str]:
    return [m.message["content"] for m in store.messages(sid)]


# -- sessions -----------------------------------------------------------------------------------
def test_create_and_load_session(history: HistoryLog) -> None:
    sid = new_session(history)
    assert len(sid) == 32
    rec = history.load_session(sid)
    assert rec.id == sid
    assert rec.model_digest == DIGEST
    assert rec.chat_format == "gemma"
    assert rec.system == "Be brief."
    assert rec.continuity is None
    assert rec.config == {"n_ctx": 2048, "high_water": 1843}
    assert rec.turns == 0
    assert rec.tenant == "" and rec.note is None
    assert abs(rec.created_at - time.time()) < 60
    assert history.messages(sid) == [] and history.turns(sid) == [] and history.resets(sid) == []


def test_explicit_session_id(history: HistoryLog) -> None:
    assert new_session(history, "mine") == "mine"
    assert history.load_session("mine").id == "mine"


def test_unknown_session_is_not_found(history: HistoryLog) -> None:
    with pytest.raises(SessionNotFound) as info:
        history.load_session("doesnotexist")
    assert info.value.session_id == "doesnotexist"
    assert "no session 'doesnotexist'" in str(info.value)


def test_sessions_turns_and_supersede(history: HistoryLog) -> None:
    sid = new_session(history, tenant="acme")
    rec = history.load_session(sid)
    assert (rec.tenant, rec.turns, rec.system) == ("acme", 0, "Be brief.")
    assert rec.config["tenant"] == "acme"
    assert commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1", (5, 6))) == 1
    assert commit(history, sid, 1, stored("assistant", "edited", (7,))) == 2  # supersedes a1
    assert contents(history, sid) == ["u1", "edited"]
    assert history.messages(sid)[1].gen_tokens == (7,)
    assert [t["turn"] for t in history.turns(sid)] == [1, 2]
    assert history.load_session(sid).turns == 2
    assert commit(history, sid, 0) == 3 and contents(history, sid) == []  # keep=0 drops all
    assert history.session_tenant(sid) == "acme" and history.count_sessions("acme") == 1


def test_bad_ids_and_duplicates_change_nothing(history: HistoryLog) -> None:
    new_session(history, "dup")
    commit(history, "dup", 0, stored("user", "u1"))
    with pytest.raises(SessionExists):
        new_session(history, "dup")
    assert contents(history, "dup") == ["u1"]
    for call in (history.load_session, history.session_tenant):
        with pytest.raises(SessionNotFound):
            call("ghost")
    with pytest.raises(InvalidRequest, match="pass one tenant"):
        history.create_session(
            model_digest=DIGEST,
            chat_format="gemma",
            system=None,
            continuity=None,
            config={"tenant": "a"},
            tenant="b",
        )
    assert history.delete_session("dup") and not history.delete_session("dup")
    assert history.messages("dup") == [] and history.count_sessions("") == 0


def test_a_deleted_session_takes_its_whole_log_with_it(impl: Impl) -> None:
    history = impl.store
    sid = new_session(history, tenant="acme")
    reset = {"reason": "evicted", "detail": "", "tokens_dropped": 1, "tokens_rebuilt": 2}
    commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1"))
    commit(history, sid, 1, stored("assistant", "a1'"), metrics={"resets": [reset]})
    assert impl.rows() == 6 and impl.superseded(sid) == 1  # 3 messages, 2 turns, 1 reset
    assert history.delete_session(sid)
    assert history.turns(sid) == [] and history.resets(sid) == [] and history.messages(sid) == []
    assert history.count_sessions("acme") == 0 and impl.rows() == 0
    with pytest.raises(SessionNotFound):
        history.load_session(sid)
    assert new_session(history, sid, tenant="acme") == sid  # the id is free again
    assert history.load_session(sid).turns == 0 and history.messages(sid) == []


def test_sessions_are_counted_per_tenant(history: HistoryLog) -> None:
    a = [new_session(history, tenant="acme") for _ in range(3)]
    new_session(history, tenant="globex")
    legacy = history.create_session(  # a tenant given in config alone, as before its field
        model_digest=DIGEST,
        chat_format="gemma",
        system=None,
        continuity=None,
        config={"tenant": "acme"},
    )
    assert (
        history.session_tenant(legacy) == "acme" and history.load_session(legacy).tenant == "acme"
    )
    assert (history.count_sessions("acme"), history.count_sessions("globex")) == (4, 1)
    assert history.count_sessions("") == 0 and history.count_sessions("initech") == 0
    history.delete_session(a[0])
    assert history.count_sessions("acme") == 3


# -- turns --------------------------------------------------------------------------------------
def test_commit_turn_appends_in_order(history: HistoryLog) -> None:
    sid = new_session(history)
    assert commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1")) == 1
    assert commit(history, sid, 2, stored("user", "u2"), stored("assistant", "a2")) == 2
    assert contents(history, sid) == ["u1", "a1", "u2", "a2"]
    assert history.load_session(sid).turns == 2
    assert [t["turn"] for t in history.turns(sid)] == [1, 2]


def test_commit_turn_supersedes_from_keep(impl: Impl) -> None:
    history = impl.store
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1"))
    commit(history, sid, 2, stored("user", "u2"), stored("assistant", "a2"))
    # an edit of message 2 (u2): keep the first two, replace the rest
    commit(history, sid, 2, stored("user", "u2-edited"), stored("assistant", "a2'"))
    assert contents(history, sid) == ["u1", "a1", "u2-edited", "a2'"]
    assert impl.superseded(sid) == 2  # superseded messages are kept in the log, never deleted


def test_messages_keep_identity_and_body(history: HistoryLog) -> None:
    sid = new_session(history)
    msg = stored("user", "héllo ✓")
    commit(history, sid, 0, msg)
    assert history.messages(sid) == [msg]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": "c1", "content": '{"a": [1, 2.5, null]}'}
    rich = [StoredMessage(m, message_identity(m)) for m in (call, tool)]
    commit(history, sid, 1, *rich)
    assert history.messages(sid) == [msg, *rich]


def test_messages_are_per_session(history: HistoryLog) -> None:
    a, b = new_session(history), new_session(history)
    commit(history, a, 0, stored("user", "for a"))
    commit(history, b, 0, stored("user", "for b"))
    assert contents(history, a) == ["for a"]
    assert contents(history, b) == ["for b"]


def test_gen_tokens_round_trip(history: HistoryLog) -> None:
    sid = new_session(history)
    tokens = (0, 1, 2, 262_143, 2**31 - 1)
    commit(history, sid, 0, stored("user", "q"), stored("assistant", "a", tokens))
    user, assistant = history.messages(sid)
    assert user.gen_tokens is None and user.gen_model is None
    assert assistant.gen_tokens == tokens
    assert assistant.gen_model == DIGEST
    commit(history, sid, 2, stored("assistant", "empty", ()))
    assert history.messages(sid)[2].gen_tokens == ()  # none generated is not "not generated"


def test_turn_metrics_and_resets_are_stored(history: HistoryLog) -> None:
    sid = new_session(history)
    reset = {
        "reason": "high_water",
        "detail": "rebuilt from bounded history",
        "tokens_dropped": 1800,
        "tokens_rebuilt": 600,
    }
    first = {"prompt_tokens_evaluated": 12, "resets": []}
    commit(history, sid, 0, stored("user", "q"), metrics=first)
    metrics = {"prompt_tokens_evaluated": 600, "resets": [reset]}
    commit(history, sid, 1, stored("user", "q2"), metrics=metrics)
    assert history.resets(sid) == [{"turn": 2, **reset}]
    turns = history.turns(sid)
    assert turns[0] == {"turn": 1, "finish_reason": "stop", "metrics": first}
    assert turns[1] == {
        "turn": 2,
        "finish_reason": "stop",
        "metrics": {"prompt_tokens_evaluated": 600, "resets": [reset]},
    }


def test_resets_are_logged_with_their_turn(history: HistoryLog) -> None:
    sid = new_session(history)
    reset = {"reason": "divergence", "detail": "m2", "tokens_dropped": 9, "tokens_rebuilt": 4}
    commit(history, sid, 0, stored("user", "u1"))
    commit(history, sid, 1, stored("user", "u2"), metrics={"resets": [reset]})
    assert history.resets(sid) == [{"turn": 2, **reset}]
    assert history.turns(sid)[1]["metrics"]["resets"] == [reset]


def test_commit_turn_records_system(history: HistoryLog) -> None:
    sid = new_session(history)
    history.commit_turn(sid, keep=0, new=[], finish_reason="stop", metrics={}, system="New.")
    assert history.load_session(sid).system == "New."
    history.commit_turn(sid, keep=0, new=[], finish_reason="stop", metrics={}, system=None)
    assert history.load_session(sid).system is None


def test_a_continuity_note_is_the_last_turns_own(history: HistoryLog) -> None:
    sid = new_session(history)
    note = ContinuityNote(2, "the user asked about order 42 ✓")
    commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1"), note=note)
    assert history.load_session(sid).note == note
    commit(history, sid, 2, stored("user", "u2"))  # a turn without a note clears it
    assert history.load_session(sid).note is None


def test_expected_turn_is_compare_and_swap(history: HistoryLog) -> None:
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "u1"), expected_turn=0)
    with pytest.raises(TurnConflict) as info:
        commit(history, sid, 1, stored("user", "late"), expected_turn=0)
    assert (info.value.expected, info.value.found) == (0, 1)
    assert contents(history, sid) == ["u1"] and history.load_session(sid).turns == 1


_turn = st.tuples(
    st.integers(0, 5),  # keep (cut to the history's length: past the end is its own test)
    st.lists(
        st.tuples(st.text(max_size=6), st.none() | st.lists(st.integers(0, 2**31 - 1), max_size=3)),
        max_size=3,
    ),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(turns=st.lists(_turn, max_size=6))
def test_the_history_is_what_a_list_of_turns_makes_it(
    impl: Impl, turns: list[tuple[int, list[tuple[str, list[int] | None]]]]
) -> None:
    """Against a naive oracle: each turn keeps ``history[:keep]`` and appends its messages;
    what it drops is kept as superseded."""
    history = impl.store
    sid = new_session(history, uuid.uuid4().hex)
    oracle: list[StoredMessage] = []
    dropped = 0
    for n, (keep, texts) in enumerate(turns, 1):
        keep = min(keep, len(oracle))
        new = [stored("user", t, None if g is None else tuple(g)) for t, g in texts]
        assert commit(history, sid, keep, *new, expected_turn=n - 1) == n
        dropped += len(oracle) - keep
        oracle = oracle[:keep] + new
        assert history.messages(sid) == oracle
    assert history.load_session(sid).turns == len(turns)
    assert [t["turn"] for t in history.turns(sid)] == list(range(1, len(turns) + 1))
    assert impl.superseded(sid) == dropped


def test_a_keep_past_the_end_keeps_everything(history: HistoryLog) -> None:
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "m0"))
    commit(history, sid, 5, stored("user", "x"))  # keeps all of the history (one message)
    assert contents(history, sid) == ["m0", "x"]
    commit(history, sid, 2, stored("user", "y"))  # keeps both: m0 and x
    assert contents(history, sid) == ["m0", "x", "y"]


def test_a_negative_keep_is_refused_and_changes_nothing(history: HistoryLog) -> None:
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "m0"))
    with pytest.raises(InvalidRequest, match="keep"):
        commit(history, sid, -1, stored("user", "neg"))
    assert contents(history, sid) == ["m0"] and history.load_session(sid).turns == 1


# -- failures leave the log unchanged -----------------------------------------------------------
def test_duplicate_session_id_changes_nothing(impl: Impl) -> None:
    history = impl.store
    new_session(history, "dup")
    commit(history, "dup", 0, stored("user", "u1"))
    with pytest.raises(SessionExists, match="exists already") as info:
        history.create_session(
            model_digest="sha256:other",
            chat_format="chatml",
            system=None,
            continuity=None,
            config={},
            session_id="dup",
        )
    assert info.value.session_id == "dup" and impl.where not in str(info.value)
    rec = history.load_session("dup")
    assert (rec.model_digest, rec.chat_format, rec.turns) == (DIGEST, "gemma", 1)
    assert contents(history, "dup") == ["u1"]
    # and the store is still usable afterwards
    commit(history, "dup", 1, stored("assistant", "a1"))
    assert contents(history, "dup") == ["u1", "a1"]


def test_failed_commit_turn_is_rolled_back(impl: Impl) -> None:
    history = impl.store
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1"))
    broken_reset = {"reason": "divergence"}  # fails after supersede and inserts have run
    with pytest.raises(KeyError):
        commit(history, sid, 0, stored("user", "other"), metrics={"resets": [broken_reset]})
    assert contents(history, sid) == ["u1", "a1"]
    assert history.load_session(sid).turns == 1
    assert history.resets(sid) == [] and impl.superseded(sid) == 0


def test_commit_turn_for_unknown_session_writes_nothing(impl: Impl) -> None:
    with pytest.raises(SessionNotFound):
        commit(impl.store, "ghost", 0, stored("user", "boo"))
    assert impl.rows() == 0


def test_an_unknown_session_is_no_turn_conflict(impl: Impl) -> None:
    with pytest.raises(SessionNotFound):
        commit(impl.store, "ghost", 0, stored("user", "boo"), expected_turn=3)
    assert impl.rows() == 0


# -- more than one store object on the same data ------------------------------------------------
def test_second_instance_sees_the_same_data(impl: Impl) -> None:
    history = impl.store
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "u1"), stored("assistant", "a1", (5, 6)))
    other = impl.open()  # while the first is still open
    try:
        assert other.load_session(sid) == history.load_session(sid)
        assert other.messages(sid) == history.messages(sid)
        commit(other, sid, 2, stored("user", "u2"))
    finally:
        other.close()
    assert contents(history, sid) == ["u1", "a1", "u2"]


def test_reopen_after_close(impl: Impl) -> None:
    first = impl.open()
    sid = new_session(first)
    commit(first, sid, 0, stored("user", "u1"), stored("assistant", "a1", (7,)))
    expected = first.messages(sid)
    first.close()
    second = impl.open()
    try:
        assert second.messages(sid) == expected
        assert second.load_session(sid).turns == 1
    finally:
        second.close()
