"""The KV space: the context's lanes, the cells they hold, and the one place that decides what
gives way when a sequence needs a lane or room.

A *lane* is one resident sequence of the context: a session is active in it, or a stateless
op is lent it, or it holds an op's leftovers (the tenant's last prompt and reply), or nothing.
Every choice of what to park or evict is made here, as a value:

- :meth:`KVSpace.allocate` answers a request for a lane — a session's turn, or a stateless op
  of a tenant with its prompt — with an :class:`Allocation` (the lane, the session that must be
  parked out of it, the leftovers it drops) or ``None`` while every lane is held (the caller
  waits: a miss is a value, never an exception).
- :meth:`KVSpace.room` answers a request for cells in a context whose sequences share them
  (one lane beside the ops' working sequence and pinned prefixes, ``--parallel 1``) with a
  :class:`Room`: how many pinned prefixes leave (least recently used first), whether the ops'
  working state goes, which sessions are parked, and whether that is enough.

Nothing here touches the context: :class:`~continuum.stateful.residency.Residency` and the
engine apply what was decided, under the guard. The rules, one for every caller:

- a lane some turn, op or idle work holds is never chosen;
- a free lane (no session) before a session's; for an op, the free lane whose leftovers of the
  same tenant share most with its prompt, then the least recently used; for a session, a free
  lane without leftovers first (another op may still start from them);
- a session to park: one with no work pending (no message arriving, no glue to decode) first,
  then the one whose return costs least per second of lane it frees
  (:mod:`continuum.stateful.park_price`: its reload cost over its expected time until it
  returns; the least recently used without a pricing); a session expected back before it
  could be reloaded stays, unless the request has waited ``PATIENCE_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from continuum.backends.base import SequenceView
from continuum.stateful.park_price import PATIENCE_S, PauseClock, Price
from continuum.stateful.plan import common_prefix

if TYPE_CHECKING:
    from continuum.metrics import Reset
    from continuum.stateful.arrival import Arriving
    from continuum.stateful.transcript import Transcript

IDLE = "idle"  # a lane's holder while idle work (eager glue, a speculative finish) runs on it


@dataclass(frozen=True, eq=False)
class OpHold:
    """A lane's holder while a stateless op runs in it (:mod:`continuum.stateful.op_lanes`):
    the op's thread. Ops run at once, each in its lane; what a lane held before its op (the
    tenant's leftovers) is that op's to start from, and no other op's until it is done."""

    thread: int = field(default_factory=threading.get_ident)

    @property
    def mine(self) -> bool:
        """This thread's op holds the lane."""
        return self.thread == threading.get_ident()


def held_by_another_op(lane: Lane) -> bool:
    return isinstance(lane.holder, OpHold) and not lane.holder.mine


