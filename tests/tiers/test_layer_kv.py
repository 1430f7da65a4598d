"""The KV snapshot format and the layer-KV tier's index over the snapshot store (no model
needed: the payload is opaque bytes here; restoring real KV is tested in test_engine.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from continuum import SnapshotError
from continuum.store.base import SnapshotEntry
from continuum.store.snapshots import FileSnapshotStore, decode_snapshot, encode_snapshot, file_name
from continuum.tiers.layer_kv import LayerKVTier

CTX = {"type_k": "f16", "swa_full": True}


def blob(tokens: list[int] = [2, 5, 7], payload: bytes = b"kv" * 100, model: str = "m") -> bytes:  # noqa: B006
    return encode_snapshot(
        namespace="ns", model=model, ctx=CTX, tokens=tokens, payload=payload, prefix="h"
    )


def test_round_trip() -> None:
    snap = decode_snapshot(blob(), model="m", ctx=CTX)
    assert snap.tokens == (2, 5, 7) and snap.payload == b"kv" * 100 and snap.namespace == "ns"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:6], "bad magic"),
        (lambda b: b[:4] + struct.pack("<I", 10**6) + b[8:], "truncated inside its header"),
        (lambda b: b[:-1], "header says"),
        (lambda b: b + b"x", "header says"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "checksum"),
        (lambda b: b[:4] + struct.pack("<I", 3) + b"{x}" + b[8 + 3 :], "not valid JSON"),
    ],
)
def test_corrupt_or_truncated_snapshots_are_refused(damage, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SnapshotError, match=message):
        decode_snapshot(damage(blob()), model="m", ctx=CTX)


def test_incompatible_snapshots_are_refused() -> None:
    with pytest.raises(SnapshotError, match="model"):
        decode_snapshot(blob(model="other"), model="m", ctx=CTX)
    with pytest.raises(SnapshotError, match="context config"):
        decode_snapshot(blob(), model="m", ctx={**CTX, "swa_full": False})


def entry(tokens: list[int], payload: bytes = b"kv" * 100, model: str = "m") -> SnapshotEntry:
    return SnapshotEntry("ns", tuple(tokens), payload, model, CTX, f"h{tokens}")


def test_ram_budget_evicts_but_disk_keeps(tmp_path: Path) -> None:
    tier = LayerKVTier(ram_budget_bytes=500, directory=tmp_path)
    refs = [tier.put("ns", [2, i, i], entry([2, i, i])) for i in range(3)]
    stats = tier.stats()
    assert stats["ram_evictions"] >= 1 and stats["ram_bytes"] <= 500
    loaded = tier.load(refs[0], model="m", ctx=CTX)
    assert loaded is not None and loaded.source == "disk"
    last = tier.load(refs[-1], model="m", ctx=CTX)
    assert last is not None and last.source == "ram" and last.entry == entry([2, 2, 2])
    match = tier.find("ns", [2, 1, 1, 9])
    assert match is not None and match.length == 3 and match.handle == refs[1]
    assert tier.find("other-ns", [2, 1, 1]) is None


def test_a_snapshot_for_another_model_is_refused_and_deleted(tmp_path: Path) -> None:
    tier = LayerKVTier(directory=tmp_path)
    ref = tier.put("ns", [2, 3], entry([2, 3], model="other"))
    with pytest.raises(SnapshotError, match="model"):
        tier.load(ref, model="m", ctx=CTX)
    assert not list(tmp_path.glob("*.ckv"))


def test_drop_forgets_and_deletes(tmp_path: Path) -> None:
    tier = LayerKVTier(directory=tmp_path)
    ref = tier.put("ns", [2, 3], entry([2, 3]))
    tier.drop("ns", [2, 3], ref)
    assert tier.find("ns", [2, 3]) is None and tier.corrupt == 1
    assert not list(tmp_path.glob("*.ckv")) and tier.stats()["ram_bytes"] == 0


def test_restore_index_needs_the_file(tmp_path: Path) -> None:
    tier = LayerKVTier(directory=tmp_path)
    ref = tier.put("ns", [2, 3], entry([2, 3]))
    fresh = LayerKVTier(directory=tmp_path)
    assert fresh.restore_index("ns", [2, 3], ref)
    (tmp_path / file_name(ref.snapshot_id)).unlink()
    again = LayerKVTier(directory=tmp_path)
    assert not again.restore_index("ns", [2, 3], ref)


def test_one_store_serves_layer_kv_and_parked_sessions_under_one_disk_budget(
    tmp_path: Path,
) -> None:
    big = b"x" * 4000
    store = FileSnapshotStore(ram_budget_bytes=0, directory=tmp_path, disk_budget_bytes=10_000)
    tier = LayerKVTier(store=store)
    tier.put("ns", [1, 2], entry([1, 2], big))
    store.put("session:s1", entry([9, 9], big))  # a parked session, written back at once
    tier.put("ns", [3, 4], entry([3, 4], big))  # over the budget: the oldest file goes
    s = store.stats()
    assert s.disk_evictions == 1 and s.disk_bytes <= 10_000 and s.disk_files == 2
    assert tier.find("ns", [1, 2]) is not None  # still indexed: a lookup misses and drops it
    assert tier.load(tier.find("ns", [1, 2]).handle, model="m", ctx=CTX) is None  # type: ignore[union-attr]


def test_parked_sessions_are_borrowed_entries(tmp_path: Path) -> None:
    store = FileSnapshotStore(ram_budget_bytes=1 << 20, directory=tmp_path)
    tier = LayerKVTier(store=store, max_entries=1)
    wake = (2, 5, 7)
    for sid in ("a", "b"):  # two sessions of one tenant, the same system prompt
        store.put(f"session:{sid}", entry([*wake, 9, 9]))
        tier.parked("ns", f"session:{sid}", wake, 200)
    first = tier.index.get("ns", wake)
    assert first is not None and first.borrowed and first.snapshot_id == "session:a"
    tier.unparked("session:a")  # a is live again: b serves the prefix now
    second = tier.index.get("ns", wake)
    assert second is not None and second.snapshot_id == "session:b"
    tier.put("ns", [3, 3, 3], entry([3, 3, 3]))  # evicts b's entry (capacity 1)...
    assert tier.index.get("ns", wake) is None
    assert "session:b" in store and "session:a" in store  # ...but never deletes its snapshot
    assert not tier.owns("ns", wake) and tier.owns("ns", [3, 3, 3])
    tier.unparked("session:b")
    tier.unparked("session:unknown")  # never parked: nothing happens
    assert tier.owns("ns", [3, 3, 3])


def test_a_parked_session_never_displaces_an_owned_snapshot(tmp_path: Path) -> None:
    store = FileSnapshotStore(ram_budget_bytes=1 << 20, directory=tmp_path)
    tier = LayerKVTier(store=store)
    tier.put("ns", [2, 5, 7], entry([2, 5, 7]))
    store.put("session:a", entry([2, 5, 7, 9]))
    tier.parked("ns", "session:a", (2, 5, 7), 200)
    assert tier.owns("ns", [2, 5, 7])
    tier.unparked("session:a")
    assert tier.owns("ns", [2, 5, 7]) and "session:a" in store


def test_the_index_names_the_snapshot_serving_the_longest_prefix_and_forgets_a_rejected_one(
    tmp_path: Path,
) -> None:
    """What a new session's wake asks of the index (``ParkedIndex.prefix_snapshot``): the
    snapshot serving most of its tokens, partly or wholly; ``reject`` forgets one that failed
    to load — a parked session's entry without deleting its snapshot (the session owns it)."""
    store = FileSnapshotStore(ram_budget_bytes=1 << 20, directory=tmp_path)
    tier = LayerKVTier(store=store)
    tier.put("ns", [2, 5], entry([2, 5]))
    store.put("session:a", entry([2, 5, 7, 9, 9]))
    tier.parked("ns", "session:a", (2, 5, 7), 200)
    found = tier.prefix_snapshot("ns", [2, 5, 7, 1])
    assert found is not None and (found.key, found.prefix, found.length) == (
        "session:a",
        (2, 5, 7),
        3,
    )
    short = tier.prefix_snapshot("ns", [2, 5, 4])  # only [2, 5] of the wake is shared
    assert short is not None and short.length == 2
    assert tier.prefix_snapshot("ns", [8]) is None and tier.prefix_snapshot("other", [2, 5]) is None
    tier.reject("ns", found)
    assert tier.index.get("ns", (2, 5, 7)) is None and "session:a" in store
    again = tier.prefix_snapshot("ns", [2, 5, 7, 1])
    assert again is not None and again.prefix == (2, 5) and again.length == 2
    tier.reject("ns", again)  # our own snapshot: forgotten and deleted
    assert tier.prefix_snapshot("ns", [2, 5, 7, 1]) is None and tier.corrupt == 2
