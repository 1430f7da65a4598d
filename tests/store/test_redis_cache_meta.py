"""Cache metadata in a real Redis: a missing, newer or corrupt save (written by hand) is a typed
error that changes nothing, and a new process resumes from it on the real model.

The :class:`~continuum.store.base.CacheMetadataStore` contract it shares with the SQLite file
(a save read back the same by another process, replaced whole) is tested on both in
``test_base_cache_meta.py``."""

from __future__ import annotations

import pytest

from continuum import BackendRegistry, GenerationParams, ModelFile, Session, TokenOp
from continuum.errors import MetadataError
from continuum.store import cache_meta
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_client import RedisTarget
from tests.store.test_base_cache_meta import DATA


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
