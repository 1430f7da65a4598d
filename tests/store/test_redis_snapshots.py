"""KV snapshots shared through a real redis-server: a RAM LRU in front, Redis behind it.

No model: payloads are made-up bytes (a worker's real KV going through Redis is tested in
``tests/stateful/test_worker_redis.py``). Two store objects on one Redis stand for two workers.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from continuum.errors import SnapshotError
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_snapshots import RedisSnapshotStore
from tests.redis_server import RedisServer
from tests.store.test_snapshots import CTX, MODEL, entry


def store(url: str, **kw: int) -> RedisSnapshotStore:
    return RedisSnapshotStore(RedisTarget(url), **kw)  # type: ignore[arg-type]


def get(s: RedisSnapshotStore, key: str) -> tuple[object, str] | None:
    hit = s.get(key, model=MODEL, ctx=dict(CTX))
    return None if hit is None else (hit.entry, hit.source)


def test_a_durable_put_is_read_by_another_worker(redis_url: str) -> None:
    a, b = store(redis_url), store(redis_url)
    e = entry(1, 5000)
    a.put("s1", e, durable=True)
    assert get(a, "s1") == (e, "ram")
    assert get(b, "s1") == (e, "shared")  # verified, decoded, equal
    assert get(b, "s1") == (e, "ram")  # and kept in b's RAM from then on
    assert "s1" in b and set(b.keys()) >= {"s1"}
    assert a.stats().disk_files == 1 and a.stats().disk_writes == 1


def test_ram_evictions_are_written_back_to_redis(redis_url: str) -> None:
    a, b = store(redis_url, ram_budget_bytes=250), store(redis_url)
    for tag in range(3):
        a.put(f"k{tag}", entry(tag, 100))  # the third pushes k0 out of a's RAM
    assert a.stats().ram_entries == 2 and a.stats().disk_writes == 1
    assert get(b, "k0") == (entry(0, 100), "shared")
    assert get(b, "k2") is None  # still only in a's RAM
    assert a.release_ram() == 2 and get(b, "k2") == (entry(2, 100), "shared")


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


def test_the_budget_deletes_the_least_recently_used_entries(redis_url: str) -> None:
    one = store(redis_url)
    one.put("probe", entry(0, 1000), durable=True)
    size = one.stats().disk_bytes
    one.delete("probe")
    a = store(redis_url, budget_bytes=int(size * 2.5))
    for tag in range(3):
        a.put(f"k{tag}", entry(tag, 1000), durable=True)
    b = store(redis_url)
    assert get(b, "k0") is None and get(b, "k1") is not None and get(b, "k2") is not None
    assert a.stats().disk_evictions == 1 and a.stats().disk_files == 2
    too_big = store(redis_url, budget_bytes=10)
    too_big.put("huge", entry(9, 1000), durable=True)  # over the whole budget: not written
    assert too_big.stats().disk_errors == 1 and get(b, "huge") is None
    assert get(too_big, "huge") == (entry(9, 1000), "ram")  # the RAM copy is kept


def test_a_corrupt_or_foreign_blob_is_rejected_and_deleted(redis_url: str) -> None:
    a = store(redis_url)
    a.put("s", entry(3, 2000), durable=True)
    target = RedisTarget(redis_url)
    (chunk,) = target.client.scan_iter(match=target.key("kv", "blob", "*"))
    blob = bytearray(target.client.get(chunk))
    blob[-1] ^= 0xFF
    target.client.set(chunk, bytes(blob))
    b = store(redis_url)
    with pytest.raises(SnapshotError, match="checksum"):
        get(b, "s")
    assert "s" not in b and b.stats().rejected == 1
    a.put("t", entry(4, 2000), durable=True)
    with pytest.raises(SnapshotError, match="model"):
        b.get("t", model="sha256:other", ctx=dict(CTX))
    assert get(store(redis_url), "t") is None  # deleted for everyone


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
