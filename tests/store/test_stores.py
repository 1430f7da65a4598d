"""Addresses and the protocol set at each: a SQLite file or a real Redis server, decided once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from continuum.errors import InvalidRequest, StoreUnavailable
from continuum.store.base import CacheMetadata
from continuum.store.cache_meta import CacheMetadataFile
from continuum.store.graph import GraphStore
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_graph import RedisGraphStore
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.redis_snapshots import RedisSnapshotStore
from continuum.store.snapshots import FileSnapshotStore
from continuum.store.sqlite import HistoryStore
from continuum.store.stores import SnapshotPlace, StoreAddress, Stores, default_store_path
from tests.redis_server import free_port

SRC = Path(__file__).resolve().parents[2] / "src" / "continuum"
PLACE = SnapshotPlace(ram_budget_bytes=1 << 20, disk_budget_bytes=1 << 24)


def test_an_address_is_a_file_or_a_redis_url(tmp_path: Path, redis_url: str) -> None:
    file = StoreAddress.parse(tmp_path / "h.db")
    assert file == StoreAddress(path=tmp_path / "h.db") and not file.shared
    assert StoreAddress.parse(str(tmp_path / "h.db")) == file
    assert file.value == tmp_path / "h.db" and file.sqlite == tmp_path / "h.db"
    shared = StoreAddress.parse(redis_url)
    assert shared.shared and shared.url == redis_url and shared.value == redis_url
    assert StoreAddress.parse(shared) is shared
    for default in (None, ""):
        assert StoreAddress.parse(default).path == default_store_path()


def test_a_redis_address_never_shows_its_password() -> None:
    address = StoreAddress.parse("redis://:s3cret@127.0.0.1:6379/0")
    assert "s3cret" not in str(address) and "***" in str(address)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:6379/abc", "not a number"),
        ("redis://127.0.0.1:6379/0?prefix=a b", "prefix"),
        ("redis://127.0.0.1:6379/0?prefix=", "prefix"),
        ("redis://127.0.0.1:notaport/0", "Redis URL"),
    ],
)
def test_a_malformed_redis_url_is_refused_when_parsed(url: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        StoreAddress.parse(url)


def test_a_file_opens_its_history_on_first_use_and_snapshots_beside_it(tmp_path: Path) -> None:
    stores = Stores.open(tmp_path / "h.db", PLACE)
    try:
        assert not (tmp_path / "h.db").exists()  # nothing kept a session yet
        assert isinstance(stores.snapshots, FileSnapshotStore)
        assert stores.snapshot_dir == tmp_path / "snapshots"
        assert stores.results is None and stores.vectors(10) is None and stores.redis is None
        assert isinstance(stores.history, HistoryStore) and stores.history is stores.history
        assert (tmp_path / "h.db").exists()
    finally:
        stores.close()
    with pytest.raises(InvalidRequest, match="closed"):
        stores.history  # noqa: B018 - closed stores open nothing again


def test_snapshots_go_where_the_place_says(tmp_path: Path) -> None:
    elsewhere = SnapshotPlace(1 << 20, None, directory=tmp_path / "kv")
    with_dir = Stores.open(tmp_path / "h.db", elsewhere)
    ram_only = Stores.open(tmp_path / "h.db", SnapshotPlace(1 << 20, on_disk=False))
    assert with_dir.snapshot_dir == tmp_path / "kv"
    assert ram_only.snapshot_dir is None and isinstance(ram_only.snapshots, FileSnapshotStore)
    with_dir.close()
    ram_only.close()


def test_redis_gives_the_whole_set_a_fleet_shares(redis_url: str) -> None:
    stores = Stores.open(redis_url, PLACE)
    try:
        assert isinstance(stores.history, RedisHistoryStore)
        assert isinstance(stores.snapshots, RedisSnapshotStore)
        assert stores.results is not None and stores.vectors(10) is not None
        assert stores.snapshot_dir is None
        assert stores.history.count_sessions("t") == 0  # it answers
    finally:
        stores.close()
    ram_only = Stores.open(redis_url, SnapshotPlace(1 << 20, on_disk=False))
    assert isinstance(ram_only.snapshots, FileSnapshotStore)
    ram_only.close()


def test_an_unreachable_redis_fails_at_open_and_says_what_to_do() -> None:
    with pytest.raises(StoreUnavailable, match="start Redis"):
        Stores.open(f"redis://127.0.0.1:{free_port()}/0", PLACE)


def test_a_given_log_is_used_as_it_is_and_left_open(tmp_path: Path, redis_url: str) -> None:
    log = HistoryStore(tmp_path / "h.db")
    stores = Stores.open(log, PLACE)
    assert stores.history is log and stores.snapshot_dir == tmp_path / "snapshots"
    stores.close()
    assert log.count_sessions("t") == 0  # still open: the caller's to close
    log.close()
    shared = RedisHistoryStore(redis_url)
    stores = Stores.open(shared, PLACE)
    assert stores.history is shared and isinstance(stores.snapshots, RedisSnapshotStore)
    stores.close()
    assert shared.count_sessions("t") == 0
    shared.close()


def test_each_address_opens_its_graph_and_cache_metadata(tmp_path: Path, redis_url: str) -> None:
    file, shared = StoreAddress.parse(tmp_path / "g.db"), StoreAddress.parse(redis_url)
    local_graph, shared_graph = file.graph(), shared.graph()
    assert isinstance(local_graph, GraphStore) and isinstance(shared_graph, RedisGraphStore)
    local_graph.close()
    shared_graph.close()
    data = CacheMetadata(meta={"namespace": "n"}, memo=[], snapshots=[], semantic=[])
    for address, kind in ((file, CacheMetadataFile), (shared, RedisCacheMetadata)):
        with address.cache_metadata() as store:
            assert isinstance(store, kind)
            store.save(data)
        with address.cache_metadata() as store:
            assert store.load().meta["namespace"] == "n"
    assert file.index_dir() == tmp_path / "g.db.indexes" and shared.index_dir() is None


def test_only_the_stores_module_asks_whether_an_address_is_redis() -> None:
    asking = {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if re.search(r"\bis_redis_url\(", p.read_text())
    }
    assert asking == {"store/stores.py", "store/redis_client.py"}
