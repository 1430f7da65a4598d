"""The long-lived worker: many stateful sessions on one resident sequence of a context.

The worker runs on a :class:`~continuum.backends.base.SequenceBackend` — its own, or (inside an
:class:`~continuum.engine.Engine`) one sequence of the engine's context — and serialises every
use of it with one lock. Several sessions can be open; one is *active* (its sequence is in the
context), the others are parked as KV snapshots (:mod:`continuum.stateful.residency`). Idle
work — eager glue, a speculative finish — runs on a background thread that steps aside for
every request. Turns of an engine's worker walk the engine's result tiers first
(:mod:`continuum.stateful.hooks`).
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from continuum.backends.base import OpBackend, SequenceBackend, SequenceView
from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, Progress, resolve_model
from continuum.backends.registry import BackendRegistry
from continuum.errors import (
    InvalidRequest,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SnapshotError,
)
from continuum.metrics import ResetReason
from continuum.stateful.compaction import NOTE_TOKENS, CompactionMode, check_mode
from continuum.stateful.hooks import TurnLookup, TurnQuery, TurnTiers
from continuum.stateful.residency import Residency
from continuum.stateful.session import ChatSession
from continuum.store.base import SnapshotStore
from continuum.store.snapshots import FileSnapshotStore
from continuum.store.sqlite import HistoryStore, SessionId
from continuum.toolcalls import normalize_tools

log = logging.getLogger(__name__)


def default_store_path() -> Path:
    home = os.environ.get("CONTINUUM_HOME")
    base = Path(home) if home else Path.home() / ".local" / "share" / "continuum"
    return base / "history.db"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Settings of a worker. ``high_water`` is a fraction of n_ctx (<= 1.0) or a token count."""

    llama: LlamaConfig = field(default_factory=LlamaConfig)
    # a worker on a context of its own asks the registry for this backend (with no prefix
    # slots) and runs on its resident sequence; it must keep resident sequences
    backend: str = "llamacpp"
    high_water: float = 0.9
    park_budget_bytes: int = 512 << 20  # RAM for parked KV snapshots (LRU)
    # KV snapshots on disk: a session pushed out of the park budget, closed, or left open when
    # the worker closes is written to <snapshot_dir>, and comes back from there without
    # re-prefill (None: a "snapshots" folder next to the history store); least recently used
    # files are deleted past ``snapshot_disk_bytes``. An engine shares its own store instead.
    session_snapshots: bool = True
    snapshot_dir: Path | None = None
    snapshot_disk_bytes: int | None = 4 << 30
    rebuild_reserve_tokens: int = 256  # room left for a reply when rebuilding on reopen
    # what a session does with the turns that leave its window at the high-water mark:
    # "window" drops them from it; "summary" has the model summarise the conversation into a
    # continuity note of at most ``note_tokens`` (see continuum.stateful.compaction)
    compaction: CompactionMode = "window"
    note_tokens: int = NOTE_TOKENS
    # eager glue: after a reply, decode the template tokens that open the next user message
    # while the session is idle (a background thread that steps aside for waiting requests).
    # Off by default in the library, where a caller looping over turns leaves no idle time and
    # the glue would only cost one extra small decode per turn; on in `continuum serve` and
    # `continuum chat`, where a person or a tool leaves a gap between messages.
    eager_glue: bool = False
    idle_glue: bool = True  # False: the glue is decoded at the start of the next turn instead
    # speculative finish: once a message being fed has been quiet this long, the idle runner
    # decodes the rest of the prompt as if the message had ended (its last word, the end of
    # the turn and the reply header); if commit() then finds the same prompt, the first token
    # is sampled at once. More text simply truncates it. None: off.
    speculate_after_ms: float | None = 30.0

    def high_water_tokens(self, n_ctx: int, override: float | None = None) -> int:
        hw = self.high_water if override is None else override
        if isinstance(hw, bool) or not isinstance(hw, (int, float)) or hw <= 0:
            raise InvalidRequest(f"high_water must be a positive number, got {hw!r}")
        tokens = int(hw * n_ctx) if hw <= 1.0 else int(hw)
        if tokens > n_ctx:
            raise InvalidRequest(f"high_water {tokens} exceeds n_ctx {n_ctx}")
        return tokens


