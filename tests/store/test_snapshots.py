"""The snapshot store: RAM LRU with write-back, a budgeted directory, verified reads.

No model is needed: payloads are made-up bytes; what is under test is where they are kept.
"""

from __future__ import annotations

import dataclasses
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
    SnapshotEntry,
    decode_snapshot,
    encode_snapshot,
    file_name,
)

MODEL = "sha256:" + "cd" * 32
CTX = {"n_ctx": 2048, "type_k": "f16"}
TOKENS = (1, 2, 3, 4)  # 16 bytes against the RAM budget


def entry(tag: int, size: int = 100, namespace: str = "ns") -> SnapshotEntry:
    """An entry costing ``size`` bytes of RAM budget, its payload filled with ``tag``."""
    return SnapshotEntry(
        namespace=namespace,
        tokens=TOKENS,
        payload=bytes([tag]) * (size - 4 * len(TOKENS)),
        model=MODEL,
        ctx=dict(CTX),
        prefix_hash=f"b2:{tag}",
    )


def get(store: FileSnapshotStore, key: str) -> tuple[SnapshotEntry, str] | None:
    return store.get(key, model=MODEL, ctx=dict(CTX))


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


def test_replacing_an_entry_updates_the_accounting() -> None:
    store = FileSnapshotStore(ram_budget_bytes=1000)
    store.put("k", entry(1, 100))
    store.put("k", entry(2, 300))
    assert store.stats().ram_bytes == 300
    hit = get(store, "k")
    assert hit is not None and hit.entry == entry(2, 300)
    assert store.delete("k") and not store.delete("k")
    assert store.stats().ram_bytes == 0


# -- writing to disk ------------------------------------------------------------------------------
def test_an_entry_pushed_out_of_ram_is_written_back(tmp_path: Path) -> None:
    d = tmp_path / "snaps"
    store = FileSnapshotStore(ram_budget_bytes=200, directory=d)
    store.put("k1", entry(1))
    store.put("k2", entry(2))
    assert list(d.iterdir()) == []  # parking costs no disk write
    store.put("k3", entry(3))
    assert [p.name for p in d.iterdir()] == [file_name("k1")]
    stats = store.stats()
    assert (stats.ram_evictions, stats.disk_writes, stats.disk_files) == (1, 1, 1)
    assert get(store, "k1") == (entry(1), "disk")
    assert get(store, "k1") == (entry(1), "ram")  # a disk hit is promoted...
    assert store.stats().disk_writes == 2  # ...and pushed k2 out, written back
    store.put("k4", entry(4))  # pushes k3 out: written back
    store.put("k5", entry(5))  # pushes k1 out: its file is still good, nothing written
    assert store.stats().disk_writes == 3
    assert sorted(p.name for p in d.iterdir()) == sorted(map(file_name, ["k1", "k2", "k3"]))


def test_putting_the_same_entry_again_writes_nothing(tmp_path: Path) -> None:
    store = FileSnapshotStore(directory=tmp_path)
    store.put("k", entry(1), durable=True)
    store.put("k", entry(1), durable=True)
    store.put("k", entry(1))
    assert store.stats().disk_writes == 1 and path_of(tmp_path, "k").exists()


def test_a_durable_put_writes_at_once_and_keeps_the_ram_copy(tmp_path: Path) -> None:
    store = FileSnapshotStore(directory=tmp_path)
    store.put("k", entry(1), durable=True)
    assert path_of(tmp_path, "k").exists() and store.stats().disk_writes == 1
    assert get(store, "k") == (entry(1), "ram")
    assert store.flush("k") is True and store.stats().disk_writes == 1  # already there


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


def test_a_newer_put_removes_the_older_file(tmp_path: Path) -> None:
    store = FileSnapshotStore(directory=tmp_path)
    store.put("k", entry(1), durable=True)
    store.put("k", entry(2))  # RAM only: the file of entry 1 must not come back
    assert not path_of(tmp_path, "k").exists()
    assert "k" not in FileSnapshotStore(directory=tmp_path)


def test_flush_and_a_reopened_store(tmp_path: Path) -> None:
    first = FileSnapshotStore(directory=tmp_path)
    for i in (1, 2, 3):
        first.put(f"k{i}", entry(i, namespace=f"session-{i}"))
    assert first.stats().disk_files == 0
    assert first.flush("k1") is True
    assert first.flush_all() == 3
    assert first.stats().disk_writes == 3
    assert first.flush("unknown") is False
    second = FileSnapshotStore(directory=tmp_path)
    assert sorted(second.keys()) == ["k1", "k2", "k3"]
    assert "k2" in second and "k9" not in second
    hit = get(second, "k2")
    assert hit == (entry(2, namespace="session-2"), "disk")
    stats = second.stats()
    assert (stats.disk_files, stats.disk_writes, stats.ram_entries) == (3, 0, 1)
    assert second.delete("k3") and not path_of(tmp_path, "k3").exists()
    assert sorted(FileSnapshotStore(directory=tmp_path).keys()) == ["k1", "k2"]


