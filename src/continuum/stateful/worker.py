"""The long-lived worker: many stateful sessions on the resident sequences of one context.

The worker runs on a :class:`~continuum.backends.base.SequenceBackend` — its own, or (inside an
:class:`~continuum.engine.Engine`) sequences of the engine's context — and every use of the
context holds one :class:`~continuum.backends.context_guard.ContextGuard`. Several sessions can
be open; up to ``parallel`` are *active*, each in a lane (a resident sequence), the others are
parked as KV snapshots (:mod:`continuum.stateful.residency`).

With one lane (the library's default) a turn holds the guard from start to end, and turns run
one at a time. With ``parallel`` > 1 the lanes' decodes go through a
:class:`~continuum.backends.batching.BatchScheduler`: each turn's prefill and reply ride in
steps shared with every other active session (continuous batching), and a turn gives the guard
up while its decode waits — the only points where another thread's work interleaves with it. A
turn holds its lane throughout (``Lane.holder``), so no one parks a session under a running
turn; a session that needs a lane while all are held waits for one.

Idle work — eager glue, a speculative finish — runs on :class:`~continuum.stateful.idle.
IdleRunner`'s thread, never in a request's way. Turns of an engine's worker walk the engine's
result tiers first (:mod:`continuum.stateful.hooks`).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from continuum.backends.base import OpBackend, SequenceBackend
from continuum.backends.context_guard import ContextGuard
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.backends.registry import BackendRegistry
from continuum.errors import (
    InvalidRequest,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SnapshotError,
)
from continuum.metrics import ResetReason
from continuum.stateful.compaction import CompactionMode, check_mode
from continuum.stateful.config import SharedContext, open_lanes, own_backend
from continuum.stateful.config import WorkerConfig as WorkerConfig  # re-exported
from continuum.stateful.conversation import Conversation
from continuum.stateful.hooks import TurnLookup, TurnQuery, TurnTiers
from continuum.stateful.idle import IdleRunner
from continuum.stateful.kv_space import IDLE, Lane
from continuum.stateful.lane_order import LaneOrder, Waiter, yields_to_another
from continuum.stateful.park_price import PATIENCE_S
from continuum.stateful.residency import Borrowed, Residency
from continuum.stateful.session import ChatSession
from continuum.store.base import SessionId, SnapshotStore
from continuum.store.stores import SnapshotPlace, Stores, StoreTarget
from continuum.store.stores import default_store_path as default_store_path
from continuum.toolcalls import normalize_tools

log = logging.getLogger(__name__)


class _State(enum.Enum):
    OPEN = 1
    CLOSED = 2


class Worker:
    """Owns the model and context; creates and reopens :class:`ChatSession` objects."""

    def __init__(
        self,
        model: str | os.PathLike[str] | ModelFile | None = None,
        config: WorkerConfig | None = None,
        *,
        store: StoreTarget | Stores = None,
        progress: Progress | None = None,
        registry: BackendRegistry | None = None,
        context: SharedContext | None = None,
    ) -> None:
        """A worker on its own model and context, or — with ``context=`` — on a sequence of a
        context someone else owns (the engine: see :class:`SharedContext`). With
        ``config.parallel`` > 1 its lanes are the streams of that context, when it was made in
        lanes (see :func:`open_lanes`)."""
        self.config = config or WorkerConfig()
        if context is not None:
            self.model = context.backend.model
        else:
            self.model = model if isinstance(model, ModelFile) else resolve_model(model, progress)
        self._owns_store = not isinstance(store, Stores)
        self.stores = store if isinstance(store, Stores) else self._open_stores(store, context)
        try:
            self.store = self.stores.history
        except BaseException:
            self._close_stores()
            raise
        self._owned: OpBackend | None = None  # the backend this worker created, if any
        if context is not None:
            backend, seq = context.backend, context.seq
        else:
            try:
                self._owned, backend, seq = own_backend(
                    registry or BackendRegistry(), self.model, self.config
                )
            except BaseException:
                self._close_stores()
                raise
        self.guard = context.lock if context is not None else ContextGuard()
        try:
            self._lanes = open_lanes(backend, seq, self.config, self.guard)
        except BaseException:
            if self._owned is not None:
                self._owned.close()
            self._close_stores()
            raise
        self.scheduler = self._lanes.scheduler
        self.backend: SequenceBackend = self._lanes.context or backend
        self._waiting = 0  # threads waiting for (or holding) the worker for a request
        self._waiting_lock = threading.Lock()
        self._local = threading.local()  # .lane: the lane this thread's turn holds
        self._idle = IdleRunner(self)
        self._sessions: dict[str, ChatSession] = {}
        self._opening: set[str] = set()  # ids being created or reopened (a decode may wait)
        self.lane_order = LaneOrder.parse(self.config.lane_order)
        self._lane_waiters: dict[ChatSession, float] = {}  # turns waiting for a lane: since
        self._state = _State.OPEN
        self.tiers: TurnTiers | None = None
        # set by an engine that shares this worker's context: free cells for a lane growing
        # to N tokens (the lane itself, so its own cells are not counted twice)
        self.make_room: Callable[[int, Lane | None], None] | None = None
        self.snapshots: SnapshotStore = self.stores.snapshots
        self.snapshot_dir = self.stores.snapshot_dir
        if context is not None:
            self.snapshots, self.snapshot_dir = context.snapshots, None
        self.residency = Residency(
            self._lanes.views,
            self.model.digest,
            self.snapshots,
            exact=self.config.exact,
            priced=self.config.park_policy == "price",
        )
        self.residency.reserve = self.reserve
        self.seq = self.residency.seq

    def _open_stores(self, store: StoreTarget, context: SharedContext | None) -> Stores:
        """The worker's own stores: its parked sessions go to disk (or Redis) unless told not
        to, or unless it runs on another's context (whose snapshot store it uses)."""
        c = self.config
        on_disk = c.session_snapshots and context is None
        place = SnapshotPlace(c.park_budget_bytes, c.snapshot_disk_bytes, c.snapshot_dir, on_disk)
        return Stores.open(store, place)

    def _close_stores(self) -> None:
        if self._owns_store:
            self.stores.close()

    # -- requests, lanes and idle work ---------------------------------------------------------
    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the worker for a request; idle work sees the claim and steps aside."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            with self.guard:
                yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    @property
    def lanes(self) -> list[Lane]:
        return self.residency.lanes

    @property
    def is_open(self) -> bool:
        return self._state is _State.OPEN

    def enter(self, session: ChatSession) -> Lane:
        """Make ``session`` active in a lane and hold the lane for this thread (under the
        guard; waits while every lane — or the session's own — is held)."""
        found: list[Lane] = []
        t0 = time.monotonic()

        def ready() -> bool:
            self._check_open()
            if session.closed:
                raise SessionClosed(session.id)
            lane = self.residency.lane_for(session, time.monotonic() - t0)
            if lane is None or self._gives_way(session):
                return False
            if lane.holder == IDLE:
                lane.seq.withdraw()  # idle work not yet in a step gives way to the request
            found[:] = [lane] if lane.holder is None else []
            return bool(found)

        self._lane_waiters[session] = t0
        try:
            # re-checked as the patience runs out: protected sessions may be parked then
            self.guard.wait_for(ready, recheck_s=PATIENCE_S / 4)
        finally:
            self._lane_waiters.pop(session, None)
        lane = found[0]
        lane.holder = session
        try:
            with self.on_lane(lane):
                self.activate(session, lane)
        except BaseException:
            lane.holder = None
            raise
        lane.seq.tenant = session.tenant
        lane.seq.started = session.started
        return lane

    def program(self, session_id: str) -> tuple[float, int] | None:
        """An open session's start and the tokens it holds (what ``lane_order`` ranks it by),
        read without the guard: a hint for a queue's order; None when it is not open here."""
        s = self._sessions.get(session_id)
        if s is None:
            return None
        lane = s.lane
        return s.started, len(lane.seq.tokens) if lane is not None else len(s.resident)

    @property
    def waiting_for_lanes(self) -> int:
        """Turns waiting for a lane now."""
        return len(self._lane_waiters)

    def _gives_way(self, session: ChatSession) -> bool:
        """Another turn waiting for a lane goes before ``session``'s (``lane_order``, under
        the guard)."""
        if len(self._lane_waiters) < 2:
            return False
        now = time.monotonic()
        waiting = {
            s: Waiter(since, s.started, len(s.resident), s.lane is None)
            for s, since in self._lane_waiters.items()
        }
        by_waiter = {id(w): s for s, w in waiting.items()}

        def can_take(w: Waiter) -> bool:
            s = by_waiter[id(w)]
            lane = self.residency.lane_for(s, now - w.since)
            return lane is not None and lane.holder in (None, IDLE)

        me = waiting[session]
        return yields_to_another(me, waiting.values(), self.lane_order, now, can_take)

    def leave(self, lane: Lane) -> None:
        """The turn holding ``lane`` is done with it."""
        lane.holder = None
        lane.used = time.monotonic()
        self.guard.notify()

    @contextmanager
    def holding(self, session: ChatSession) -> Iterator[Lane]:
        """:meth:`enter` for the block, with this thread's lane set (see :meth:`reserve`)."""
        lane = self.enter(session)
        try:
            with self.on_lane(lane):
                yield lane
        finally:
            self.leave(lane)

    @contextmanager
    def on_lane(self, lane: Lane) -> Iterator[None]:
        prev = getattr(self._local, "lane", None)
        self._local.lane = lane
        try:
            yield
        finally:
            self._local.lane = prev

    def schedule_glue(self, session: ChatSession) -> None:
        """Decode ``session``'s eager glue in the background once no request is waiting."""
        if not (self.config.eager_glue and self.config.idle_glue) or not session.pending_glue:
            return
        self._idle.schedule(session)

    def schedule_speculation(self, session: ChatSession) -> None:
        if self.config.speculate_after_ms is None or session.arrival is None:
            return
        self._idle.schedule(session)

    def reserve(self, total: int) -> None:
        """Room for this thread's lane to grow to ``total`` tokens (others sharing the
        context give way; see ``make_room``)."""
        if self.make_room is not None:
            self.make_room(total, getattr(self._local, "lane", None))

    def park_idle(self, exclude: Lane | None = None) -> bool:
        """Park the active session no one holds that gives way next (not ``exclude``'s:
        :meth:`KVSpace.to_park`) and free its sequence; False if there is none."""
        with self.guard:
            lane = self.residency.space.to_park(exclude, sessions_only=True)
            if lane is None:
                return False
            self.residency.evict(lane)
            return True

    def park_active(self) -> None:
        """Park every active session no turn holds (their KV to snapshots)."""
        while self.park_idle():
            pass

    @property
    def busy(self) -> bool:
        """Idle work steps aside: a request waits for (or holds) a worker whose turns run one
        at a time (with lanes decoded together, idle work rides in the steps instead)."""
        return self.scheduler is None and self._waiting > 0

    # -- the result tiers above (the engine sets ``tiers``) --------------------------------------
    def tiers_lookup(self, query: TurnQuery) -> TurnLookup | None:
        return self.tiers.lookup(query) if self.tiers is not None else None

    def tiers_record(
        self, lookup: TurnLookup, text: str, tokens: tuple[int, ...], finish: str
    ) -> None:
        if self.tiers is not None:
            self.tiers.record(lookup, text, tokens, finish)

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until queued idle work is done (tests and benchmarks); False on timeout."""
        return self._idle.settle(timeout)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close every session (their KV kept as snapshots); replies still decoding end with
        :class:`~continuum.errors.SessionClosed`."""
        self._idle.close()
        if self.scheduler is not None:
            self.scheduler.close()  # replies still decoding end now
        with self.guard:
            if self._state is _State.CLOSED:
                return
            for open_ in list(self._sessions.values()):
                self.residency.persist(open_)
                open_.closed = True
            self._state = _State.CLOSED
            self._sessions.clear()
            for lane in self.lanes:
                if lane.session is not None:
                    lane.session.lane = None
                lane.session = None
            self._lanes.close()
            if self._owned is not None:
                self._owned.close()
            self._close_stores()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise SessionClosed("worker")

    # -- sessions --------------------------------------------------------------------------------
    def create_session(
        self,
        system: str | None = None,
        *,
        continuity: str | None = None,
        session_id: str | None = None,
        high_water: float | None = None,
        tenant: str = "",
        tools: Sequence[dict[str, Any]] | None = None,
        compaction: CompactionMode | None = None,
    ) -> ChatSession:
        """Create a session and run its wake phase: the system prompt and continuity context
        are prefilled before any user message exists (with ``tools``, the tools its turns
        will send: they are part of the preamble). ``compaction`` overrides the worker's."""
        for name, value in (("system", system), ("continuity", continuity)):
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
        mode = check_mode(compaction if compaction is not None else self.config.compaction)
        hw = self.config.high_water_tokens(self.backend.n_ctx, high_water)
        with self.guard, self._reserving(session_id):
            sid = SessionId(session_id or "pending")
            session = ChatSession(
                self, sid, Conversation(system, continuity), high_water=hw, compaction=mode
            )
            session.tenant = tenant
            session.transcript.turn_tools = normalize_tools(tools) or None if tools else None
            with self.holding(session):
                try:
                    session.wake_up()  # raises ContextOverflow before anything is stored
                except BaseException:
                    self.residency.leave(session)
                    raise
            session.id = self.store.create_session(
                model_digest=self.model.digest,
                chat_format=self.backend.chat_format.name,
                system=system,
                continuity=continuity,
                config={
                    "n_ctx": self.backend.n_ctx,
                    "high_water": hw,
                    "tenant": tenant,
                    "compaction": mode,
                },
                session_id=session_id,
            )
            self._sessions[session.id] = session
        self.schedule_glue(session)
        return session

    @contextmanager
    def _reserving(self, session_id: str | None) -> Iterator[None]:
        """Hold ``session_id`` (if given) while a session of that id is created: taken ids are
        refused before anything is activated or decoded (under the guard)."""
        self._check_open()
        if session_id is None:
            yield
            return
        if session_id in self._opening or self._taken(session_id):
            raise SessionExists(session_id)
        self._opening.add(session_id)
        try:
            yield
        finally:
            self._opening.discard(session_id)
            self.guard.notify()

    def wait_opening(self, session_id: str) -> None:
        """Wait while a session of this id is being created or reopened (holds the guard)."""
        with self.guard:
            self.guard.wait_for(lambda: session_id not in self._opening)

    def _taken(self, session_id: str) -> bool:
        try:
            self.store.session_tenant(session_id)
        except SessionNotFound:
            return session_id in self._sessions
        return True

    def _unheld(self, session: ChatSession) -> None:
        """Wait (under the guard) until no turn holds ``session``'s lane."""
        self.guard.wait_for(lambda: session.lane is None or session.lane.holder is None)

    def delete_session(self, session_id: str) -> bool:
        """Close a session and delete its history and KV snapshot; False if it did not exist."""
        with self.guard:
            self._check_open()
            open_ = self._sessions.get(session_id)
            if open_ is not None:
                self._drop(open_)
            self.residency.forget(session_id)
            return self.store.delete_session(session_id)

    def _drop(self, session: ChatSession) -> None:
        """Close ``session`` here without keeping its KV (deleted, or moved on elsewhere)."""
        self._unheld(session)
        self._sessions.pop(session.id, None)
        session.closed = True
        self.residency.leave(session)

    def open_session(self, session_id: str, *, high_water: float | None = None) -> ChatSession:
        """Reopen a stored session (a new process; an open one another worker moved on since).
        Its KV is rebuilt from the log now; the next turn's metrics report the rebuild."""
        with self.guard:
            self._check_open()
            self.guard.wait_for(lambda: session_id not in self._opening)
            rec = self.store.load_session(session_id)
            if (open_ := self._sessions.get(session_id)) is not None:
                if open_.turns == rec.turns:
                    return open_
                self._drop(open_)  # its resident KV is a verified prefix, at best: rebuild
            hw = self.config.high_water_tokens(self.backend.n_ctx, high_water)
            session = ChatSession(
                self,
                rec.id,
                Conversation.reopened(rec, self.store.messages(rec.id)),
                high_water=hw,
                compaction=check_mode(rec.config.get("compaction", "window")),
            )
            session.tenant = str(rec.config.get("tenant", ""))
            self._opening.add(session_id)
            try:
                with self.holding(session):
                    self._rebuild(session, rec.model_digest)
            finally:
                self._opening.discard(session_id)
            self._sessions[session.id] = session
            return session

    def _rebuild(self, session: ChatSession, model_digest: str) -> None:
        if model_digest != self.model.digest:
            reason, detail = (
                ResetReason.MODEL_CHANGED,
                f"created on {model_digest}, now {self.model.digest}: "
                "re-tokenized from the text history",
            )
        else:
            reason, detail = ResetReason.EVICTED, "reopened: KV rebuilt from the history log"
        snapshot = None
        if reason is ResetReason.EVICTED:
            try:
                snapshot = self.residency.read(session.id)
            except SnapshotError as e:
                reason, detail = ResetReason.RESTORE_FAILED, f"{e}; rebuilt from the log"
        try:
            session.rebuild(reason, detail, self.config.rebuild_reserve_tokens, snapshot)
        except BaseException:
            self.residency.leave(session)
            raise

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def prefetch(self, session_id: str, tenant: str) -> str:
        """:meth:`Residency.prefetch` for an open session of ``tenant`` (another tenant's, or
        a session not open here, is left alone: "")."""
        with self.guard:
            session = self._sessions.get(session_id)
            if session is None or session.closed or session.tenant != tenant:
                return ""
            return self.residency.prefetch(session)

    def park_all(self) -> int:
        """Write every session's KV to the snapshot store now, durably (a draining worker:
        with a shared store, another worker resumes them); the number of entries written."""
        with self.guard:
            for session in list(self._sessions.values()):
                self.residency.persist(session)
            return self.snapshots.flush_all()

    def release(self, session: ChatSession) -> None:
        with self.guard:
            self._unheld(session)
            self._sessions.pop(session.id, None)
            if self._state is _State.OPEN:
                self.residency.persist(session)
                self.residency.leave(session)

    # -- residency (called under the guard) --------------------------------------------------
    def activate(self, session: ChatSession, lane: Lane) -> None:
        """Make ``session`` the one in ``lane`` (others sharing the context first make room
        for its parked state)."""
        if lane.session is not session:
            self.residency.evict(lane)
            if session.resident:
                self.reserve(len(session.resident))
        self.residency.activate(session, lane)

    @property
    def swaps(self) -> int:
        return self.residency.swaps

    @property
    def disk_restores(self) -> int:
        return self.residency.disk_restores

    @property
    def borrowed(self) -> Borrowed:
        """Prompt tokens sessions took from another sequence of their tenant instead of
        decoding them, by where they came from."""
        r = self.residency
        return Borrowed(r.borrowed - r.borrowed_parked, r.borrowed_parked)

    @property
    def evictions(self) -> int:
        """Snapshots pushed out of the RAM budget (written back to disk when there is one)."""
        return self.snapshots.stats().ram_evictions

    @property
    def parked_bytes(self) -> int:
        """Bytes of KV snapshots held in RAM (parked sessions, and layer KV when shared)."""
        return self.snapshots.stats().ram_bytes