class ResidentSession(Protocol):
    """A session as the KV space and residency see it
    (:class:`~continuum.stateful.session.ChatSession`): what making it active, parking and
    restoring it read and write."""

    lane: Lane | None
    resident: list[int]  # the parked snapshot's tokens while it is not in a lane
    resident_exact: int  # how many of those are exact (continuum.backends.exactness)
    restored_from: str  # "ram" | "disk": its last activation came back from a snapshot
    pauses: PauseClock  # when its last turn ended, and how long its pauses last

    @property
    def id(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def transcript(self) -> Transcript: ...

    @property
    def pending_resets(self) -> list[Reset]: ...

    @property
    def arrival(self) -> Arriving | None: ...

    @property
    def pending_glue(self) -> bool: ...

    def bind(self, seq: SequenceView) -> None: ...


@dataclass(eq=False)
class Lane:
    """One resident sequence of the context and the session active in it.

    Invariant: ``session.lane is self`` exactly when ``self.session is session``; while
    ``holder`` is set (a turn, a feed, an op or idle work runs on it) the lane is never chosen
    to give way."""

    seq: SequenceView
    session: ResidentSession | None = None
    holder: object | None = None
    used: float = 0.0  # time.monotonic() of its last use
    # a stateless op's leftovers (no session): the tenant whose prompt and reply the lane
    # still holds, and how many of those tokens later ops may start from (the prompt and the
    # reply; an exact engine's: the exact ones, continuum.backends.exactness)
    left_by: str | None = None
    exact: int = 0

    @property
    def tenant(self) -> str | None:
        """Whose tokens the lane holds: its session's tenant, or an op's (None: nobody's)."""
        return self.session.tenant if self.session is not None else self.left_by

    @property
    def cells(self) -> int:
        return len(self.seq.tokens)


@dataclass(frozen=True)
class LaneRequest:
    """A lane wanted for ``session``'s turn, or (no session) for a stateless op of
    ``tenant`` whose prompt is ``tokens``; ``waited_s``: how long it has waited for one (past
    ``PATIENCE_S``, protected sessions are parked for it too)."""

    tenant: str
    tokens: Sequence[int] = ()
    session: ResidentSession | None = None
    waited_s: float = 0.0


@dataclass(frozen=True)
class Allocation:
    """A lane granted: ``parks`` (the session active in it) is parked first; ``drops`` (the
    tenant whose op leftovers it holds) are dropped, unless they are the requester's own."""

    lane: Lane
    parks: ResidentSession | None
    drops: str | None

    @property
    def moves(self) -> bool:
        """Something leaves the lane before it is used."""
        return self.parks is not None or self.drops is not None


@dataclass(frozen=True)
class Cells:
    """Who holds the cells of a context whose sequences share them (``n_ctx`` in all):
    ``pinned``, each pinned prefix's cells, least recently used first; ``working``, the ops'
    working sequence's; ``fixed``, cells that never give way here. The lanes' cells are the
    KV space's own."""

    n_ctx: int
    pinned: Sequence[int] = ()
    working: int = 0
    fixed: int = 0


@dataclass(frozen=True)
class Room:
    """What gives way so a sequence gets the cells it needs: the ``unpin`` least recently used
    pinned prefixes (spilled to layer KV), the ops' working state (``drop_working``), then the
    sessions in ``parks`` (in that order). ``fits`` is False when even all of that leaves too
    few cells: the caller makes what room there is, and the decode then says it is full."""

    unpin: int
    drop_working: bool
    parks: tuple[Lane, ...]
    fits: bool


class KVSpace:
    """The lanes of one context, and every decision about what leaves them (pure: see the
    module docstring). Called under the worker's guard."""

    def __init__(
        self, lanes: Sequence[SequenceView], price: Callable[[Lane], Price] | None = None
    ) -> None:
        """``price``: what parking a lane's session costs (:mod:`continuum.stateful.park_price`);
        None: the least recently used session goes first."""
        self.lanes = [Lane(seq) for seq in lanes]
        self.price = price

    def allocate(self, want: LaneRequest) -> Allocation | None:
        """The lane for ``want``, and what leaves it first; None while every lane is held."""
        s = want.session
        if s is not None and s.lane is not None:
            return Allocation(s.lane, None, None)
        free = [lane for lane in self.lanes if lane.session is None and lane.holder is None]
        if s is not None and free:  # spare ops' leftovers: another op may start from them
            lane = min(free, key=lambda lane: lane.left_by is not None)
        elif free:
            tokens = list(want.tokens)

            def shared(lane: Lane) -> int:
                mine = lane.left_by == want.tenant
                return common_prefix(lane.seq.tokens, tokens) if mine else 0

            lane = max(free, key=lambda lane: (shared(lane), -lane.used))
        else:
            parked = self.to_park(protect=want.waited_s < PATIENCE_S)
            if parked is None:
                return None
            lane = parked
        mine = s is None and lane.left_by == want.tenant
        return Allocation(lane, lane.session, None if mine else lane.left_by)

    def to_park(
        self, exclude: Lane | None = None, *, sessions_only: bool = False, protect: bool = False
    ) -> Lane | None:
        """The lane whose session gives way next (not ``exclude``'s, never a held one), in
        :meth:`park_order`; with ``sessions_only``, only lanes with a session (a lane holding
        nothing frees nothing); with ``protect``, never a session whose price says it is
        expected back before it could be reloaded."""
        idle = [
            lane
            for lane in self.lanes
            if lane.holder is None
            and lane is not exclude
            and (lane.session is not None or not sessions_only)
        ]
        prices = {id(lane): self._price(lane) for lane in idle}
        if protect:
            idle = [lane for lane in idle if not prices[id(lane)].protected]
        if not idle:
            return None
        return min(idle, key=lambda lane: self._order(lane, prices[id(lane)]))

    def _price(self, lane: Lane) -> Price:
        if self.price is None or lane.session is None:
            return Price(0.0, None if lane.session is not None else float("inf"))
        return self.price(lane)

    def _order(self, lane: Lane, price: Price) -> tuple[bool, float, float]:
        """The parking order: no work pending first, then the lowest reload cost per second
        of lane freed (every price equal without a pricing: the least recently used)."""
        per_second = price.per_second if self.price is not None else 0.0
        return (pending_work(lane.session), per_second, lane.used)

    def held_cells(self, exclude: Lane | None = None) -> int:
        """Cells the lanes' sequences hold (but ``exclude``'s)."""
        return sum(lane.cells for lane in self.lanes if lane is not exclude)

    def room(
        self, need: int, cells: Cells, *, exclude: Lane | None = None, drop_working: bool = False
    ) -> Room:
        """What gives way so that ``need`` more cells fit beside everything resident in a
        context whose sequences share ``cells.n_ctx`` cells (``exclude``'s lane is the one
        growing, its own cells counted in ``need``): pinned prefixes first, least recently used
        first; then, if ``drop_working``, the ops' working state; then idle sessions, in
        :meth:`to_park` order."""
        used = cells.fixed + cells.working + sum(cells.pinned) + self.held_cells(exclude)
        over = used + need - cells.n_ctx
        unpin = 0
        while over > 0 and unpin < len(cells.pinned):
            over -= cells.pinned[unpin]
            unpin += 1
        dropped = drop_working and over > 0 and cells.working > 0
        if dropped:
            over -= cells.working
        parks: list[Lane] = []
        order = sorted(
            (lane for lane in self.lanes if lane.session is not None and lane.holder is None),
            key=lambda lane: self._order(lane, self._price(lane)),
        )
        for lane in order:
            if over <= 0:
                break
            if lane is not exclude:
                parks.append(lane)
                over -= lane.cells
        return Room(unpin, dropped, tuple(parks), over <= 0)


def pending_work(session: ResidentSession | None) -> bool:
    """A message is arriving into the session, or its eager glue is not decoded yet."""
    return session is not None and (session.arrival is not None or session.pending_glue)


__all__ = [
    "IDLE",
    "Allocation",
    "Cells",
    "KVSpace",
    "Lane",
    "LaneRequest",
    "OpHold",
    "ResidentSession",
    "Room",
    "held_by_another_op",
    "pending_work",
]
