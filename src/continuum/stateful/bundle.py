"""Moving a session between workers as one bundle: :func:`export_session` and
:func:`import_session` (the wire format is :mod:`continuum.store.bundle_format`).

Export reads the session's record, current messages, turns and resets from the history log
and, when one can be taken, its KV: an open session is parked first, the way a draining worker
parks it (:meth:`~continuum.stateful.residency.Residency.persist`: its lane's state, once no
turn holds the lane), and the snapshot store's entry goes into the bundle with its envelope. A
session that is not open here sends the snapshot stored for it, if there is one; none is made
for it (that would cost a whole prefill on the exporting worker).

Import refuses, before anything is written, a bundle that is corrupt, in an unknown format,
made on another model, or owned by another tenant than the importer's: a bundle is never
re-owned, so an import cannot move a conversation across a tenant boundary, whoever holds the
bytes (DESIGN.md §3.8). Then, in order:

1. the history is written in one step (the store's ``import_session``: all of it or nothing;
   :class:`~continuum.errors.SessionExists` if the id is taken);
2. the KV snapshot is registered when this worker can load it — same model digest, same
   llama.cpp build, cache types and context config, the key of this session, and a prefix hash
   that is the hash of its tokens — and dropped otherwise;
3. the session is opened: from the snapshot with no prefill, else rebuilt from the history,
   visibly — ``restore_failed`` naming why the snapshot was dropped, or ``evicted`` when the
   bundle carried none. A snapshot's tokens are only ever used up to where they match the
   history's canonical tokens (:meth:`ChatSession.rebuild`).

If opening fails (a context too small for the history, say), the imported session is deleted
again: nothing is left half-imported.
"""

from __future__ import annotations

import array
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from continuum.errors import (
    BundleModelMismatch,
    BundleTenantMismatch,
    SessionExists,
    SnapshotError,
)
from continuum.hashing import digest
from continuum.metrics import ResetReason
from continuum.stateful.residency import snapshot_key
from continuum.stateful.session import ChatSession
from continuum.store.base import SnapshotEntry
from continuum.store.bundle_format import Bundle, decode_bundle, encode_bundle
from continuum.store.snapshot_format import decode_entry, encode_entry

if TYPE_CHECKING:
    from continuum.stateful.worker import Worker

log = logging.getLogger(__name__)

KVOutcome = Literal["restored", "dropped", "none"]


@dataclass(frozen=True, slots=True)
class ImportedSession:
    """An imported session, open on this worker, and what became of the bundle's KV:
    ``restored`` (no prefill), ``dropped`` (``detail`` says why; rebuilt from the history) or
    ``none`` (the bundle carried no snapshot; rebuilt from the history)."""

    session: ChatSession
    kv: KVOutcome
    detail: str = ""


def _ctx(worker: Worker) -> dict[str, object]:
    return dict(worker.seq.backend.context_config())


def export_session(worker: Worker, session_id: str, *, kv: bool = True) -> bytes:
    """The bundle of a stored session (:class:`~continuum.errors.SessionNotFound` if there is
    none); with ``kv`` (the default) its KV snapshot too, when one can be taken."""
    with worker.guard:
        worker.wait_opening(session_id)
        snapshot = _snapshot(worker, session_id) if kv else None
        rec = worker.store.load_session(session_id)
        turns = tuple(worker.store.turns(session_id))
        bundle = Bundle(
            dataclasses.replace(rec, turns=len(turns)),  # one view, even if a turn landed
            tuple(worker.store.messages(session_id)),
            turns,
            tuple(worker.store.resets(session_id)),
            snapshot,
            time.time(),
        )
    return encode_bundle(bundle)


def _snapshot(worker: Worker, session_id: str) -> bytes | None:
    """The session's KV as a snapshot file: an open one parked first (as drain does); None if
    no snapshot can be had."""
    key = snapshot_key(session_id)
    if session_id in worker.sessions():
        session = worker.open_session(session_id)  # the open one (rebuilt if moved on elsewhere)
        worker.guard.wait_for(lambda: session.lane is None or session.lane.holder is None)
        worker.residency.persist(session)
    try:
        hit = worker.snapshots.get(key, model=worker.model.digest, ctx=_ctx(worker))
    except SnapshotError as e:  # the history alone still moves the session
        log.warning("session %s is exported without its KV: %s", session_id, e)
        return None
    return None if hit is None else encode_entry(key, hit.entry)


def import_session(
    worker: Worker, data: bytes | Bundle, *, tenant: str | None = None
) -> ImportedSession:
    """Create the session a bundle (its bytes, or as :func:`decode_bundle` read them) holds on
    ``worker``'s store, with the same id, and open it (see the module docstring). ``tenant``:
    the importer's, which must be the bundle's (None: the bundle's own, for a trusted caller of
    the library)."""
    bundle = data if isinstance(data, Bundle) else decode_bundle(data)
    rec = bundle.record
    if tenant is not None and rec.tenant != tenant:
        raise BundleTenantMismatch(tenant)
    if rec.model_digest != worker.model.digest:
        raise BundleModelMismatch(rec.model_digest, worker.model.digest)
    entry, problem = _loadable(worker, bundle)
    key = snapshot_key(rec.id)
    with worker.guard:
        worker.wait_opening(rec.id)
        if rec.id in worker.sessions():  # open here though gone from the store: still taken
            raise SessionExists(rec.id)
        worker.store.import_session(rec, bundle.messages, bundle.turns, bundle.resets)
        try:
            if entry is not None:
                worker.snapshots.put(key, entry, durable=True)
            else:
                worker.snapshots.delete(key)  # nothing of an older session of this id
            session = worker.open_session(rec.id)
        except BaseException:
            try:
                worker.delete_session(rec.id)
            except Exception:  # the caller hears of the first failure, the log of this one
                log.exception("could not delete the half-imported session %s", rec.id)
            raise
    if entry is None:
        if problem is None:
            return ImportedSession(session, "none")
        _report_dropped(session, problem)
        return ImportedSession(session, "dropped", problem)
    failed = [r for r in session.pending_resets if r.reason is ResetReason.RESTORE_FAILED]
    if failed:  # llama.cpp refused the state after all: rebuilt, and the reset says so
        worker.snapshots.delete(key)  # it would be refused again at every reopen
        return ImportedSession(session, "dropped", failed[-1].detail)
    return ImportedSession(session, "restored")


def _loadable(worker: Worker, bundle: Bundle) -> tuple[SnapshotEntry | None, str | None]:
    """The bundle's KV as an entry this worker can restore, else None and why not."""
    if bundle.snapshot is None:
        return None, None
    key = snapshot_key(bundle.record.id)
    try:
        entry = decode_entry(bundle.snapshot, key, model=worker.model.digest, ctx=_ctx(worker))
    except SnapshotError as e:
        return None, str(e)
    if entry.prefix_hash != digest(array.array("i", entry.tokens).tobytes()):
        return None, "the snapshot's prefix hash is not the hash of its tokens"
    return dataclasses.replace(entry, namespace=bundle.record.tenant), None


def _report_dropped(session: ChatSession, problem: str) -> None:
    """The reopen's reset says the imported snapshot was refused, and why (DESIGN.md §3.3)."""
    detail = f"the imported KV snapshot was not loaded ({problem}); rebuilt from the history"
    session.pending_resets = [
        dataclasses.replace(r, reason=ResetReason.RESTORE_FAILED, detail=detail)
        if r.reason is ResetReason.EVICTED
        else r
        for r in session.pending_resets
    ]


__all__ = ["ImportedSession", "export_session", "import_session"]
