"""Residency: which session's sequence is in the context, and where the others' KV waits.

One session is *active*: its tokens are the worker's sequence. Switching parks the active
session's KV as a snapshot (``llama_state_seq_get_data``, a few milliseconds) in the snapshot
store — the same store layer KV uses, under one RAM budget (LRU, written back to disk when
pushed out) and one disk budget (least recently used files deleted) — and restores the next
one's (``set_data``). A snapshot is restored only for exactly the token sequence it was taken
from (DESIGN.md §3.5); a session whose snapshot is gone or rejected is rebuilt from the history
log, visibly (``evicted``, ``restore_failed``).
"""

from __future__ import annotations

import array
import logging
from typing import TYPE_CHECKING

from continuum.backends.base import SequenceView
from continuum.errors import BackendError, SnapshotError
from continuum.hashing import digest
from continuum.metrics import Reset, ResetReason
from continuum.stateful.hooks import ParkedIndex
from continuum.store.base import SnapshotEntry, SnapshotStore

if TYPE_CHECKING:
    from continuum.stateful.session import ChatSession

log = logging.getLogger(__name__)


def snapshot_key(session_id: str) -> str:
    return f"session:{session_id}"


class Residency:
    """The active session and the parked ones' snapshots (called under the worker's lock)."""

    def __init__(self, seq: SequenceView, model: str, store: SnapshotStore) -> None:
        self.seq = seq
        self.model = model
        self.store = store
        self.active: ChatSession | None = None
        self.parked: set[str] = set()  # session ids with a parked snapshot
        self.swaps = 0
        self.disk_restores = 0
        # set by an engine: parked snapshots become prefix entries for its stateless requests
        self.index: ParkedIndex | None = None

    def _ctx(self) -> dict[str, object]:
        return self.seq.backend.context_config()

    def _entry(self, session: ChatSession, tokens: list[int], payload: bytes) -> SnapshotEntry:
        return SnapshotEntry(
            session.tenant,
            tuple(tokens),
            payload,
            self.model,
            dict(self._ctx()),
            digest(array.array("i", tokens).tobytes()),
        )

    def park(self, session: ChatSession) -> None:
        """Snapshot the active sequence as ``session``'s parked state."""
        tokens = list(self.seq.tokens)
        session.resident = tokens
        if not tokens:
            return
        key = snapshot_key(session.id)
        payload = self.seq.save_state()
        self.store.put(key, self._entry(session, tokens, payload))
        self.parked.add(session.id)
        wake = session.transcript.wake
        if self.index is not None and wake and tuple(tokens[: len(wake)]) == tuple(wake):
            self.index.parked(session.tenant, key, tuple(wake), len(payload))

    def activate(self, session: ChatSession) -> None:
        """Make ``session``'s sequence the one in the context."""
        if self.active is session:
            return
        if self.active is not None:
            self.park(self.active)
        self.seq.clear()
        if session.resident:
            self._restore(session)
        session.resident = []
        self.active = session
        self.swaps += 1

    def _unpark(self, session_id: str) -> str:
        key = snapshot_key(session_id)
        self.parked.discard(session_id)
        if self.index is not None:
            self.index.unparked(key)
        return key

    def _restore(self, session: ChatSession) -> None:
        key = self._unpark(session.id)
        try:
            hit = self.store.get(key, model=self.model, ctx=dict(self._ctx()))
            if hit is None or list(hit.entry.tokens) != session.resident:
                session.pending_resets.append(
                    Reset(
                        ResetReason.EVICTED,
                        "the parked snapshot was evicted (snapshot budget)",
                        len(session.resident),
                        -1,
                    )
                )
                return
            self.seq.load_state(hit.entry.payload, hit.entry.tokens)
            session.restored_from = hit.source
            if hit.source == "disk":
                self.disk_restores += 1
        except (SnapshotError, BackendError) as e:
            self.seq.clear()
            session.pending_resets.append(
                Reset(ResetReason.RESTORE_FAILED, str(e), len(session.resident), -1)
            )
        finally:
            self.store.delete(key)  # live now: the parked copy is stale from the next decode

    def persist(self, session: ChatSession) -> None:
        """Make sure ``session``'s KV survives this process (closing it, or the worker)."""
        key = snapshot_key(session.id)
        try:
            if self.active is session:
                tokens = list(self.seq.tokens)
                if tokens:
                    entry = self._entry(session, tokens, self.seq.save_state())
                    self.store.put(key, entry, durable=True)
            elif session.id in self.parked:
                self.store.flush(key)
        except (OSError, BackendError) as e:  # the log is authoritative: a rebuild still works
            log.warning("could not keep the KV snapshot of session %s: %s", session.id, e)

    def read(self, session_id: str) -> tuple[bytes, tuple[int, ...]] | None:
        """A stored session's snapshot (reopen), None if there is none; SnapshotError if it is
        corrupt, truncated or made for another model or context (it is then deleted)."""
        hit = self.store.get(snapshot_key(session_id), model=self.model, ctx=dict(self._ctx()))
        if hit is None:
            return None
        return hit.entry.payload, hit.entry.tokens

    def forget(self, session_id: str) -> None:
        self.store.delete(self._unpark(session_id))
