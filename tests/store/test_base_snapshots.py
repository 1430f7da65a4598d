"""The :class:`~continuum.store.base.SnapshotStore` contract, on every implementation: a RAM LRU
in front of a store further out, which is a directory (``FileSnapshotStore`` in tmp_path) or a
real redis-server (``RedisSnapshotStore``, a key prefix of the test's own).

No model is needed: payloads are made-up bytes; what is under test is where they are kept. An
entry read from behind RAM comes back with ``source`` "disk" or "shared" (``Impl.far``).
Several store objects on one directory or prefix stand for several processes. A few checks read
or damage what the store keeps underneath (``Impl.held``, ``Impl.count``, ``Impl.damage``).
What only one store has (the file layout, mtimes, a full disk; chunks, Redis down) is tested in
``test_snapshots.py`` and ``test_redis_snapshots.py``. A behaviour the two stores do not share
is pinned as the contract and marked ``xfail(strict=True)`` on the store that breaks it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from continuum.errors import SnapshotError
from continuum.store import redis_snapshots, snapshots
from continuum.store.base import SnapshotEntry, SnapshotHit, SnapshotStore
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_snapshots import RedisSnapshotStore
from continuum.store.snapshots import FileSnapshotStore, file_name
from tests.store.contract import xfail_on

MODEL = "sha256:" + "cd" * 32
CTX = {"n_ctx": 2048, "type_k": "f16"}
TOKENS = (1, 2, 3, 4)  # 16 bytes against the RAM budget
KINDS = ("file", "redis")


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


def get(store: SnapshotStore, key: str) -> SnapshotHit | None:
    return store.get(key, model=MODEL, ctx=dict(CTX))


# -- the implementations ------------------------------------------------------------------------
Opener = Callable[..., SnapshotStore]  # (ram_budget_bytes=..., budget_bytes=...) -> a store


@dataclass
class Impl:
    kind: str
    far: str  # the source of a hit read from behind RAM
    logger: str  # where its warnings go
    budget: str  # what its warnings call the budget further out
    open: Opener  # a store on the shared directory or prefix (another process)
    held: Callable[[str], bool]  # the store further out holds an entry under the key
    count: Callable[[], int]  # the entries it holds (files in the directory)
    damage: Callable[[str, Callable[[bytes], bytes]], None]  # rewrite a held entry's bytes


def file_impl(directory: Path) -> Impl:
    def open_(ram_budget_bytes: int = 256 << 20, budget_bytes: int | None = None) -> Any:
        return FileSnapshotStore(
            ram_budget_bytes=ram_budget_bytes, directory=directory, disk_budget_bytes=budget_bytes
        )

    def damage(key: str, how: Callable[[bytes], bytes]) -> None:
        path = directory / file_name(key)
        path.write_bytes(how(path.read_bytes()))

    directory.mkdir(parents=True, exist_ok=True)
    return Impl(
        "file",
        "disk",
        snapshots.__name__,
        "disk budget",
        open_,
        lambda key: (directory / file_name(key)).exists(),
        lambda: len(list(directory.iterdir())),
        damage,
    )


def redis_impl(url: str, targets: list[RedisTarget]) -> Impl:
    """The raw reads follow the key layout drawn in :mod:`continuum.store.redis_snapshots`."""
    raw = RedisTarget(url)
    targets.append(raw)
    client, k = raw.client, raw.key

    def digest(key: str) -> str:
        return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    def open_(ram_budget_bytes: int = 256 << 20, budget_bytes: int | None = None) -> Any:
        target = RedisTarget(url)
        targets.append(target)
        return RedisSnapshotStore(
            target, ram_budget_bytes=ram_budget_bytes, budget_bytes=budget_bytes
        )

    def damage(key: str, how: Callable[[bytes], bytes]) -> None:
        """Rewrite the entry's chunks as one chunk of ``how(blob)``."""
        meta = k("kv", "meta", digest(key))
        gen, n = client.hmget(meta, "gen", "chunks")
        names = [k("kv", "blob", f"{digest(key)}:{gen.decode()}:{i}") for i in range(int(n))]
        blob = b"".join(client.mget(names))
        client.delete(*names)
        client.set(names[0], how(blob))
        client.hset(meta, "chunks", 1)

    return Impl(
        "redis",
        "shared",
        redis_snapshots.__name__,
        "Redis budget",
        open_,
        lambda key: bool(client.exists(k("kv", "meta", digest(key)))),
        lambda: len(list(client.scan_iter(match=k("kv", "meta", "*")))),
        damage,
    )


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    if request.param == "file":
        yield file_impl(tmp_path / "snaps")
        return
    targets: list[RedisTarget] = []
    yield redis_impl(request.getfixturevalue("redis_url"), targets)
    for target in targets:
        target.close()


