"""Cache metadata in a real Redis: what the SQLite file holds, read back the same; a missing,
newer or corrupt save is a typed error that changes nothing; and a new process resumes from it
on the real model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from continuum import BackendRegistry, GenerationParams, ModelFile, Session, TokenOp
from continuum.errors import MetadataError
from continuum.store import cache_meta
from continuum.store.base import CacheMetadata
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_client import RedisTarget

DATA = CacheMetadata(
    meta={"namespace": "acme", "backend": "llamacpp", "model": "sha256:m", "memo_version": 3},
    memo=[("k1", 3, "Paris.", (1, 2, 3), "stop", 12), ("k2", 2, "", (), "length", 0)],
    snapshots=[("acme", (5, 6, 7), "snap-1", 3, 4096)],
    semantic=[
        (
            1,
            "part",
            "What is the capital of France?",
            1,
            "Paris.",
            (1, 2),
            "stop",
            9,
            np.arange(4, dtype=np.float32).tobytes(),
        ),
        (
            2,
            "part",
            "How far is the moon?",
            1,
            "Far.",
            (3,),
            "stop",
            7,
            np.ones(3, dtype=np.float32).tobytes(),
        ),
    ],
)


def test_a_save_reads_back_as_the_sqlite_file_does(redis_url: str, tmp_path: Path) -> None:
    store = RedisCacheMetadata(RedisTarget(redis_url))
    store.save(DATA)
    cache_meta.save(tmp_path / "meta.db", DATA)
    from_file = cache_meta.load(tmp_path / "meta.db")
    got = store.load()
    assert got.memo == from_file.memo and got.snapshots == from_file.snapshots
    assert got.semantic == from_file.semantic
    assert {k: v for k, v in got.meta.items() if k != "format_version"} == DATA.meta
    store.save(CacheMetadata(meta={"namespace": "x"}, memo=[], snapshots=[]))  # replaced whole
    assert store.load().memo == [] and store.load().semantic == []


def test_missing_newer_and_corrupt_saves_are_typed_errors(redis_url: str) -> None:
    target = RedisTarget(redis_url)
    store = RedisCacheMetadata(target)
    with pytest.raises(MetadataError, match="holds no saved cache metadata"):
        store.load()
    store.save(DATA)
    key = target.key("cache_meta")
    target.client.hset(key, "format_version", "99")
    with pytest.raises(MetadataError, match="newer than this continuum reads"):
        store.load()
    assert target.client.hget(key, "format_version") == b"99"  # nothing was changed
    target.client.hset(key, "format_version", str(cache_meta.FORMAT_VERSION))
    target.client.hset(key, "vectors", b"\x00\x01")  # torn: not the rows' vectors
    with pytest.raises(MetadataError, match="corrupt"):
        store.load()
    target.client.hset(key, "memo", "{not json")
    with pytest.raises(MetadataError, match="corrupt"):
        store.load()
    target.client.hdel(key, "format_version")
    with pytest.raises(MetadataError, match="not continuum cache metadata"):
        store.load()


def test_a_new_process_resumes_from_metadata_in_redis(gemma: ModelFile, redis_url: str) -> None:
    op = TokenOp(
        "answer",
        messages=({"role": "user", "content": "Name a colour."},),
        params=GenerationParams(max_tokens=6),
    )
    first = Session("acme", BackendRegistry(), model=gemma, n_ctx=2048)
    try:
        cold = first.run(op)
        first.save_cache_metadata(redis_url)
    finally:
        first.close()
    second = Session("acme", BackendRegistry(), model=gemma, n_ctx=2048)
    try:
        loaded = second.load_cache_metadata(redis_url)
        assert loaded["memo"] == 1
        again = second.run(op)
        # resuming bumps the memo version: the entry is kept but not served (DESIGN.md §3.10)
        assert again.metrics.hit_tier != "memo" and again.text == cold.text
    finally:
        second.close()
    third = Session("acme", BackendRegistry(), model=gemma, n_ctx=2048)
    try:
        with pytest.raises(MetadataError, match="holds no saved cache metadata"):
            third.load_cache_metadata(redis_url + "other")  # another prefix: nothing saved
    finally:
        third.close()
