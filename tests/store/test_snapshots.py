"""The file snapshot store's own behaviour: the file format and names, a RAM-only store (no
directory), mtimes as the use order across restarts, and a disk that fails.

The :class:`~continuum.store.base.SnapshotStore` contract it shares with the Redis store (write-
back, the budget, verified reads) is tested on both in ``test_base_snapshots.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
import time
from pathlib import Path

import pytest

from continuum.errors import SnapshotError
from continuum.store import snapshots
from continuum.store.snapshots import (
    FileSnapshotStore,
    decode_snapshot,
    encode_snapshot,
    file_name,
)
from tests.store.test_base_snapshots import CTX, MODEL, entry, get


def path_of(directory: Path, key: str) -> Path:
    return directory / file_name(key)


def one_file_size(tmp_path: Path, size: int) -> int:
    probe = FileSnapshotStore(directory=tmp_path / "probe")
    probe.put("k0", entry(0, size), durable=True)
    return probe.stats().disk_bytes


# -- the format ---------------------------------------------------------------------------------
def test_the_file_layout_is_pinned() -> None:
    """b"CKV1" | u32 header length | header JSON | int32 LE tokens | payload — the layout
    earlier releases wrote, so their files still decode."""
    fields = {
        "namespace": "ns",
        "model": MODEL,
        "ctx": CTX,
        "tokens": [5, 6, 7],
        "payload": b"state",
        "prefix": "b2:x",
    }
    blob = encode_snapshot(**fields)  # type: ignore[arg-type]
    assert blob[:4] == snapshots.MAGIC == b"CKV1" and snapshots.FORMAT_VERSION == 1
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8 : 8 + hlen])
    assert set(header) == {
        "format",
        "model",
        "ctx",
        "namespace",
        "n_tokens",
        "prefix_hash",
        "tokens_b2",
        "payload_bytes",
        "payload_b2",
    }
    assert blob[8 + hlen : 8 + hlen + 12] == struct.pack("<3i", 5, 6, 7)
    assert blob.endswith(b"state")
    ours = decode_snapshot(blob, model=MODEL, ctx=CTX)
    assert (ours.namespace, ours.tokens, ours.payload) == ("ns", (5, 6, 7), b"state")
    keyed = encode_snapshot(**fields, key="k")  # type: ignore[arg-type]
    assert decode_snapshot(keyed, model=MODEL, ctx=CTX).payload == b"state"


def test_decode_refuses_what_is_not_a_snapshot() -> None:
    blob = encode_snapshot(namespace="n", model=MODEL, ctx=CTX, tokens=[1], payload=b"p", prefix="")
    for bad, problem in [
        (b"nope", "bad magic"),
        (blob[:10], "truncated"),
        (blob[:-1], "bytes, its header says"),
        (blob[:-1] + b"q", "checksum"),
        (b"CKV1\x02\x00\x00\x00[]", "not a JSON object"),
        (b"CKV1\x02\x00\x00\x00{}", "format None is not 1"),
    ]:
        with pytest.raises(SnapshotError, match=problem):
            decode_snapshot(bad, model=MODEL, ctx=CTX)


def test_file_names_are_digests_of_the_key(tmp_path: Path) -> None:
    expected = hashlib.blake2b(b"k", digest_size=16).hexdigest() + ".ckv"
    assert file_name("k") == expected
    store = FileSnapshotStore(directory=tmp_path / "d", ram_budget_bytes=0)
    odd = ["../../escape", "a/b\\c", "session:é✓", "", "x" * 1000]
    for i, key in enumerate(odd):
        store.put(key, entry(i))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted(map(file_name, odd))
    assert not (tmp_path / "escape").exists()
    assert all(get(store, key) is not None for key in odd)


# -- RAM ----------------------------------------------------------------------------------------
def test_ram_is_an_lru_within_its_budget() -> None:
    store = FileSnapshotStore(ram_budget_bytes=300)
    for i in (1, 2, 3):
        store.put(f"k{i}", entry(i))
    assert get(store, "k1") == (entry(1), "ram")  # k1 is now the most recent
    store.put("k4", entry(4))
    assert "k2" not in store and get(store, "k2") is None
    assert all(k in store for k in ("k1", "k3", "k4"))
    stats = store.stats()
    assert (stats.ram_entries, stats.ram_bytes, stats.ram_evictions) == (3, 300, 1)
    assert (stats.disk_files, stats.disk_writes) == (0, 0)
    assert sorted(store.keys()) == ["k1", "k3", "k4"]


def test_without_a_directory_an_entry_over_the_budget_is_not_kept() -> None:
    store = FileSnapshotStore(ram_budget_bytes=100)
    store.put("big", entry(1, 101))
    assert "big" not in store and store.stats().ram_evictions == 1
    assert store.flush("big") is False


# -- the directory -------------------------------------------------------------------------------
def test_the_page_cache_of_snapshot_files_can_be_dropped(tmp_path: Path) -> None:
    """What a "from disk" benchmark does before reading: every file flushed and advised out of
    the page cache; the entries still read back whole, from the disk."""
    store = FileSnapshotStore(directory=tmp_path)
    store.put("a", entry(1), durable=True)
    store.put("b", entry(2), durable=True)
    store.release_ram()
    assert store.drop_page_cache() == 2
    assert get(store, "a") == (entry(1), "disk") and get(store, "b") == (entry(2), "disk")
    assert FileSnapshotStore().drop_page_cache() == 0  # no directory, nothing to advise


def test_the_use_order_survives_a_restart(tmp_path: Path) -> None:
    size = one_file_size(tmp_path, 1000)
    d = tmp_path / "d"
    first = FileSnapshotStore(ram_budget_bytes=0, directory=d)
    for i in (1, 2, 3):
        first.put(f"k{i}", entry(i, 1000))
    for key, mtime in [("k1", 1000), ("k2", 3000), ("k3", 2000)]:
        os.utime(path_of(d, key), (mtime, mtime))
    second = FileSnapshotStore(ram_budget_bytes=0, directory=d, disk_budget_bytes=3 * size)
    assert get(second, "k2") is not None  # already the newest; a read touches the file
    assert path_of(d, "k2").stat().st_mtime > time.time() - 600
    second.put("k4", entry(4, 1000))  # over budget: k1 (oldest mtime) goes first
    assert not path_of(d, "k1").exists()
    second.put("k5", entry(5, 1000))  # then k3
    assert sorted(p.name for p in d.iterdir()) == sorted(map(file_name, ["k2", "k4", "k5"]))
    assert second.stats().disk_evictions == 2


def test_a_directory_over_budget_at_start_is_trimmed(tmp_path: Path) -> None:
    size = one_file_size(tmp_path, 1000)
    d = tmp_path / "d"
    first = FileSnapshotStore(ram_budget_bytes=0, directory=d)
    for i, mtime in [(1, 3000), (2, 1000), (3, 2000)]:
        first.put(f"k{i}", entry(i, 1000))
        os.utime(path_of(d, f"k{i}"), (mtime, mtime))
    second = FileSnapshotStore(directory=d, disk_budget_bytes=2 * size)
    assert sorted(second.keys()) == ["k1", "k3"]
    assert second.stats().disk_evictions == 1


# -- what is read back is verified (the rest: test_base_snapshots.py) ------------------------------
@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    FileSnapshotStore(directory=tmp_path).put("k", entry(7, 500), durable=True)
    return path_of(tmp_path, "k")


def test_a_file_renamed_to_another_key_is_rejected(on_disk: Path) -> None:
    on_disk.rename(path_of(on_disk.parent, "other"))
    store = FileSnapshotStore(directory=on_disk.parent)
    with pytest.raises(SnapshotError, match="holds key 'k'"):
        get(store, "other")


# -- failures of the disk ----------------------------------------------------------------------
def test_stray_temporary_files_are_swept_at_start(tmp_path: Path) -> None:
    FileSnapshotStore(directory=tmp_path).put("k", entry(1), durable=True)
    (tmp_path / (file_name("j") + ".tmp")).write_bytes(b"half a snapshot")
    (tmp_path / "other.tmp").write_bytes(b"")
    store = FileSnapshotStore(directory=tmp_path)
    assert store.stats().tmp_swept == 2
    assert [p.name for p in tmp_path.iterdir()] == [file_name("k")]


def test_a_full_disk_keeps_the_ram_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(path: Path, blob: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    store = FileSnapshotStore(ram_budget_bytes=200, directory=tmp_path)
    monkeypatch.setattr(snapshots, "write_atomic", full)
    with caplog.at_level(logging.WARNING, logger="continuum.store.snapshots"):
        store.put("k1", entry(1), durable=True)
        assert store.flush_all() == 0
    assert "No space left" in caplog.text and "kept in RAM" in caplog.text
    assert get(store, "k1") == (entry(1), "ram")
    assert store.stats().disk_errors == 2  # the durable put and the flush
    monkeypatch.undo()
    assert store.flush("k1") is True and path_of(tmp_path, "k1").exists()


def test_a_write_back_that_fails_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, blob: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(snapshots, "write_atomic", full)
    store = FileSnapshotStore(ram_budget_bytes=100, directory=tmp_path)
    store.put("k1", entry(1))
    store.put("k2", entry(2))  # k1 is pushed out and cannot be written: it is gone, counted
    stats = store.stats()
    assert (stats.ram_evictions, stats.disk_errors, stats.disk_writes) == (1, 1, 0)
    assert get(store, "k1") is None and get(store, "k2") is not None