def stored_size(impl: Impl, size: int) -> int:
    """What one entry of ``size`` RAM bytes costs the store further out."""
    probe = impl.open()
    probe.put("k0", entry(0, size), durable=True)
    nbytes = probe.stats().disk_bytes
    assert probe.delete("k0") and impl.count() == 0
    return nbytes


# -- RAM and what leaves it -----------------------------------------------------------------------
def test_an_entry_pushed_out_of_ram_is_written_back(impl: Impl) -> None:
    store = impl.open(ram_budget_bytes=200)
    store.put("k1", entry(1))
    store.put("k2", entry(2))
    assert impl.count() == 0  # parking costs no write
    store.put("k3", entry(3))
    assert impl.held("k1") and impl.count() == 1
    stats = store.stats()
    assert (stats.ram_evictions, stats.disk_writes, stats.disk_files) == (1, 1, 1)
    assert get(store, "k1") == (entry(1), impl.far)
    assert get(store, "k1") == (entry(1), "ram")  # a far hit is promoted...
    assert store.stats().disk_writes == 2  # ...and pushed k2 out, written back
    store.put("k4", entry(4))  # pushes k3 out: written back
    store.put("k5", entry(5))  # pushes k1 out: its stored copy is still good, nothing written
    assert store.stats().disk_writes == 3
    assert all(map(impl.held, ["k1", "k2", "k3"])) and impl.count() == 3


def test_ram_evictions_are_read_by_another_store(impl: Impl) -> None:
    a, b = impl.open(ram_budget_bytes=250), impl.open()
    for tag in range(3):
        a.put(f"k{tag}", entry(tag, 100))  # the third pushes k0 out of a's RAM
    assert a.stats().ram_entries == 2 and a.stats().disk_writes == 1
    assert get(b, "k0") == (entry(0, 100), impl.far)
    assert get(b, "k2") is None  # still only in a's RAM
    assert a.release_ram("k1") == 1 and a.stats().ram_entries == 1
    assert get(b, "k1") == (entry(1, 100), impl.far)
    assert a.release_ram() == 1 and get(b, "k2") == (entry(2, 100), impl.far)
    assert a.release_ram("k2") == 0 and a.stats().ram_entries == 0
    assert get(a, "k2") == (entry(2, 100), impl.far)  # released, not forgotten


def test_replacing_an_entry_updates_the_accounting(impl: Impl) -> None:
    store = impl.open(ram_budget_bytes=1000)
    store.put("k", entry(1, 100))
    store.put("k", entry(2, 300))
    assert store.stats().ram_bytes == 300
    hit = get(store, "k")
    assert hit is not None and hit.entry == entry(2, 300)
    assert store.delete("k") and not store.delete("k")
    assert store.stats().ram_bytes == 0


def test_putting_the_same_entry_again_writes_nothing(impl: Impl) -> None:
    store = impl.open()
    store.put("k", entry(1), durable=True)
    store.put("k", entry(1), durable=True)
    store.put("k", entry(1))
    assert store.stats().disk_writes == 1 and impl.held("k")


def test_a_durable_put_writes_at_once_and_keeps_the_ram_copy(impl: Impl) -> None:
    store = impl.open()
    store.put("k", entry(1), durable=True)
    assert impl.held("k") and store.stats().disk_writes == 1
    assert get(store, "k") == (entry(1), "ram")
    assert store.flush("k") is True and store.stats().disk_writes == 1  # already there


def test_a_durable_put_is_read_by_another_store(impl: Impl) -> None:
    a, b = impl.open(), impl.open()
    e = entry(1, 5000)
    a.put("s1", e, durable=True)
    assert get(a, "s1") == (e, "ram")
    assert get(b, "s1") == (e, impl.far)  # verified, decoded, equal
    assert get(b, "s1") == (e, "ram")  # and kept in b's RAM from then on
    assert "s1" in b and set(b.keys()) >= {"s1"}
    assert a.stats().disk_files == 1 and a.stats().disk_writes == 1


