"""The Redis history store against a real redis-server: the SQLite store's contract, shared.

The contract tests run on both stores (``history`` is parametrised), so the two cannot drift;
the rest is what only a shared store has: two workers racing one turn, a Redis crash (SIGKILL)
with AOF, and Redis unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from continuum.errors import (
    InvalidRequest,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    TurnConflict,
)
from continuum.stateful.config import open_history
from continuum.store.base import HistoryLog, StoredMessage
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.sqlite import HistoryStore
from tests.redis_server import RedisServer, free_port
from tests.store.test_sqlite import DIGEST, stored


@pytest.fixture(params=["sqlite", "redis"])
def history(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HistoryLog]:
    if request.param == "sqlite":
        store: Any = HistoryStore(tmp_path / "h.db")
    else:
        store = RedisHistoryStore(request.getfixturevalue("redis_url"))
    yield store
    store.close()


def new_session(store: HistoryLog, session_id: str | None = None, tenant: str = "") -> str:
    return store.create_session(
        model_digest=DIGEST,
        chat_format="gemma",
        system="Be brief.",
        continuity=None,
        config={"n_ctx": 2048},
        session_id=session_id,
        tenant=tenant,
    )


def commit(store: HistoryLog, sid: str, keep: int, *new: StoredMessage, **kw: Any) -> int:
    return store.commit_turn(
        sid,
        keep=keep,
        new=list(new),
        finish_reason="stop",
        metrics=kw.pop("metrics", {}),
        system="Be brief.",
        **kw,
    )


def contents(store: HistoryLog, sid: str) -> list[str]:
    return [m.message["content"] for m in store.messages(sid)]


# -- the contract, on both stores --------------------------------------------------------------
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


def test_resets_are_logged_with_their_turn(history: HistoryLog) -> None:
    sid = new_session(history)
    reset = {"reason": "divergence", "detail": "m2", "tokens_dropped": 9, "tokens_rebuilt": 4}
    commit(history, sid, 0, stored("user", "u1"))
    commit(history, sid, 1, stored("user", "u2"), metrics={"resets": [reset]})
    assert history.resets(sid) == [{"turn": 2, **reset}]
    assert history.turns(sid)[1]["metrics"]["resets"] == [reset]


def test_expected_turn_is_compare_and_swap(history: HistoryLog) -> None:
    sid = new_session(history)
    commit(history, sid, 0, stored("user", "u1"), expected_turn=0)
    with pytest.raises(TurnConflict) as info:
        commit(history, sid, 1, stored("user", "late"), expected_turn=0)
    assert (info.value.expected, info.value.found) == (0, 1)
    assert contents(history, sid) == ["u1"] and history.load_session(sid).turns == 1


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


def test_response_chains(history: HistoryLog) -> None:
    said = [{"role": "user", "content": c} for c in "abc"]
    history.put_response("t", "r1", None, said[:2], {"id": "r1"})
    history.put_response("t", "r2", "r1", said[2:], {"id": "r2"})
    got = history.get_response("t", "r2")
    assert got is not None and got[0] == {"id": "r2"} and got[1] == said
    assert history.get_response("other", "r2") is None  # per tenant
    assert history.delete_response("t", "r1") and not history.delete_response("t", "r1")
    assert history.get_response("t", "r1") is None
    assert history.get_response("t", "r2") == got  # continues through the tombstone
    history.put_response("t", "r3", None, said, {"id": "r3"}, retention_s=-1.0)
    assert history.get_response("t", "r3") is None and history.get_response("t", "r2") is None


# -- what only a shared store has ---------------------------------------------------------------
def test_two_workers_racing_one_turn_commit_it_once(redis_url: str) -> None:
    with RedisHistoryStore(redis_url) as a, RedisHistoryStore(redis_url) as b:
        sid = new_session(a)
        results: list[object] = []
        barrier = threading.Barrier(8)

        def race(store: RedisHistoryStore, n: int) -> None:
            barrier.wait()
            try:
                results.append(commit(store, sid, 0, stored("user", f"u{n}"), expected_turn=0))
            except TurnConflict as e:
                results.append(e)

        threads = [threading.Thread(target=race, args=(a if n % 2 else b, n)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(1) == 1 and sum(isinstance(r, TurnConflict) for r in results) == 7
        assert len(b.messages(sid)) == 1 and a.load_session(sid).turns == 1


def test_a_redis_crash_loses_no_committed_turn(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        store = RedisHistoryStore(server.url)
        sid = new_session(store)
        for turn in range(20):
            commit(store, sid, turn, stored("user", f"u{turn}"))
        server.kill()  # SIGKILL right after the last acknowledged commit
        with pytest.raises(StoreUnavailable):
            commit(store, sid, 20, stored("user", "during the outage"))
        server.start()  # replays the AOF
        assert contents(store, sid) == [f"u{t}" for t in range(20)]
        assert store.load_session(sid).turns == 20
        assert commit(store, sid, 20, stored("user", "after")) == 21  # and goes on
        store.close()
    finally:
        server.stop()


def test_redis_unreachable_is_store_unavailable_naming_no_password() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailable, match="start Redis") as info:
        RedisHistoryStore(url)
    assert "hunter2" not in str(info.value) and "***" in info.value.path


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis://127.0.0.1:1/0?prefix=a b", "key prefix"),
        ("redis://127.0.0.1:1/0?prefix=", "key prefix"),
        ("http://127.0.0.1:1/0", "not a Redis URL"),
        ("redis://127.0.0.1:1/notadb", "Redis URL"),
    ],
)
def test_bad_urls_are_invalid_requests(url: str, match: str) -> None:
    from continuum.store.redis_client import RedisTarget

    with pytest.raises(InvalidRequest, match=match):
        RedisTarget(url)


def test_prefixes_keep_deployments_apart(redis_server: RedisServer) -> None:
    with (
        RedisHistoryStore(f"{redis_server.url}?prefix=one") as one,
        RedisHistoryStore(f"{redis_server.url}?prefix=two") as two,
    ):
        sid = new_session(one, "same-id")
        commit(one, sid, 0, stored("user", "mine"))
        with pytest.raises(SessionNotFound):
            two.load_session("same-id")
        new_session(two, "same-id")  # no clash
        assert contents(two, "same-id") == [] and contents(one, "same-id") == ["mine"]
        one.delete_session("same-id")
        two.delete_session("same-id")


def test_open_history_picks_the_store_by_target(redis_url: str, tmp_path: Path) -> None:
    log, owned = open_history(redis_url)
    assert isinstance(log, RedisHistoryStore) and owned
    again, owned_again = open_history(log)
    assert again is log and not owned_again
    log.close()
    local, _ = open_history(tmp_path / "h.db")
    assert isinstance(local, HistoryStore)
    local.close()
