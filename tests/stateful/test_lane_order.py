"""Which waiting turn gets a lane first (pure logic): the lane order's rank, the starvation
bound, and that some waiter that can take a lane always goes (no one waits for a waiter that
cannot)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.errors import InvalidRequest
from continuum.stateful.lane_order import STARVE_S, LaneOrder, Waiter, rank, yields_to_another

NOW = 1000.0


def _goes(waiters: list[Waiter], order: LaneOrder, takes: set[int]) -> list[int]:
    """The waiters (by index) that take a lane now: those that can and do not give way."""

    def can_take(w: Waiter) -> bool:
        return next(i for i, x in enumerate(waiters) if x is w) in takes

    return [
        i
        for i, w in enumerate(waiters)
        if i in takes and not yields_to_another(w, waiters, order, NOW, can_take)
    ]


def test_arrival_serves_the_longest_waiting_turn() -> None:
    waiters = [Waiter(NOW - 1, 0.0, 10), Waiter(NOW - 5, 900.0, 5000)]
    assert _goes(waiters, LaneOrder.ARRIVAL, {0, 1}) == [1]


def test_age_serves_the_program_that_started_first() -> None:
    young_waiting_long = Waiter(NOW - 30, 900.0, 100)
    old_just_back = Waiter(NOW - 0.1, 10.0, 8000)
    waiters = [young_waiting_long, old_just_back]
    assert _goes(waiters, LaneOrder.AGE, {0, 1}) == [1]
    assert _goes(waiters, LaneOrder.LAS, {0, 1}) == [0]  # fewer tokens so far


def test_a_turn_waiting_past_the_starvation_bound_goes_before_the_order() -> None:
    starved = Waiter(NOW - STARVE_S, 990.0, 9000)
    waiters = [Waiter(NOW - 1, 1.0, 1), starved]
    assert _goes(waiters, LaneOrder.AGE, {0, 1}) == [1]
    assert _goes(waiters, LaneOrder.LAS, {0, 1}) == [1]


def test_no_one_gives_way_to_a_waiter_that_cannot_take_a_lane_or_has_its_own() -> None:
    old = Waiter(NOW - 1, 1.0, 10)
    young = Waiter(NOW - 1, 50.0, 10)
    assert _goes([old, young], LaneOrder.AGE, {1}) == [1]  # the old one's lane is not free
    own = Waiter(NOW - 1, 1.0, 10, needs_lane=False)  # waits for its own lane only
    assert _goes([own, young], LaneOrder.AGE, {0, 1}) == [0, 1]


def test_a_bad_lane_order_is_a_typed_error_naming_the_setting() -> None:
    with pytest.raises(InvalidRequest, match=r"^lane_order must be one of 'arrival', 'age'"):
        LaneOrder.parse("oldest")
    assert LaneOrder.parse("las") is LaneOrder.LAS
    assert LaneOrder.parse(LaneOrder.AGE) is LaneOrder.AGE


_waiter = st.builds(
    Waiter,
    since=st.floats(NOW - 2 * STARVE_S, NOW),
    started=st.floats(0, NOW),
    service=st.integers(0, 10_000),
    needs_lane=st.booleans(),
)


@given(
    st.lists(_waiter, min_size=1, max_size=8),
    st.sampled_from(list(LaneOrder)),
    st.sets(st.integers(0, 7)),
)
def test_some_waiter_that_can_take_a_lane_always_goes(
    waiters: list[Waiter], order: LaneOrder, takes: set[int]
) -> None:
    takes = {i for i in takes if i < len(waiters)}
    goes = _goes(waiters, order, takes)
    if takes:
        assert goes  # never all waiting for one another
    # of those needing a new lane, only the first-ranked go (several only when tied)
    ranks = {rank(waiters[i], order, NOW) for i in goes if waiters[i].needs_lane}
    best = min((rank(waiters[i], order, NOW) for i in takes if waiters[i].needs_lane), default=None)
    assert ranks <= {best}
    for i in goes:
        assert i in takes