@xfail_on(
    "redis",
    "by design: a RAM-only put leaves the older entry in Redis until the new one is written "
    "there (no round trip per park); another worker restores from it only the prefix it "
    "shares with the history, which the history verifies",
    KINDS,
)
def test_a_newer_put_removes_the_older_stored_entry(impl: Impl) -> None:
    store = impl.open()
    store.put("k", entry(1), durable=True)
    store.put("k", entry(2))  # RAM only: the stored entry 1 must not come back
    assert not impl.held("k")
    assert "k" not in impl.open()


def test_flush_and_a_reopened_store(impl: Impl) -> None:
    first = impl.open()
    for i in (1, 2, 3):
        first.put(f"k{i}", entry(i, namespace=f"session-{i}"))
    assert first.stats().disk_files == 0
    assert first.flush("k1") is True
    assert first.flush_all() == 3
    assert first.stats().disk_writes == 3
    assert first.flush("unknown") is False
    second = impl.open()
    assert sorted(second.keys()) == ["k1", "k2", "k3"]
    assert "k2" in second and "k9" not in second
    hit = get(second, "k2")
    assert hit == (entry(2, namespace="session-2"), impl.far)
    stats = second.stats()
    assert (stats.disk_files, stats.disk_writes, stats.ram_entries) == (3, 0, 1)
    assert second.delete("k3") and not impl.held("k3")
    assert sorted(impl.open().keys()) == ["k1", "k2"]


def test_a_key_held_only_further_out_is_deleted_there(impl: Impl) -> None:
    impl.open().put("k", entry(1), durable=True)
    other = impl.open()
    assert "k" in other and other.flush("k") is True  # nothing to write: it is there
    assert other.delete("k") and not other.delete("k")
    assert not impl.held("k") and get(impl.open(), "k") is None


def test_odd_keys_round_trip(impl: Impl) -> None:
    store = impl.open(ram_budget_bytes=0)  # every entry is written back at once
    odd = ["../../escape", "a/b\\c", "session:é✓", "", "x" * 1000, "{braces}:*"]
    for i, key in enumerate(odd):
        store.put(key, entry(i))
    assert impl.count() == len(odd)
    again = impl.open()
    assert sorted(again.keys()) == sorted(odd)
    assert all(get(again, key) == (entry(i), impl.far) for i, key in enumerate(odd))


# -- the budget of the store further out ----------------------------------------------------------
def test_the_budget_deletes_the_least_recently_used_entries(impl: Impl) -> None:
    size = stored_size(impl, 1000)
    store = impl.open(ram_budget_bytes=0, budget_bytes=3 * size + 10)
    for i in (1, 2, 3):
        store.put(f"k{i}", entry(i, 1000))  # RAM budget 0: each is written back at once
    assert store.stats().disk_files == 3
    assert get(store, "k1") is not None  # k1 becomes the most recently used
    store.put("k4", entry(4, 1000))
    assert all(map(impl.held, ["k1", "k3", "k4"])) and impl.count() == 3
    stats = store.stats()
    assert (stats.disk_evictions, stats.disk_files, stats.disk_bytes) == (1, 3, 3 * size)
    assert "k2" not in store and get(store, "k2") is None


def test_durable_puts_over_the_budget_delete_the_oldest(impl: Impl) -> None:
    size = stored_size(impl, 1000)
    a = impl.open(budget_bytes=int(size * 2.5))
    for tag in range(3):
        a.put(f"k{tag}", entry(tag, 1000), durable=True)
    b = impl.open()
    assert get(b, "k0") is None and get(b, "k1") is not None and get(b, "k2") is not None
    assert a.stats().disk_evictions == 1 and a.stats().disk_files == 2
    too_big = impl.open(budget_bytes=10)
    too_big.put("huge", entry(9, 1000), durable=True)  # over the whole budget: not written
    assert too_big.stats().disk_errors == 1 and get(b, "huge") is None
    assert get(too_big, "huge") == (entry(9, 1000), "ram")  # the RAM copy is kept


