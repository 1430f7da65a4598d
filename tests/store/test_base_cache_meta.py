"""The :class:`~continuum.store.base.CacheMetadataStore` contract, on every implementation: a
SQLite file in tmp_path (``CacheMetadataFile``) and a real redis-server (``RedisCacheMetadata``,
a key prefix of the test's own).

A save is read back by another store object (a new process) as it was written, a later save
replaces it whole, and a missing or newer save is a :class:`MetadataError` that changes
nothing. ``Impl.version``/``Impl.set_version`` read and write the stored format version
underneath the protocol. What only one store has (migrating an older file; Redis's corrupt
fields; a real model resuming from Redis) is tested in ``test_migrations.py`` and
``test_redis_cache_meta.py``. A behaviour the two stores do not share is pinned as the contract
and marked ``xfail(strict=True)`` on the store that breaks it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from continuum.errors import MetadataError
from continuum.store import cache_meta
from continuum.store.base import CacheMetadata, CacheMetadataStore
from continuum.store.cache_meta import CacheMetadataFile
from continuum.store.migrations import schema_version
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_client import RedisTarget
from tests.store.contract import KINDS

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


# -- the implementations ------------------------------------------------------------------------
@dataclass
class Impl:
    kind: str
    open: Callable[[], CacheMetadataStore]  # a store on the same data (another process)
    version: Callable[[], int]  # the format version the saved metadata says it is in
    set_version: Callable[[int], None]


def sqlite_impl(path: Path) -> Impl:
    def version() -> int:
        with closing(sqlite3.connect(path)) as db:
            return schema_version(db)

    def set_version(v: int) -> None:
        with closing(sqlite3.connect(path)) as db:
            db.execute(f"PRAGMA user_version={int(v)}")

    return Impl("sqlite", lambda: CacheMetadataFile(path), version, set_version)


def redis_impl(url: str, targets: list[RedisTarget]) -> Impl:
    """The raw reads follow the layout drawn in :mod:`continuum.store.redis_cache_meta`."""
    raw = RedisTarget(url)
    targets.append(raw)
    key = raw.key("cache_meta")

    def open_() -> CacheMetadataStore:
        target = RedisTarget(url)
        targets.append(target)
        return RedisCacheMetadata(target)

    return Impl(
        "redis",
        open_,
        lambda: int(raw.client.hget(key, "format_version")),
        lambda v: raw.client.hset(key, "format_version", str(v)),
    )


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    if request.param == "sqlite":
        yield sqlite_impl(tmp_path / "nested" / "meta.db")
        return
    targets: list[RedisTarget] = []
    yield redis_impl(request.getfixturevalue("redis_url"), targets)
    for target in targets:
        target.close()


# -- the contract -------------------------------------------------------------------------------
def test_a_save_reads_back_in_another_process(impl: Impl) -> None:
    impl.open().save(DATA)
    got = impl.open().load()
    assert got.memo == DATA.memo and got.snapshots == DATA.snapshots
    assert got.semantic == DATA.semantic
    assert got.meta == DATA.meta
    assert impl.version() == cache_meta.FORMAT_VERSION


def test_a_later_save_replaces_the_first_whole(impl: Impl) -> None:
    store = impl.open()
    store.save(DATA)
    store.save(CacheMetadata(meta={"namespace": "x"}, memo=[], snapshots=[]))
    got = impl.open().load()
    assert got.memo == [] and got.snapshots == [] and got.semantic == []
    assert got.meta == {"namespace": "x"}


def test_the_meta_read_back_is_the_meta_saved(impl: Impl) -> None:
    impl.open().save(DATA)
    assert impl.open().load() == DATA


def test_nothing_saved_is_a_metadata_error(impl: Impl) -> None:
    with pytest.raises(MetadataError):
        impl.open().load()


def test_a_newer_save_is_refused_and_left_as_it_is(impl: Impl) -> None:
    impl.open().save(DATA)
    impl.set_version(99)
    with pytest.raises(MetadataError) as info:
        impl.open().load()
    assert "newer than this continuum reads" in str(info.value)
    assert "upgrade continuum" in str(info.value)
    assert impl.version() == 99  # nothing was changed
