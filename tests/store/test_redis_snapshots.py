"""KV snapshots shared through a real redis-server: what only the Redis store has (entries cut
into chunks, Redis going down).

No model: payloads are made-up bytes (a worker's real KV going through Redis is tested in
``tests/stateful/test_worker_redis.py``). The :class:`~continuum.store.base.SnapshotStore`
contract it shares with the file store (write-back, the budget, verified reads, two store
objects on one Redis standing for two workers) is tested on both in ``test_base_snapshots.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from continuum.store.redis_client import RedisTarget
from continuum.store.redis_snapshots import RedisSnapshotStore
from tests.redis_server import RedisServer
from tests.store.test_base_snapshots import CTX, MODEL, entry


def store(url: str, **kw: int) -> RedisSnapshotStore:
    return RedisSnapshotStore(RedisTarget(url), **kw)  # type: ignore[arg-type]


def get(s: RedisSnapshotStore, key: str) -> tuple[object, str] | None:
    hit = s.get(key, model=MODEL, ctx=dict(CTX))
    return None if hit is None else (hit.entry, hit.source)


def test_chunks_reassemble_and_replacing_an_entry_drops_the_old_one(redis_url: str) -> None:
    a = store(redis_url, chunk_bytes=1000)
    a.put("big", entry(7, 10_000), durable=True)
    a.put("big", entry(8, 6000), durable=True)  # a new generation replaces the old chunks
    b = store(redis_url)
    assert get(b, "big") == (entry(8, 6000), "shared")
    target = RedisTarget(redis_url)
    chunks = list(target.client.scan_iter(match=target.key("kv", "blob", "*")))
    assert len(chunks) == 7  # ceil of the 6000-byte entry's file over 1000-byte chunks
    assert int(target.client.get(target.key("kv", "bytes"))) == a.stats().disk_bytes


def test_redis_down_keeps_ram_copies_and_raises_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "r").start()
    a = store(server.url)
    a.put("before", entry(1, 500), durable=True)
    server.kill()
    with caplog.at_level(logging.WARNING):
        a.put("during", entry(2, 500), durable=True)
        assert get(a, "during") == (entry(2, 500), "ram")
        assert get(a, "missing") is None  # a miss, not an error
        assert a.delete("before")  # its RAM copy
    assert a.stats().disk_errors == 1 and "kept in RAM" in caplog.text
    server.start()
    assert get(store(server.url), "before") == (entry(1, 500), "shared")  # AOF kept it
    server.stop()
