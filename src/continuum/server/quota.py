"""Per-tenant limits on sessions: how many a tenant may store, and how many it holds open.

A tenant that stores ``max_stored`` sessions is refused a new one (``SessionQuotaExceeded``,
``429``) until it deletes some. Open sessions (resident or parked KV, on this worker) are
bounded per tenant too, but by closing rather than refusing: opening one more closes that
tenant's least recently used open session, and a session nobody used for ``idle_close_s`` is
closed at the next sweep. Closing keeps the history: the next request on it reopens it from
the log (reported as a reset, ``evicted``). One tenant's load therefore never closes another
tenant's sessions except by the idle rule.

Every method is called within the worker's claim (:meth:`Worker.claim`, from
:mod:`continuum.server.deps`), which serialises them across the job threads. Closing a session
may wait for its running turn, giving the claim up meanwhile, so loops here re-read the tables
after each close.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from continuum.errors import SessionQuotaExceeded
from continuum.settings import Settings, setting
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_stored: int = 10_000  # sessions a tenant may keep in the history store
    max_open: int = 32  # sessions a tenant holds open at once (resident or parked KV)
    idle_close_s: float = 3600.0  # open sessions unused this long are closed (history kept)


_DEFAULTS = SessionLimits()


class SessionSettings(Settings):
    """A tenant's session quotas (see the module docstring)."""

    max_sessions: int = setting(
        _DEFAULTS.max_stored,
        "Sessions one tenant may store; past it, creating one is refused (429).",
        ge=1,
    )
    max_open_sessions: int = setting(
        _DEFAULTS.max_open,
        "Sessions one tenant holds open; opening one more closes its least recently used "
        "(history kept: reopened from the log on its next request).",
        ge=1,
    )
    idle_close: float = setting(
        _DEFAULTS.idle_close_s,
        "Seconds after which an unused open session is closed (history kept).",
        gt=0,
    )

    def limits(self) -> SessionLimits:
        return SessionLimits(self.max_sessions, self.max_open_sessions, self.idle_close)


class SessionQuota:
    def __init__(self, limits: SessionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._open: dict[str, OrderedDict[str, tuple[ChatSession, float]]] = {}
        self.closed = 0  # sessions this quota closed (idle or LRU)

    def admit(self, worker: Worker, ns: str) -> None:
        """Before creating a session in ``ns``: refuse past the stored limit, and make room
        among the tenant's open sessions."""
        stored = worker.store.count_sessions(ns)
        if stored >= self.limits.max_stored:
            raise SessionQuotaExceeded(ns, self.limits.max_stored)
        self._make_room(ns, self.limits.max_open - 1)

    def use(self, ns: str, session: ChatSession) -> ChatSession:
        """``session`` was just opened or used in ``ns``: it is now the most recent; the
        tenant's least recent ones past the open limit are closed, and every tenant's idle
        ones."""
        held = self._open.setdefault(ns, OrderedDict())
        held.pop(session.id, None)  # in use now: the sweep must not close it
        self.sweep()
        held[session.id] = (session, self._clock())
        self._make_room(ns, self.limits.max_open, keep=session.id)
        return session

    def sweep(self) -> int:
        """Close every open session idle past ``idle_close_s``; return how many."""
        cutoff, n = self._clock() - self.limits.idle_close_s, 0
        for held in list(self._open.values()):
            while held and next(iter(held.values()))[1] < cutoff:
                n += self._close(held.popitem(last=False)[1][0])
        return n

    def _make_room(self, ns: str, room: int, keep: str = "") -> None:
        held = self._open.get(ns)
        while held and len(held) > max(room, 0):
            sid, (session, _) = next(iter(held.items()))
            if sid == keep:
                break
            del held[sid]
            self._close(session)

    def _close(self, session: ChatSession) -> int:
        if session.closed:  # deleted, or closed by its worker already
            return 0
        session.close()
        self.closed += 1
        return 1
