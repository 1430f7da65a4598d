"""The long-lived worker: one model, one llama.cpp context, many sessions.

The worker owns the :class:`LlamaCppBackend` and serialises every use of its context with one
lock. Several sessions can be open; one is *active* (its sequence is in the context). Switching
parks the active session's KV as a state snapshot in RAM (``llama_state_seq_get_data``, a few
milliseconds) and restores the next one's (``set_data``) — an LRU set of resident sessions with
a byte budget. A session pushed out of the budget loses its snapshot and is rebuilt from the
history log on its next turn, visibly (``evicted``). A snapshot is restored only for exactly the
token sequence it was taken from (DESIGN.md §3.5).
"""

from __future__ import annotations

import array
import enum
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from continuum.backends.kv_snapshot import decode_snapshot, encode_snapshot, write_atomic
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile, Progress, resolve_model
from continuum.errors import BackendError, InvalidRequest, SessionClosed, SnapshotError
from continuum.hashing import digest
from continuum.metrics import Reset, ResetReason
from continuum.stateful.session import ChatSession
from continuum.store.sqlite import HistoryStore, SessionId

log = logging.getLogger(__name__)


def default_store_path() -> Path:
    home = os.environ.get("CONTINUUM_HOME")
    base = Path(home) if home else Path.home() / ".local" / "share" / "continuum"
    return base / "history.db"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Settings of a worker. ``high_water`` is a fraction of n_ctx (<= 1.0) or a token count."""

    llama: LlamaConfig = field(default_factory=LlamaConfig)
    high_water: float = 0.9
    park_budget_bytes: int = 512 << 20
    # KV snapshots on disk: a session pushed out of the park budget, closed, or left open when
    # the worker closes is written to <snapshot_dir>/session-<id hash>.ckv, and comes back from
    # there without re-prefill (None: a "snapshots" folder next to the history store)
    session_snapshots: bool = True
    snapshot_dir: Path | None = None
    rebuild_reserve_tokens: int = 256  # room left for a reply when rebuilding on reopen
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


@dataclass(frozen=True, slots=True)
class _Parked:
    state: bytes
    tokens: list[int]


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
    ) -> None:
        self.config = config or WorkerConfig()
        self.model = model if isinstance(model, ModelFile) else resolve_model(model, progress)
        self._owns_store = not isinstance(store, HistoryStore)
        if isinstance(store, HistoryStore):
            self.store = store
        else:
            self.store = HistoryStore(Path(store) if store else default_store_path())
        try:
            self.backend = LlamaCppBackend(self.model, self.config.llama)
        except BaseException:
            if self._owns_store:
                self.store.close()
            raise
        self._lock = threading.RLock()
        self._waiting = 0  # threads waiting for (or holding) the lock for a request
        self._waiting_lock = threading.Lock()
        self._idle: queue.SimpleQueue[ChatSession | None] | None = None
        self._idle_pending = 0
        self._idle_queued: set[int] = set()  # sessions with a job in the queue (by id())
        self._sessions: dict[str, ChatSession] = {}
        self._active: ChatSession | None = None
        self._parked: OrderedDict[str, _Parked] = OrderedDict()
        self._parked_bytes = 0
        self._state = _State.OPEN
        self.swaps = 0
        self.evictions = 0
        self.disk_restores = 0
        self.snapshot_dir: Path | None = None
        if self.config.session_snapshots:
            self.snapshot_dir = self.config.snapshot_dir or self.store.path.parent / "snapshots"

    # -- requests and idle work ----------------------------------------------------------------
    @contextmanager
    def _claim(self) -> Iterator[None]:
        """Hold the worker for a request; idle work sees the claim and steps aside."""
        with self._waiting_lock:
            self._waiting += 1
        try:
            with self._lock:
                yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def _schedule_glue(self, session: ChatSession) -> None:
        """Decode ``session``'s eager glue in the background once no request is waiting."""
        if not (self.config.eager_glue and self.config.idle_glue) or not session._glue:
            return
        self._schedule_idle(session)

    def _schedule_speculation(self, session: ChatSession) -> None:
        if self.config.speculate_after_ms is None or session._input is None:
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
        if session._input is not None and delay is not None:
            while True:  # wait until the message has been quiet for `delay`
                quiet = time.perf_counter() - session._input_at
                if quiet * 1000 >= delay or session._input is None:
                    break
                time.sleep(delay / 1000 - quiet)
        while self._waiting and self._state is _State.OPEN:
            time.sleep(0.002)  # a request is waiting or running: it goes first
        if self._state is not _State.OPEN or not self._lock.acquire(blocking=False):
            return  # the next turn or feed does the work itself
        try:
            if not self._waiting and self._active is session and not session._closed:
                session._settle_glue()
                if delay is not None and not self._waiting:
                    session._speculate()
        finally:
            self._lock.release()

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
            if self._active is not None:
                self._write_snapshot(self._active.id, self.backend.tokens, None)
            for sid, parked in self._parked.items():
                self._write_snapshot(sid, parked.tokens, parked.state)
            self._state = _State.CLOSED
            for s in list(self._sessions.values()):
                s._closed = True
            self._sessions.clear()
            self._parked.clear()
            self.backend.close()
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
    ) -> ChatSession:
        """Create a session and run its wake phase: the system prompt and continuity context
        are prefilled before any user message exists."""
        for name, value in (("system", system), ("continuity", continuity)):
            if value is not None and not isinstance(value, str):
                raise InvalidRequest(f"{name} must be a string, got {type(value).__name__}")
        hw = self.config.high_water_tokens(self.backend.n_ctx, high_water)
        with self._lock:
            self._check_open()
            sid = SessionId(session_id or "pending")
            session = ChatSession(
                self, sid, system=system, continuity=continuity, history=[], high_water=hw
            )
            self._activate(session)
            try:
                session._wake_up()  # raises ContextOverflow before anything is stored
            except BaseException:
                self._active = None
                self.backend.clear()
                raise
            session.id = self.store.create_session(
                model_digest=self.model.digest,
                chat_format=self.backend.chat_format.name,
                system=system,
                continuity=continuity,
                config={"n_ctx": self.backend.n_ctx, "high_water": hw, "tenant": tenant},
                session_id=session_id,
            )
            session.tenant = tenant
            self._sessions[session.id] = session
        self._schedule_glue(session)
        return session

    def delete_session(self, session_id: str) -> bool:
        """Close a session and delete its history and KV snapshot; False if it did not exist."""
        with self._lock:
            self._check_open()
            open_ = self._sessions.pop(session_id, None)
            if open_ is not None:
                open_._closed = True
                self._drop_parked(session_id)
                if self._active is open_:
                    self._active = None
                    self.backend.clear()
            path = self._snapshot_path(session_id)
            if path is not None:
                path.unlink(missing_ok=True)
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
            self._activate(session)
            snapshot = None
            if reason is ResetReason.EVICTED:
                try:
                    snapshot = self._read_snapshot(session.id)
                except SnapshotError as e:
                    reason, detail = ResetReason.RESTORE_FAILED, f"{e}; rebuilt from the log"
            session._rebuild(reason, detail, self.config.rebuild_reserve_tokens, snapshot)
            self._sessions[session.id] = session
            return session

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def _release(self, session: ChatSession) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
            parked = self._drop_parked(session.id)
            if parked is not None:
                self._write_snapshot(session.id, parked.tokens, parked.state)
            elif self._active is session and self._state is _State.OPEN:
                self._write_snapshot(session.id, self.backend.tokens, None)
            if self._active is session:
                self._active = None
                if self._state is _State.OPEN:
                    self.backend.clear()

    # -- residency (called under the lock) ---------------------------------------------------
    def _activate(self, session: ChatSession) -> None:
        """Make ``session``'s sequence the one in the context."""
        if self._active is session:
            return
        t0 = time.perf_counter()
        if self._active is not None:
            self._park(self._active)
        parked = self._drop_parked(session.id)
        if parked is not None:
            try:
                self.backend.load_state(parked.state, parked.tokens)
            except BackendError as e:
                self.backend.clear()
                session.pending_resets.append(
                    Reset(ResetReason.RESTORE_FAILED, str(e), len(parked.tokens), -1)
                )
        else:
            self.backend.clear()
            if session.resident and not self._restore_from_disk(session):
                session.pending_resets.append(
                    Reset(
                        ResetReason.EVICTED,
                        "the parked snapshot was evicted (park budget)",
                        len(session.resident),
                        -1,
                    )
                )
        session.resident = []
        self._active = session
        self.swaps += 1
        log.debug("activated %s in %.1f ms", session.id, (time.perf_counter() - t0) * 1000)

    def _park(self, session: ChatSession) -> None:
        tokens = list(self.backend.tokens)
        session.resident = tokens
        if not tokens or self.config.park_budget_bytes <= 0:
            return
        state = self.backend.save_state()
        self._parked[session.id] = _Parked(state, tokens)
        self._parked_bytes += len(state)
        while self._parked_bytes > self.config.park_budget_bytes and self._parked:
            sid, old = self._parked.popitem(last=False)
            self._parked_bytes -= len(old.state)
            self.evictions += 1
            self._write_snapshot(sid, old.tokens, old.state)
            log.info("evicted parked session %s (%d bytes)", sid, len(old.state))

    def _drop_parked(self, session_id: str) -> _Parked | None:
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            self._parked_bytes -= len(parked.state)
        return parked

    # -- KV snapshots on disk -------------------------------------------------------------------
    def _snapshot_path(self, session_id: str) -> Path | None:
        if self.snapshot_dir is None:
            return None
        return self.snapshot_dir / f"session-{digest(session_id.encode()).split(':')[1]}.ckv"

    def _write_snapshot(self, session_id: str, tokens: list[int], state: bytes | None) -> None:
        path = self._snapshot_path(session_id)
        if path is None or not tokens:
            return
        try:
            payload = state if state is not None else self.backend.save_state()
            blob = encode_snapshot(
                namespace=session_id,
                model=self.model.digest,
                ctx=self.backend.context_config(),
                tokens=tokens,
                payload=payload,
                prefix=digest(array.array("i", tokens).tobytes()),
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, blob)
        except (OSError, BackendError) as e:  # the log is authoritative: a rebuild still works
            log.warning("could not write the KV snapshot of session %s: %s", session_id, e)

    def _read_snapshot(self, session_id: str) -> tuple[bytes, tuple[int, ...]] | None:
        """The session's snapshot from disk, None if there is none; SnapshotError if it is
        corrupt, truncated or made for another model or context (it is then deleted)."""
        path = self._snapshot_path(session_id)
        if path is None or not path.exists():
            return None
        try:
            snap = decode_snapshot(
                path.read_bytes(), model=self.model.digest, ctx=self.backend.context_config()
            )
            if snap.namespace != session_id:
                raise SnapshotError("the snapshot belongs to another session")
        except (OSError, SnapshotError) as e:
            path.unlink(missing_ok=True)
            raise SnapshotError(f"KV snapshot {path.name} rejected: {e}") from None
        return snap.payload, snap.tokens

    def _restore_from_disk(self, session: ChatSession) -> bool:
        """Bring back a session whose parked state left RAM, from its disk snapshot."""
        try:
            snap = self._read_snapshot(session.id)
            if snap is None or list(snap[1]) != session.resident:
                return False
            self.backend.load_state(snap[0], list(snap[1]))
        except (SnapshotError, BackendError) as e:
            self.backend.clear()
            session.pending_resets.append(
                Reset(ResetReason.RESTORE_FAILED, str(e), len(session.resident), -1)
            )
            session.resident = []
            return True  # reported; nothing more to add
        self.disk_restores += 1
        return True

    @property
    def parked_bytes(self) -> int:
        return self._parked_bytes
