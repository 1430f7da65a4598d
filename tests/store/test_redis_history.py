"""The Redis history store against a real redis-server: what only a shared store has.

Two workers racing one turn, a Redis crash (SIGKILL) with AOF, Redis unreachable, URLs and key
prefixes. The :class:`~continuum.store.base.HistoryLog` contract it shares with the SQLite store
is tested on both in ``test_base_history.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from continuum.errors import InvalidRequest, SessionNotFound, StoreUnavailable, TurnConflict
from continuum.store.redis_history import RedisHistoryStore
from tests.redis_server import RedisServer, free_port
from tests.store.test_base_history import commit, contents, new_session, stored


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
