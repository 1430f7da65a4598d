"""Prefetch on return (issue 38): a parked session whose next request is arriving gets its KV
back before the turn asks — into a free lane, or its snapshot from disk into RAM — and then
answers as a session never parked does; a corrupt snapshot found by a prefetch is rebuilt from
the history at the turn, visibly. On the real model (Gemma 3 270M)."""

from __future__ import annotations

from pathlib import Path

from continuum import GenerationParams, ModelFile
from continuum.metrics import ResetReason
from continuum.stateful.residency import snapshot_key
from tests.conftest import WorkerFactory, corrupt_files

PARAMS = GenerationParams(max_tokens=12)
SYSTEM = "You are a terse assistant. Answer in one short sentence."


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_parked_session_comes_back_into_a_free_lane_before_its_turn(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, parallel=2)
    systems = {"a": SYSTEM, "b": f"{SYSTEM} Be kind.", "c": f"{SYSTEM} Be brief."}
    a, b = w.create_session(systems["a"]), w.create_session(systems["b"])
    asked = {"a": a.append([user("My name is Priya.")], PARAMS).text, "b": ""}
    c = w.create_session(systems["c"])  # parks a or b, as the pricing chooses
    name, parked = next((n, s) for n, s in (("a", a), ("b", b)) if s.lane is None)
    kept = b if parked is a else a
    assert parked.resident
    assert w.prefetch(parked.id, parked.tenant) == ""  # every lane busy: no guess parks one
    c.close()  # a lane is free now
    assert w.prefetch(parked.id, "another tenant") == ""
    assert w.prefetch(parked.id, parked.tenant) == "lane" and parked.lane is not None
    assert w.prefetch(parked.id, parked.tenant) == ""  # resident already
    r = parked.append([user("What is my name?")], PARAMS)
    assert r.metrics.resets == () and r.metrics.prompt_tokens_evaluated < 40
    ref = make_worker(gemma, parallel=2).create_session(systems[name])
    if asked[name]:
        assert ref.append([user("My name is Priya.")], PARAMS).text == asked[name]
    assert ref.append([user("What is my name?")], PARAMS).text == r.text
    assert kept.lane is not None  # nobody was parked for the guess


def test_a_snapshot_on_disk_is_read_into_ram_while_every_lane_is_busy(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma)  # one lane
    a = w.create_session(SYSTEM)
    a.append([user("My name is Priya.")], PARAMS)
    b = w.create_session(SYSTEM)  # parks a, into RAM
    store = w.snapshots
    size = store.stats().ram_bytes
    store.ram_budget_bytes = size * 3 // 2  # type: ignore[attr-defined]  # a, not a and b
    b.append([user("Hello.")], PARAMS)
    w.create_session(SYSTEM)  # parks b: a, the least recently used, goes to disk
    key = snapshot_key(a.id)
    assert store.peek(key) is None and key in store  # type: ignore[attr-defined]
    assert w.prefetch(a.id, a.tenant) == "ram"
    assert store.peek(key) is not None  # type: ignore[attr-defined]
    disk = w.disk_restores
    r = a.append([user("What is my name?")], PARAMS)
    assert r.metrics.resets == () and r.metrics.tokens_reused > 0
    assert w.disk_restores == disk  # the turn found it in RAM
    assert b.resident  # b stays parked


def test_a_corrupt_snapshot_found_by_a_prefetch_is_rebuilt_visibly_at_the_turn(
    gemma: ModelFile, make_worker: WorkerFactory, tmp_path: Path
) -> None:
    w = make_worker(gemma, park_budget_bytes=1)
    a, b = w.create_session(SYSTEM), w.create_session(SYSTEM)
    a.append([user("My name is Priya.")], PARAMS)
    b.append([user("Hello.")], PARAMS)  # parks a, to disk
    assert corrupt_files(tmp_path / "snapshots")
    assert w.prefetch(a.id, a.tenant) == ""  # rejected: the turn rebuilds from the log
    r = a.append([user("What is my name?")], PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason == ResetReason.RESTORE_FAILED and reset.tokens_rebuilt > 0
    assert r.metrics.tokens_reused == 0 and r.text