def _own_backend(
    registry: BackendRegistry, model: ModelFile, config: WorkerConfig
) -> tuple[OpBackend, SequenceBackend, int]:
    """A backend of the worker's own, from the registry: it and its resident sequence."""
    made = registry.create(config.backend, model=model, config=config.llama, n_slots=0)
    resident = getattr(made, "resident_sequence", None)
    if not made.capabilities.resident_sequences or resident is None:
        made.close()
        raise InvalidRequest(
            f"backend {config.backend!r} keeps no resident sequences: a stateful worker "
            "needs one that does (llamacpp)"
        )
    backend, seq = resident()
    return made, backend, seq


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
        store: HistoryStore | str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
        backend: SequenceBackend | None = None,
        seq: int = 0,
        lock: threading.RLock | None = None,
        snapshots: SnapshotStore | None = None,
        registry: BackendRegistry | None = None,
    ) -> None:
        """A worker on its own model and context, or — with ``backend=`` — on sequence ``seq``
        of a context someone else owns (the engine), serialised by that owner's ``lock``, with
        parked KV in that owner's ``snapshots`` store."""
        self.config = config or WorkerConfig()
        if backend is not None:
            self.model = backend.model
        else:
            self.model = model if isinstance(model, ModelFile) else resolve_model(model, progress)
        self._owns_store = not isinstance(store, HistoryStore)
        if isinstance(store, HistoryStore):
            self.store = store
        else:
            self.store = HistoryStore(Path(store) if store else default_store_path())
        self._owned: OpBackend | None = None  # the backend this worker created, if any
        if backend is None:
            try:
                self._owned, backend, seq = _own_backend(
                    registry or BackendRegistry(), self.model, self.config
                )
            except BaseException:
                if self._owns_store:
                    self.store.close()
                raise
        self.backend: SequenceBackend = backend
        self.seq = SequenceView(self.backend, seq)
        self._lock = lock or threading.RLock()
        self._waiting = 0  # threads waiting for (or holding) the lock for a request
        self._waiting_lock = threading.Lock()
        self._idle: queue.SimpleQueue[ChatSession | None] | None = None
        self._idle_pending = 0
        self._idle_queued: set[int] = set()  # sessions with a job in the queue (by id())
        self._sessions: dict[str, ChatSession] = {}
        self._state = _State.OPEN
        self.tiers: TurnTiers | None = None
        # set by an engine that shares this worker's context: free cells for a session of N
        self.make_room: Callable[[int], None] | None = None
        self.snapshot_dir: Path | None = None
        if self.config.session_snapshots:
            self.snapshot_dir = self.config.snapshot_dir or self.store.path.parent / "snapshots"
        self.snapshots: SnapshotStore = snapshots or FileSnapshotStore(
            ram_budget_bytes=self.config.park_budget_bytes,
            directory=self.snapshot_dir,
            disk_budget_bytes=self.config.snapshot_disk_bytes,
        )
        self.residency = Residency(self.seq, self.model.digest, self.snapshots)

    # -- requests and idle work ----------------------------------------------------------------
    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the worker for a request; idle work sees the claim and steps aside."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            with self._lock:
                yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def schedule_glue(self, session: ChatSession) -> None:
        """Decode ``session``'s eager glue in the background once no request is waiting."""
        if not (self.config.eager_glue and self.config.idle_glue) or not session.pending_glue:
            return
        self._schedule_idle(session)

    def schedule_speculation(self, session: ChatSession) -> None:
        if self.config.speculate_after_ms is None or session.arrival is None:
            return
        self._schedule_idle(session)

    def _schedule_idle(self, session: ChatSession) -> None:
        if self._idle is None:
            self._idle = queue.SimpleQueue()
            threading.Thread(target=self._idle_loop, name="continuum-idle", daemon=True).start()
        with self._waiting_lock:
            if id(session) in self._idle_queued:
                return  # one job per session in the queue is enough: it reads fresh state
            self._idle_queued.add(id(session))
            self._idle_pending += 1
        self._idle.put(session)

    def _idle_loop(self) -> None:
        assert self._idle is not None
        while (session := self._idle.get()) is not None:
            with self._waiting_lock:
                self._idle_queued.discard(id(session))
            try:
                self._idle_glue(session)
            except Exception:  # idle work must never take the worker down
                log.exception("eager glue for %s failed", session.id)
            finally:
                with self._waiting_lock:
                    self._idle_pending -= 1

    def _idle_glue(self, session: ChatSession) -> None:
        """Decode ``session``'s glue (or a speculative finish of the message it is being fed)
        if nothing else wants the worker. Session state only changes under the worker lock
        (turns and feeds hold it throughout), so holding it here is enough; the session's own
        turn lock is left alone, so a turn that arrives is never refused as busy — at worst it
        waits for one batch."""
        delay = self.config.speculate_after_ms
        arrival = session.arrival
        if arrival is not None and delay is not None:
            while True:  # wait until the message has been quiet for `delay`
                quiet = time.perf_counter() - arrival.t_last
                if quiet * 1000 >= delay or session.arrival is None:
                    break
                time.sleep(delay / 1000 - quiet)
        while self._waiting and self._state is _State.OPEN:
            time.sleep(0.002)  # a request is waiting or running: it goes first
        if self._state is not _State.OPEN or not self._lock.acquire(blocking=False):
            return  # the next turn or feed does the work itself
        try:
            if not self._waiting and self._active is session and not session.closed:
                session.idle_step(speculate=delay is not None)
        finally:
            self._lock.release()

    def reserve(self, total: int) -> None:
        """Room for the active sequence to grow to ``total`` tokens (others sharing the
        context give way; see ``make_room``)."""
        if self.make_room is not None:
            self.make_room(total)

    def live_prefixes(self, namespace: str) -> list[tuple[int, int]]:
        """The active session of ``namespace`` as a prefix-KV candidate: its sequence and how
        many of its first tokens (the wake prefix) were decoded as whole prompt batches."""
        s = self._active
        if s is None or s.tenant != namespace or s.transcript.wake is None:
            return []
        wake = s.transcript.wake
        return [(self.seq.seq, len(wake))] if self.seq.tokens[: len(wake)] == list(wake) else []

    def park_active(self) -> None:
        """Park the active session (its KV to a snapshot) and free its sequence."""
        with self._lock:
            if self._active is not None:
                self.residency.park(self._active)
                self.seq.clear()
                self.residency.active = None

    @property
    def busy(self) -> bool:
        """A request is waiting for the worker or holds it (idle work steps aside)."""
        return self._waiting > 0

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
        deadline = time.perf_counter() + timeout
        while self._idle_pending:
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.001)
        return True

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._idle is not None:
            self._idle.put(None)
        with self._lock:
            if self._state is _State.CLOSED:
                return
            for open_ in list(self._sessions.values()):
                self.residency.persist(open_)
                open_.closed = True
            self._state = _State.CLOSED
            self._sessions.clear()
            self.residency.active = None
            if self._owned is not None:
                self._owned.close()
            if self._owns_store:
                self.store.close()

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
        with self._lock:
            self._check_open()
            if session_id is not None and self._taken(session_id):
                raise SessionExists(session_id)  # before anything is activated or decoded
            sid = SessionId(session_id or "pending")
            session = ChatSession(
                self, sid, system=system, continuity=continuity, history=[], high_water=hw,
                compaction=mode,
            )  # fmt: skip
            session.transcript.turn_tools = normalize_tools(tools) or None if tools else None
            self.activate(session)
            try:
                session.wake_up()  # raises ContextOverflow before anything is stored
            except BaseException:
                self.residency.active = None
                self.seq.clear()
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
            session.tenant = tenant
            self._sessions[session.id] = session
        self.schedule_glue(session)
        return session

    def _taken(self, session_id: str) -> bool:
        try:
            self.store.session_tenant(session_id)
        except SessionNotFound:
            return session_id in self._sessions
        return True

    def delete_session(self, session_id: str) -> bool:
        """Close a session and delete its history and KV snapshot; False if it did not exist."""
        with self._lock:
            self._check_open()
            open_ = self._sessions.pop(session_id, None)
            if open_ is not None:
                open_.closed = True
                if self._active is open_:
                    self.residency.active = None
                    self.seq.clear()
            self.residency.forget(session_id)
            return self.store.delete_session(session_id)

    def open_session(self, session_id: str, *, high_water: float | None = None) -> ChatSession:
        """Reopen a stored session (e.g. in a new process). Its KV is rebuilt from the history
        log now, and the rebuild is reported as a reset in the next turn's metrics."""
        with self._lock:
            self._check_open()
            if session_id in self._sessions:
                return self._sessions[session_id]
            rec = self.store.load_session(session_id)
            hw = self.config.high_water_tokens(
                self.backend.n_ctx, high_water if high_water is not None else None
            )
            session = ChatSession(
                self,
                rec.id,
                system=rec.system,
                continuity=rec.continuity,
                history=self.store.messages(rec.id),
                high_water=hw,
                turns=rec.turns,
                compaction=check_mode(rec.config.get("compaction", "window")),
                note=rec.note,
                created_at=rec.created_at,
            )
            if rec.model_digest != self.model.digest:
                reason, detail = (
                    ResetReason.MODEL_CHANGED,
                    (
                        f"created on {rec.model_digest}, now {self.model.digest}: "
                        "re-tokenized from the text history"
                    ),
                )
            else:
                reason, detail = ResetReason.EVICTED, "reopened: KV rebuilt from the history log"
            session.tenant = str(rec.config.get("tenant", ""))
            self.activate(session)
            snapshot = None
            if reason is ResetReason.EVICTED:
                try:
                    snapshot = self.residency.read(session.id)
                except SnapshotError as e:
                    reason, detail = ResetReason.RESTORE_FAILED, f"{e}; rebuilt from the log"
            session.rebuild(reason, detail, self.config.rebuild_reserve_tokens, snapshot)
            self._sessions[session.id] = session
            return session

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def release(self, session: ChatSession) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
            if self._state is _State.OPEN:
                self.residency.persist(session)
            if self._active is session:
                self.residency.active = None
                if self._state is _State.OPEN:
                    self.seq.clear()

    # -- residency (called under the lock) ---------------------------------------------------
    def activate(self, session: ChatSession) -> None:
        """Make ``session``'s sequence the one in the context (others sharing the context
        first make room for its parked state)."""
        if self.residency.active is not session and session.resident:
            self.reserve(len(session.resident))
        self.residency.activate(session)

    @property
    def _active(self) -> ChatSession | None:
        return self.residency.active

    @property
    def swaps(self) -> int:
        return self.residency.swaps

    @property
    def disk_restores(self) -> int:
        return self.residency.disk_restores

    @property
    def evictions(self) -> int:
        """Snapshots pushed out of the RAM budget (written back to disk when there is one)."""
        return self.snapshots.stats().ram_evictions

    @property
    def parked_bytes(self) -> int:
        """Bytes of KV snapshots held in RAM (parked sessions, and layer KV when shared)."""
        return self.snapshots.stats().ram_bytes
