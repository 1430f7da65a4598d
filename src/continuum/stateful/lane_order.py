"""Which waiting turn gets a lane first, when more sessions want one than there are lanes.

With more agents than lanes, turns wait for a lane while the others' turns run, and which one
goes next is a program-level choice (issue 38, point 4):

- ``arrival``: the turn that has waited longest (first come, first served, request by
  request). On a saturated server every agent's next call queues behind everyone's, so agents
  advance together and finish together (processor sharing across programs).
- ``age``: the program that started first — the session created (or reopened) earliest —
  goes first, so programs run to their end one after another, as a program-level
  first-come-first-served does; the median job completion time falls, the last one's does
  not move (the same work is done, in another order).
- ``las``: the least attained service first (Autellix): the session holding the fewest tokens
  so far, so short programs are not held behind long ones.

Any turn that has waited ``STARVE_S`` goes before the order (longest waiting first): a young
program is not held back without end by older ones (or a long one by short ones).

Pure: the worker keeps its waiters and asks :func:`yields_to_another` under its guard.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from continuum.errors import InvalidRequest

STARVE_S = 120.0  # a turn that waited this long for a lane goes before any order


class LaneOrder(enum.Enum):
    ARRIVAL = "arrival"
    AGE = "age"
    LAS = "las"

    @classmethod
    def parse(cls, value: object) -> LaneOrder:
        if isinstance(value, LaneOrder):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(repr(o.value) for o in cls)
            raise InvalidRequest(f"lane_order must be one of {names}, got {value!r}") from None


@dataclass(frozen=True, eq=False)
class Waiter:
    """A turn waiting for a lane: when it began to wait, when its program began (``started``)
    and the tokens its session held so far (``service``), all on one clock."""

    since: float
    started: float
    service: int
    needs_lane: bool = True  # False: its session has a lane of its own and waits only for it


def rank(w: Waiter, order: LaneOrder, now: float) -> tuple[int, float, float]:
    """The sort key: lower goes first."""
    if now - w.since >= STARVE_S:
        return (0, w.since, 0.0)
    if order is LaneOrder.AGE:
        return (1, w.started, w.since)
    if order is LaneOrder.LAS:
        return (1, float(w.service), w.since)
    return (1, w.since, 0.0)


def yields_to_another(
    me: Waiter,
    waiters: Iterable[Waiter],
    order: LaneOrder,
    now: float,
    can_take: Callable[[Waiter], bool],
) -> bool:
    """``me`` found a lane it could take: it gives way when another waiter that also needs a
    new lane ranks before it and could take one now (``can_take``; so no one waits for a
    waiter that cannot go)."""
    if not me.needs_lane:
        return False
    mine = rank(me, order, now)
    return any(
        w is not me and w.needs_lane and rank(w, order, now) < mine and can_take(w) for w in waiters
    )
