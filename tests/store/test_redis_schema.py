"""The Redis stores' schema version, on a real redis-server: a fresh prefix and one written
before versions existed are brought to the latest version; a newer one is refused with nothing
changed; steps run once in order, also with workers starting together."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from continuum.errors import StoreError
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.redis_schema import SCHEMA_VERSION, RedisStep, migrate, version
from tests.redis_server import RedisServer


@pytest.fixture
def target(redis_server: RedisServer) -> Iterator[RedisTarget]:
    t = RedisTarget(f"{redis_server.url}?prefix=schema-{uuid.uuid4().hex[:8]}")
    yield t
    t.close()


def new(store: RedisHistoryStore) -> str:
    return store.create_session(
        model_digest="sha256:" + "ab" * 32,
        chat_format="chatml",
        system="S",
        continuity=None,
        config={},
    )


def keys(t: RedisTarget) -> dict[bytes, bytes | None]:
    found = sorted(t.client.scan_iter(match=t.prefix + ":*"))
    return {k: t.client.dump(k) for k in found}


def test_a_fresh_prefix_gets_the_latest_version_when_a_store_connects(target: RedisTarget) -> None:
    assert version(target) == 0
    new(RedisHistoryStore(target))
    assert version(target) == SCHEMA_VERSION == 1
    assert migrate(target).applied == ()  # nothing left to do


def test_keys_written_before_versions_existed_are_kept_and_versioned(
    target: RedisTarget, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    store = RedisHistoryStore(target)
    sid = new(store)
    target.client.delete(target.key("schema"))  # as an older continuum left it
    before = {k: v for k, v in keys(target).items() if not k.endswith(b":schema")}
    later = RedisTarget(f"{redis_url}?prefix={target.prefix}")
    try:
        RedisHistoryStore(later)
        assert version(later) == 1
        after = {k: v for k, v in keys(later).items() if not k.endswith(b":schema")}
        assert after == before
        assert RedisHistoryStore(later).load_session(sid).system == "S"
    finally:
        later.close()


def test_a_newer_schema_is_refused_with_nothing_changed(target: RedisTarget) -> None:
    target.client.set(target.key("schema"), 7)
    target.client.set(target.key("other"), "kept")
    before = keys(target)
    with pytest.raises(StoreError, match=r"schema 7 .* newer .*schema version 7 > 1"):
        RedisHistoryStore(target)
    assert keys(target) == before


def test_steps_run_once_in_order_with_workers_starting_together(redis_server: RedisServer) -> None:
    prefix = f"schema-{uuid.uuid4().hex[:8]}"
    ran: list[tuple[int, str]] = []
    gate = threading.Barrier(4, timeout=10)

    def step(n: int) -> RedisStep:
        return RedisStep(n, f"step {n}", lambda t: ran.append((n, threading.current_thread().name)))

    steps = [step(1), step(2), step(3)]

    def start() -> None:
        t = RedisTarget(f"{redis_server.url}?prefix={prefix}")
        try:
            gate.wait()
            migrate(t, steps)
        finally:
            t.close()

    workers = [threading.Thread(target=start, name=f"w{i}") for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert [n for n, _ in ran] == [1, 2, 3]
    with pytest.raises(ValueError, match="in order"):
        migrate(RedisTarget(f"{redis_server.url}?prefix={prefix}"), [step(1), step(3)])
