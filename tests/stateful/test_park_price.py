"""What parking a session costs (pure logic): when it is expected back, what its reload costs,
and which session the KV space parks with a pricing — scripted traces and properties."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.errors import InvalidRequest
from continuum.stateful.kv_space import KVSpace, Lane, LaneRequest
from continuum.stateful.park_price import (
    PATIENCE_S,
    PRIOR_PAUSE_S,
    PauseClock,
    Price,
    ReloadCosts,
    check_pause_hint,
)


def test_a_pause_is_expected_from_the_hint_then_the_sessions_own_history_then_the_prior() -> None:
    c = PauseClock()
    assert c.remaining_s(10.0) is None  # not paused: in a turn, or never ran
    c.end_turn(10.0)
    assert c.remaining_s(10.5) == pytest.approx(PRIOR_PAUSE_S - 0.5)
    for gap in (4.0, 6.0, 5.0):  # three pauses of this session
        c.start_turn(c.ended + gap)  # type: ignore[operator]
        c.end_turn(100.0)
    assert c.expected_s() == 5.0 and c.remaining_s(101.0) == pytest.approx(4.0)
    c.hint(30.0)  # the client's word wins for this pause
    assert c.remaining_s(101.0) == pytest.approx(29.0)
    c.start_turn(102.0)
    assert c.hint_s is None and c.remaining_s(103.0) is None
    assert list(c.pauses)[-1] == pytest.approx(2.0)


def test_the_wait_after_a_session_opens_is_no_pause_of_its_tools() -> None:
    c = PauseClock()
    c.open(0.0)  # created (its first request is usually at once, in the same call)
    assert c.remaining_s(0.5) == pytest.approx(PRIOR_PAUSE_S - 0.5)  # idle: parkable
    c.start_turn(0.01)
    assert not c.pauses
    c.end_turn(1.0)
    c.start_turn(3.0)
    assert list(c.pauses) == [2.0]


def test_past_its_expected_return_a_pause_is_expected_to_last_as_long_again() -> None:
    c = PauseClock()
    c.end_turn(0.0)
    c.hint(2.0)
    assert c.remaining_s(1.5) == pytest.approx(0.5)
    assert c.remaining_s(8.0) == pytest.approx(8.0)  # a long tool run: likely longer still


def test_a_reload_costs_ram_disk_or_a_prefill_as_measured() -> None:
    costs = ReloadCosts(prefill_ms_per_token=lambda: 4.0)
    assert costs.reload_ms(1000, "ram") == 0.0  # nothing measured yet: all alike
    assert costs.reload_ms(1000, "none") == 4000.0
    costs.parked(1000, 12_000_000, 10.0)  # 12 MB put in 10 ms
    assert costs.bytes_per_token == 12_000.0
    ram = costs.reload_ms(1000, "ram")
    disk = costs.reload_ms(1000, "disk")
    assert 0 < ram < disk < costs.reload_ms(1000, "none")
    costs.restored(12_000_000, 600.0, "disk")  # a slow disk: its cost goes up
    assert costs.reload_ms(1000, "disk") > disk
    assert ReloadCosts().reload_ms(10, "none") > 0  # a prior before any prefill was timed


def test_a_price_is_reload_cost_per_second_freed_and_protects_a_session_due_back_first() -> None:
    assert Price(100.0, 10.0).per_second == pytest.approx(10.0)
    assert Price(100.0, None).per_second == float("inf")  # not paused: expected at once
    assert Price(0.0, 0.0).per_second == 0.0
    assert Price(500.0, 0.2).protected and not Price(500.0, 2.0).protected
    assert not Price(500.0, None).protected


@pytest.mark.parametrize("bad", [-1, "-0.5", "soon", "", "nan", "inf", 1e9, True, None])
def test_a_bad_pause_hint_is_a_typed_error_naming_it(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="X-Continuum-Pause"):
        check_pause_hint(bad)
    assert check_pause_hint("2.5") == 2.5 and check_pause_hint(0) == 0.0


class Seq:
    def __init__(self) -> None:
        self.tokens: list[int] = []


@dataclass(eq=False)
class Sess:
    id: str
    tenant: str = "t"
    lane: Lane | None = None
    arrival: object | None = None
    pending_glue: bool = False
    pauses: PauseClock = field(default_factory=PauseClock)


def _space(prices: dict[str, Price]) -> tuple[KVSpace, list[Sess]]:
    kv = KVSpace([Seq() for _ in prices], lambda lane: prices[lane.session.id])  # type: ignore
    sessions = [Sess(name) for name in prices]
    for i, (lane, s) in enumerate(zip(kv.lanes, sessions, strict=True)):
        lane.session, s.lane, lane.used = s, lane, float(i)  # type: ignore[assignment]
    return kv, sessions


def test_the_session_parked_is_the_cheapest_per_second_not_the_least_recently_used() -> None:
    # "due" was used longest ago (LRU would park it) but is back in 0.5 s; "away" for 60 s
    kv, _ = _space({"due": Price(40.0, 0.5), "away": Price(40.0, 60.0), "big": Price(900.0, 60.0)})
    got = kv.allocate(LaneRequest("t", session=Sess("new")))  # type: ignore[arg-type]
    assert got is not None and got.parks is not None and got.parks.id == "away"


def test_a_protected_session_stays_until_the_request_has_waited_its_patience() -> None:
    kv, _ = _space({"soon": Price(3000.0, 1.0), "sooner": Price(3000.0, 0.5)})
    new = Sess("new")
    assert kv.allocate(LaneRequest("t", session=new)) is None  # type: ignore[arg-type]
    late = LaneRequest("t", session=new, waited_s=PATIENCE_S)  # type: ignore[arg-type]
    got = kv.allocate(late)
    assert got is not None and got.parks is not None and got.parks.id == "soon"


@given(
    st.lists(
        st.tuples(st.floats(0, 5000), st.none() | st.floats(0, 120), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.floats(0, 5),
)
def test_the_choice_is_the_cheapest_allowed_and_never_a_protected_one_while_patient(
    rows: list[tuple[float, float | None, bool]], waited: float
) -> None:
    prices = {f"s{i}": Price(ms, rem) for i, (ms, rem, _) in enumerate(rows)}
    kv, sessions = _space(prices)
    for s, (_, _, glue) in zip(sessions, rows, strict=True):
        s.pending_glue = glue
    got = kv.allocate(LaneRequest("t", session=Sess("new"), waited_s=waited))  # type: ignore
    patient = waited < PATIENCE_S
    allowed = [s for s in sessions if not (patient and prices[s.id].protected)]
    if not allowed:
        assert got is None
        return
    assert got is not None and got.parks in allowed
    key = {s.id: (s.pending_glue, prices[s.id].per_second) for s in allowed}
    assert key[got.parks.id] == min(key.values())  # type: ignore[union-attr]
