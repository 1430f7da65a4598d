"""Which waiting turn a freed lane goes to (``WorkerConfig.lane_order``), on the real model
(Gemma 3 270M): the longest waiting, the session that started first, or the one holding the
fewest tokens; a bad order is a typed error naming the setting."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from continuum import InvalidRequest, ModelFile, Worker, WorkerConfig
from continuum.stateful.session import ChatSession
from tests.conftest import WorkerFactory

SYSTEMS = (
    "You are a helpful assistant who answers about geography and about the history of maps.",
    "You are terse.",
    "You are a storyteller.",
)


def _wait(w: Worker, n: int) -> None:
    deadline = time.monotonic() + 30
    while w.waiting_for_lanes < n:
        assert time.monotonic() < deadline, "the turn never began to wait for a lane"
        time.sleep(0.01)


@pytest.mark.parametrize("order", ["arrival", "age", "las"])
def test_a_freed_lane_goes_to_the_turn_the_lane_order_puts_first(
    gemma: ModelFile, make_worker: WorkerFactory, order: str
) -> None:
    """One lane, held by a turn; the younger session starts to wait first, then the older
    one. The lane goes to the younger with ``arrival`` (it waited longer), to the older with
    ``age`` (its program started first), to the one holding fewer tokens with ``las``."""
    w = make_worker(gemma, parallel=1, lane_order=order)
    old = w.create_session(SYSTEMS[0])  # the longer system prompt: more tokens held
    young = w.create_session(SYSTEMS[1])
    holder = w.create_session(SYSTEMS[2])  # in the lane now; the others are parked
    assert old.lane is None and young.lane is None and len(old.resident) > len(young.resident)
    got: list[str] = []

    def turn(s: ChatSession, name: str) -> None:
        with w.guard:
            lane = w.enter(s)
            assert lane.seq.started == s.started  # its steps know its program's age
            got.append(name)
            w.leave(lane)

    with w.guard:
        held = w.enter(holder)  # as a turn holds its lane
    threads: list[threading.Thread] = []
    for n, (s, name) in enumerate(((young, "young"), (old, "old")), start=1):
        threads.append(threading.Thread(target=turn, args=(s, name), daemon=True))
        threads[-1].start()
        _wait(w, n)
    with w.guard:
        w.leave(held)
        assert w.park_idle()  # the holder's session gives its lane up at once
    for t in threads:
        t.join(60)
    first = {"arrival": "young", "age": "old", "las": "young"}[order]
    assert got == [first, ({"young", "old"} - {first}).pop()]
    assert w.waiting_for_lanes == 0


@pytest.mark.parametrize("bad", ["oldest", "", 3, None])
def test_a_bad_lane_order_is_a_typed_error_naming_it(bad: Any) -> None:
    with pytest.raises(InvalidRequest, match=r"^lane_order must be one of 'arrival', 'age', 'las'"):
        WorkerConfig(lane_order=bad)