# -- the disk budget ------------------------------------------------------------------------------
def test_the_disk_budget_deletes_the_least_recently_used_files(tmp_path: Path) -> None:
    size = one_file_size(tmp_path, 1000)
    d = tmp_path / "d"
    store = FileSnapshotStore(ram_budget_bytes=0, directory=d, disk_budget_bytes=3 * size + 10)
    for i in (1, 2, 3):
        store.put(f"k{i}", entry(i, 1000))  # RAM budget 0: each is written back at once
    assert store.stats().disk_files == 3
    assert get(store, "k1") is not None  # k1 becomes the most recently used
    store.put("k4", entry(4, 1000))
    assert sorted(p.name for p in d.iterdir()) == sorted(map(file_name, ["k1", "k3", "k4"]))
    stats = store.stats()
    assert (stats.disk_evictions, stats.disk_files, stats.disk_bytes) == (1, 3, 3 * size)
    assert "k2" not in store and get(store, "k2") is None


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


def test_a_file_alone_over_the_budget_is_not_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    size = one_file_size(tmp_path, 1000)
    d = tmp_path / "d"
    store = FileSnapshotStore(directory=d, disk_budget_bytes=2 * size)
    store.put("small", entry(1, 1000), durable=True)
    with caplog.at_level(logging.WARNING, logger="continuum.store.snapshots"):
        store.put("huge", entry(2, 3 * size), durable=True)
    assert "over the whole disk budget" in caplog.text and "'huge'" in caplog.text
    assert [p.name for p in d.iterdir()] == [file_name("small")]  # nothing else was deleted
    stats = store.stats()
    assert (stats.disk_errors, stats.disk_evictions, stats.disk_writes) == (1, 0, 1)
    assert get(store, "huge") == (entry(2, 3 * size), "ram")
    assert store.flush("huge") is False


# -- what is read back is verified ----------------------------------------------------------------
@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    FileSnapshotStore(directory=tmp_path).put("k", entry(7, 500), durable=True)
    return path_of(tmp_path, "k")


def damaged(blob: bytes, how: str) -> bytes:
    if how == "flipped":
        return blob[:-5] + bytes([blob[-5] ^ 0xFF]) + blob[-4:]
    if how == "truncated":
        return blob[: len(blob) // 2]
    return b"garbage" * 10


@pytest.mark.parametrize("how", ["flipped", "truncated", "garbage"])
def test_a_damaged_file_is_rejected_and_deleted(on_disk: Path, how: str) -> None:
    on_disk.write_bytes(damaged(on_disk.read_bytes(), how))
    store = FileSnapshotStore(directory=on_disk.parent)
    with pytest.raises(SnapshotError, match="KV snapshot 'k' rejected and deleted"):
        get(store, "k")
    assert not on_disk.exists() and "k" not in store
    assert store.stats().rejected == 1 and store.stats().disk_files == 0
    assert get(store, "k") is None


@pytest.mark.parametrize("other", [{"model": "sha256:other"}, {"ctx": {"n_ctx": 4096}}])
def test_a_file_for_another_model_or_context_is_rejected(
    on_disk: Path, other: dict[str, object]
) -> None:
    store = FileSnapshotStore(directory=on_disk.parent)
    want: dict[str, object] = {"model": MODEL, "ctx": dict(CTX), **other}
    with pytest.raises(SnapshotError, match="'k'"):
        store.get("k", **want)  # type: ignore[arg-type]
    assert not on_disk.exists()


def test_a_file_renamed_to_another_key_is_rejected(on_disk: Path) -> None:
    on_disk.rename(path_of(on_disk.parent, "other"))
    store = FileSnapshotStore(directory=on_disk.parent)
    with pytest.raises(SnapshotError, match="holds key 'k'"):
        get(store, "other")


@pytest.mark.parametrize("other", [{"model": "sha256:other"}, {"ctx": {"n_ctx": 4096}}])
def test_a_ram_entry_is_checked_for_model_and_context(
    tmp_path: Path, other: dict[str, object]
) -> None:
    store = FileSnapshotStore(directory=tmp_path)
    store.put("k", entry(1), durable=True)
    want: dict[str, object] = {"model": MODEL, "ctx": dict(CTX), **other}
    with pytest.raises(SnapshotError, match="'k' rejected"):
        store.get("k", **want)  # type: ignore[arg-type]
    assert "k" not in store and not path_of(tmp_path, "k").exists()


def test_a_ram_hit_skips_the_payload_checksum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileSnapshotStore(directory=tmp_path)
    store.put("k", entry(1), durable=True)

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("a RAM hit must not decode")

    monkeypatch.setattr(snapshots, "decode_snapshot", no_decoding)
    assert get(store, "k") == (entry(1), "ram")


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


def test_stats_are_a_frozen_record(tmp_path: Path) -> None:
    stats = FileSnapshotStore(directory=tmp_path).stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.ram_bytes = 1  # type: ignore[misc]
    assert dataclasses.asdict(stats) == {
        "ram_bytes": 0,
        "ram_entries": 0,
        "disk_bytes": 0,
        "disk_files": 0,
        "ram_evictions": 0,
        "disk_writes": 0,
        "disk_evictions": 0,
        "disk_errors": 0,
        "tmp_swept": 0,
        "rejected": 0,
    }


def test_budgets_are_byte_counts() -> None:
    with pytest.raises(ValueError, match="budgets"):
        FileSnapshotStore(ram_budget_bytes=-1)
    with pytest.raises(ValueError, match="budgets"):
        FileSnapshotStore(disk_budget_bytes=-1)