def test_an_entry_alone_over_the_budget_is_not_kept(
    impl: Impl, caplog: pytest.LogCaptureFixture
) -> None:
    size = stored_size(impl, 1000)
    store = impl.open(budget_bytes=2 * size)
    store.put("small", entry(1, 1000), durable=True)
    with caplog.at_level(logging.WARNING, logger=impl.logger):
        store.put("huge", entry(2, 3 * size), durable=True)
    assert f"over the whole {impl.budget}" in caplog.text and "'huge'" in caplog.text
    assert impl.held("small") and impl.count() == 1  # nothing else was deleted
    stats = store.stats()
    assert (stats.disk_errors, stats.disk_evictions, stats.disk_writes) == (1, 0, 1)
    assert get(store, "huge") == (entry(2, 3 * size), "ram")
    assert store.flush("huge") is False


# -- what is read back is verified --------------------------------------------------------------
DAMAGE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "flipped": (lambda b: b[:-5] + bytes([b[-5] ^ 0xFF]) + b[-4:], "checksum"),
    "truncated": (lambda b: b[: len(b) // 2], "its header says"),
    "garbage": (lambda b: b"garbage" * 10, "bad magic"),
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_entry_is_rejected_and_deleted(impl: Impl, how: str) -> None:
    impl.open().put("k", entry(7, 500), durable=True)
    damage, problem = DAMAGE[how]
    impl.damage("k", damage)
    store = impl.open()
    with pytest.raises(SnapshotError, match="KV snapshot 'k' rejected and deleted") as info:
        get(store, "k")
    assert problem in str(info.value)
    assert not impl.held("k") and "k" not in store
    assert store.stats().rejected == 1 and store.stats().disk_files == 0
    assert get(store, "k") is None


@pytest.mark.parametrize("other", [{"model": "sha256:other"}, {"ctx": {"n_ctx": 4096}}])
def test_a_stored_entry_for_another_model_or_context_is_rejected(
    impl: Impl, other: dict[str, object]
) -> None:
    impl.open().put("k", entry(7, 500), durable=True)
    store = impl.open()
    want: dict[str, Any] = {"model": MODEL, "ctx": dict(CTX), **other}
    with pytest.raises(SnapshotError, match="'k' rejected and deleted") as info:
        store.get("k", **want)
    assert next(iter(other)) in str(info.value)  # it says what does not match
    assert not impl.held("k") and store.stats().rejected == 1
    assert get(impl.open(), "k") is None  # deleted for everyone


@pytest.mark.parametrize("other", [{"model": "sha256:other"}, {"ctx": {"n_ctx": 4096}}])
@xfail_on(
    "redis",
    "by design: an entry rejected for another model or context is dropped from this "
    "process's RAM only; the shared copy stays for the workers that run that model (a fleet "
    "in a rolling upgrade), and each reader checks model and context itself",
    KINDS,
)
def test_a_ram_entry_is_checked_for_model_and_context(impl: Impl, other: dict[str, object]) -> None:
    store = impl.open()
    store.put("k", entry(1), durable=True)
    want: dict[str, Any] = {"model": MODEL, "ctx": dict(CTX), **other}
    with pytest.raises(SnapshotError, match="'k' rejected"):
        store.get("k", **want)
    assert "k" not in store and not impl.held("k")


def test_a_ram_hit_skips_the_payload_checksum(impl: Impl, monkeypatch: pytest.MonkeyPatch) -> None:
    store = impl.open()
    store.put("k", entry(1), durable=True)

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("a RAM hit must not decode")

    for module in (snapshots, redis_snapshots):  # where each store's reads decode
        monkeypatch.setattr(module, "decode_entry", no_decoding)
    assert get(store, "k") == (entry(1), "ram")
    store.release_ram()
    with pytest.raises(AssertionError, match="must not decode"):  # a far read does decode
        get(store, "k")


# -- the record and the settings -----------------------------------------------------------------
def test_stats_are_a_frozen_record(impl: Impl) -> None:
    stats = impl.open().stats()
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


def test_budgets_are_byte_counts(impl: Impl) -> None:
    with pytest.raises(ValueError, match="budgets"):
        impl.open(ram_budget_bytes=-1)
    with pytest.raises(ValueError, match="budgets"):
        impl.open(budget_bytes=-1)
