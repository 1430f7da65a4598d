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

import enum
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile, Progress, resolve_model
from continuum.errors import BackendError, InvalidRequest, SessionClosed
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
    rebuild_reserve_tokens: int = 256  # room left for a reply when rebuilding on reopen

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
        self._sessions: dict[str, ChatSession] = {}
        self._active: ChatSession | None = None
        self._parked: OrderedDict[str, _Parked] = OrderedDict()
        self._parked_bytes = 0
        self._state = _State.OPEN
        self.swaps = 0
        self.evictions = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._state is _State.CLOSED:
                return
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
                config={"n_ctx": self.backend.n_ctx, "high_water": hw},
                session_id=session_id,
            )
            self._sessions[session.id] = session
            return session

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
            self._activate(session)
            session._rebuild(reason, detail, self.config.rebuild_reserve_tokens)
            self._sessions[session.id] = session
            return session

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def _release(self, session: ChatSession) -> None:
        with self._lock:
            self._sessions.pop(session.id, None)
            self._drop_parked(session.id)
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
            if session.resident:
                session.pending_resets.append(
                    Reset(
                        ResetReason.EVICTED,
                        "the parked snapshot was evicted (park budget)",
                        len(session.resident),
                        -1,
                    )
                )
            self.backend.clear()
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
            log.info("evicted parked session %s (%d bytes)", sid, len(old.state))

    def _drop_parked(self, session_id: str) -> _Parked | None:
        parked = self._parked.pop(session_id, None)
        if parked is not None:
            self._parked_bytes -= len(parked.state)
        return parked

    @property
    def parked_bytes(self) -> int:
        return self._parked_bytes
