"""The KV space's choices, as pure logic: which lane a session or an op gets, which session is
parked, and what gives way for cells in a shared context. No model: lanes hold token lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from continuum.stateful.kv_space import IDLE, Cells, KVSpace, Lane, LaneRequest, OpHold


class Seq:
    """A lane's sequence: only its tokens matter here."""

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens = tokens or []


@dataclass(eq=False)
class Sess:
    id: str
    tenant: str = "t"
    lane: Lane | None = None
    arrival: object | None = None
    pending_glue: bool = False
    resident: list[int] = field(default_factory=list)


def space(n: int) -> KVSpace:
    return KVSpace([Seq() for _ in range(n)])  # type: ignore[misc]


def seat(lane: Lane, s: Sess, tokens: list[int], used: float) -> None:
    lane.session, s.lane = s, lane  # type: ignore[assignment]
    lane.seq.tokens[:] = tokens
    lane.used = used


def test_a_session_keeps_its_own_lane_and_takes_a_free_one_without_leftovers_first() -> None:
    kv = space(3)
    a, b = Sess("a"), Sess("b")
    seat(kv.lanes[0], a, [1, 2], 1.0)
    own = kv.allocate(LaneRequest("t", session=a))  # type: ignore[arg-type]
    assert own is not None and own.lane is kv.lanes[0] and not own.moves
    kv.lanes[1].left_by, kv.lanes[1].seq.tokens[:] = "t", [5, 6]
    got = kv.allocate(LaneRequest("t", session=b))  # type: ignore[arg-type]
    assert got is not None and got.lane is kv.lanes[2] and not got.moves


def test_an_op_takes_the_free_lane_holding_most_of_its_prompt_of_its_own_tenant() -> None:
    kv = space(3)
    kv.lanes[0].left_by, kv.lanes[0].seq.tokens[:] = "t", [1, 2, 3]
    kv.lanes[1].left_by, kv.lanes[1].seq.tokens[:] = "other", [1, 2, 3, 4, 5]
    kv.lanes[2].left_by, kv.lanes[2].seq.tokens[:] = "t", [1, 9]
    got = kv.allocate(LaneRequest("t", (1, 2, 3, 4)))
    assert got is not None and got.lane is kv.lanes[0]
    assert got.drops is None and got.parks is None  # its own leftovers stay: it starts there
    other = kv.allocate(LaneRequest("u", (1, 2, 3, 4)))
    assert other is not None and other.drops in ("t", "other")  # never reused across tenants


def test_the_session_parked_is_idle_before_busy_then_least_recently_used() -> None:
    kv = space(3)
    busy, old, new = Sess("busy", pending_glue=True), Sess("old"), Sess("new")
    seat(kv.lanes[0], busy, [1], 0.0)
    seat(kv.lanes[1], old, [2], 1.0)
    seat(kv.lanes[2], new, [3], 2.0)
    got = kv.allocate(LaneRequest("t", (7,)))
    assert got is not None and got.lane is kv.lanes[1] and got.parks is old
    kv.lanes[1].holder = OpHold()
    assert kv.to_park() is kv.lanes[2]
    kv.lanes[2].holder = IDLE
    assert kv.to_park() is kv.lanes[0]  # work pending, but the only one left
    kv.lanes[0].holder = "turn"
    assert kv.allocate(LaneRequest("t", (7,))) is None  # every lane held: the caller waits


def test_room_unpins_the_oldest_prefixes_then_drops_working_state_then_parks() -> None:
    kv = space(2)
    a, b = Sess("a"), Sess("b")
    seat(kv.lanes[0], a, [0] * 100, 1.0)
    seat(kv.lanes[1], b, [0] * 50, 2.0)
    cells = Cells(n_ctx=1000, pinned=[200, 300], working=150)
    # 800 used: 200 free
    assert kv.room(200, cells) == kv.room(0, cells)
    r = kv.room(350, cells)
    assert (r.unpin, r.drop_working, r.parks, r.fits) == (1, False, (), True)
    r = kv.room(800, cells, drop_working=True)
    assert (r.unpin, r.drop_working, r.parks, r.fits) == (2, True, (), True)
    r = kv.room(900, cells, drop_working=True)
    assert (r.unpin, r.drop_working, r.parks, r.fits) == (2, True, (kv.lanes[0],), True)
    # the lane that grows is never parked for itself; a miss is a value
    r = kv.room(1000, cells, exclude=kv.lanes[0], drop_working=True)
    assert r.parks == (kv.lanes[1],) and r.fits
    r = kv.room(2000, cells, exclude=kv.lanes[0])
    assert not r.fits and r.unpin == 2 and not r.drop_working


lane_states = st.lists(
    st.tuples(
        st.sampled_from(["free", "session", "leftovers"]),
        st.booleans(),  # held
        st.booleans(),  # work pending
        st.sampled_from(["t", "u"]),
        st.lists(st.integers(0, 3), max_size=6),
        st.floats(0, 10),
    ),
    min_size=1,
    max_size=5,
)


def build(states: list[Any]) -> KVSpace:
    kv = space(len(states))
    for i, (kind, held, pending, tenant, tokens, used) in enumerate(states):
        lane = kv.lanes[i]
        if kind == "session":
            seat(lane, Sess(f"s{i}", tenant, pending_glue=pending), tokens, used)
        elif kind == "leftovers":
            lane.left_by, lane.seq.tokens[:], lane.used = tenant, tokens, used
        lane.holder = "turn" if held else None
    return kv


@given(lane_states, st.sampled_from(["t", "u"]), st.lists(st.integers(0, 3), max_size=6))
def test_an_allocation_never_takes_a_held_lane_and_misses_only_when_all_are(
    states: list[Any], tenant: str, prompt: list[int]
) -> None:
    kv = build(states)
    for want in (LaneRequest(tenant, prompt), LaneRequest(tenant, session=Sess("new", tenant))):  # type: ignore[arg-type]
        got = kv.allocate(want)
        if got is None:
            assert all(lane.holder is not None for lane in kv.lanes)
            continue
        assert got.lane.holder is None
        assert got.parks is got.lane.session
        if any(lane.session is None and lane.holder is None for lane in kv.lanes):
            assert got.parks is None  # nobody is parked while a lane is free
        if got.drops is not None:  # leftovers kept only for their own tenant's op
            assert got.drops == got.lane.left_by
            assert want.session is not None or got.drops != tenant


@given(lane_states, st.integers(0, 40), st.lists(st.integers(0, 10), max_size=4), st.booleans())
def test_room_fits_exactly_when_its_evictions_leave_enough_cells(
    states: list[Any], need: int, pinned: list[int], drop: bool
) -> None:
    kv = build(states)
    cells = Cells(n_ctx=30, pinned=pinned, working=5)
    r = kv.room(need, cells, drop_working=drop)
    freed = sum(pinned[: r.unpin]) + (5 if r.drop_working else 0)
    freed += sum(lane.cells for lane in r.parks)
    used = 5 + sum(pinned) + kv.held_cells()
    assert r.fits == (used - freed + need <= 30)
    assert all(lane.holder is None and lane.session is not None for lane in r.parks)
    if r.parks:  # sessions go only once every pinned prefix has
        assert r.unpin == len(pinned)
