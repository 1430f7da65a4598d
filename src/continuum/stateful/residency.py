"""Residency: which sessions' sequences are in the context, and where the others' KV waits.

The worker's context has one or more *lanes* (resident sequences). A session in a lane is
*active*: its tokens are that lane's sequence. Making another session active parks a lane's
session — the least recently used lane that no turn holds, preferring one with no work pending
(no message arriving, no glue to decode) — as a snapshot (``llama_state_seq_get_data``, a
few milliseconds) in the snapshot store — the same store layer KV uses, under one RAM budget
(LRU, written back to disk when pushed out) and one disk budget (least recently used files
deleted) — and restores the next one's (``set_data``). A snapshot is restored only for exactly
the token sequence it was taken from (DESIGN.md §3.5); a session whose snapshot is gone or
rejected is rebuilt from the history log, visibly (``evicted``, ``restore_failed``).
"""

from __future__ import annotations

import array
import logging
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from continuum.backends.base import SequenceView
from continuum.backends.exactness import exact_reuse
from continuum.errors import BackendError, SnapshotError
from continuum.hashing import digest
from continuum.metrics import Reset, ResetReason
from continuum.stateful.hooks import IndexedPrefix, ParkedIndex
from continuum.stateful.kv_space import (
    KVSpace,
    Lane,
    LaneRequest,
    ResidentSession,
    held_by_another_op,
)
from continuum.stateful.park_price import Price, ReloadCosts
from continuum.stateful.plan import common_prefix
from continuum.store.base import SnapshotEntry, SnapshotStore

log = logging.getLogger(__name__)


def snapshot_key(session_id: str) -> str:
    return f"session:{session_id}"


class Borrowed(NamedTuple):
    """Prompt tokens sessions took from another sequence of their tenant instead of decoding
    them: KV copied from a lane, and loaded from a snapshot no lane held."""

    from_lanes: int
    from_snapshots: int


BORROW_MIN = 32  # fewer shared tokens are decoded: a copy of a whole sequence costs more


class Residency:
    """The lanes' sessions and the parked ones' snapshots (called under the worker's lock)."""

    def __init__(
        self,
        lanes: Sequence[SequenceView],
        model: str,
        store: SnapshotStore,
        *,
        exact: bool = False,
        priced: bool = True,
    ) -> None:
        """``exact``: share between lanes, and offer stateless requests, only KV a cold decode
        would have given (:mod:`continuum.backends.exactness`), leaving 8 tokens or more to
        decode after it. ``priced``: the session parked for a lane is the cheapest to bring
        back per second of lane it frees (:mod:`continuum.stateful.park_price`); False: the
        least recently used."""
        self.costs = ReloadCosts()  # what bringing a parked session back costs, measured
        # every choice of what gives way
        self.space = KVSpace(lanes, self.price if priced else None)
        self.exact = exact
        self.lanes = self.space.lanes
        self.seq = self.lanes[0].seq  # the first lane's (the only one, by default)
        self.model = model
        self.store = store
        self.parked: set[str] = set()  # session ids with a parked snapshot
        self.swaps = 0
        self.disk_restores = 0
        self.borrowed = 0  # tokens copied from another lane instead of decoded (borrow)
        self.borrowed_parked = 0  # of those, tokens loaded from a snapshot no lane holds
        self.prefetched = {"lane": 0, "ram": 0}  # parked sessions brought back ahead of a turn
        # set by an engine: parked snapshots become prefix entries for its stateless requests,
        # and a new session whose wake no lane holds starts from its entries
        self.index: ParkedIndex | None = None
        # set by the worker: room for the calling thread's lane to grow to N tokens
        self.reserve: Callable[[int], None] | None = None

    @property
    def active(self) -> ResidentSession | None:
        """The first lane's session (the active one, on a worker with one lane)."""
        return self.lanes[0].session

    def lane_for(self, session: ResidentSession, waited_s: float = 0.0) -> Lane | None:
        """A lane to make ``session`` active in (:meth:`KVSpace.allocate`): its own, a free
        one, else the one to park; None while every lane is held (or, until the turn has
        waited ``PATIENCE_S``, held or protected)."""
        want = LaneRequest(session.tenant, session=session, waited_s=waited_s)
        got = self.space.allocate(want)
        return None if got is None else got.lane

    def price(self, lane: Lane) -> Price:
        """What parking ``lane``'s session costs (:mod:`continuum.stateful.park_price`): its
        snapshot lands in RAM while the budget has room for it, else on disk."""
        s = lane.session
        assert s is not None
        tokens = len(lane.seq.tokens)
        nbytes = tokens * (self.costs.bytes_per_token or 0.0)
        budget = getattr(self.store, "ram_budget_bytes", None)
        where = "ram"
        if budget is not None and self.store.stats().ram_bytes + nbytes > budget:
            where = "disk"
        remaining = s.pauses.remaining_s(time.monotonic())
        return Price(self.costs.reload_ms(tokens, where), remaining)

    def borrow(self, session: ResidentSession, tokens: Sequence[int]) -> int:
        """Give ``session``'s lane the longest prefix of ``tokens`` that another lane of its
        tenant holds (a KV copy, :meth:`SequenceView.copy_from`: milliseconds), when that is at
        least ``BORROW_MIN`` tokens more than the lane holds itself; return how many of
        ``tokens`` the lane now holds. Sessions that start alike (every session of one agent:
        its instructions and tools) decode what they share once. A lane that holds nothing of
        ``tokens`` (a new session) also looks in the tenant's :class:`ParkedIndex`: a parked
        sibling's snapshot, or what a stateless request left, when it serves more than any
        lane (:meth:`_load_indexed`). Another tenant's KV is never a source (tenants are
        partitioned before any lookup)."""
        lane, tenant, tokens = session.lane, session.tenant, list(tokens)  # lists compare
        assert lane is not None, "borrow() for a session in a lane"
        if self.exact:  # copy only exact KV, and leave a whole batch to decode after it
            tokens = tokens[: exact_reuse(len(tokens), len(tokens))]
        own = common_prefix(lane.seq.tokens, tokens)
        if self.exact:
            own = min(own, lane.seq.exact)
        best, source = own, None
        for other in self.lanes:
            if other is lane or other.tenant != tenant:
                continue
            n = common_prefix(other.seq.tokens, tokens)
            if self.exact:
                n = min(n, other.seq.exact)
            if n > best:
                best, source = n, other
        indexed = self._indexed(tenant, tokens, best) if own == 0 else None
        if indexed is not None and (got := self._load_indexed(lane, tenant, indexed)):
            return got
        if source is None or best - own < BORROW_MIN:
            return own
        lane.seq.copy_from(source.seq, best)
        self.borrowed += best - own
        return best

    def _indexed(self, tenant: str, tokens: list[int], beyond: int) -> IndexedPrefix | None:
        """The tenant's indexed snapshot serving the most of ``tokens``, when that is more
        than ``beyond`` (what a lane serves) and at least ``BORROW_MIN``."""
        found = self.index.prefix_snapshot(tenant, tokens) if self.index is not None else None
        if found is None:
            return None
        n = min(found.length, len(tokens))
        return (
            IndexedPrefix(found.key, found.prefix, n) if n >= max(beyond + 1, BORROW_MIN) else None
        )

    def _load_indexed(self, lane: Lane, tenant: str, found: IndexedPrefix) -> int:
        """Load the snapshot ``found`` names into ``lane`` and keep the prefix it serves (the
        snapshot stays where it is: read, never taken). 0, the lane cleared and the index told
        to forget it, when it is gone, corrupt or made by another model or context."""
        assert self.index is not None
        try:
            hit = self.store.get(found.key, model=self.model, ctx=dict(self._ctx()))
            if hit is None:
                raise SnapshotError("the snapshot is gone")
            held = hit.entry.tokens
            if hit.entry.namespace != tenant or tuple(held[: len(found.prefix)]) != found.prefix:
                raise SnapshotError("the snapshot holds another prefix")
            if self.reserve is not None:
                self.reserve(len(held))
            lane.seq.load_state(hit.entry.payload, held, found.length if self.exact else 0)
            lane.seq.truncate(found.length)
        except (SnapshotError, BackendError) as e:
            log.info("indexed snapshot %s not borrowed: %s", found.key, e)
            lane.seq.clear()
            self.index.reject(tenant, found)
            return 0
        self.borrowed += found.length
        self.borrowed_parked += found.length
        return found.length

    def prefill_from(self, session: ResidentSession, full: list[int], decode_from: int) -> int:
        """Where a turn of ``session`` whose prompt is ``full`` starts its prefill:
        ``decode_from`` (its lane truncated there), or further on where another session of the
        tenant holds more of ``full`` (:meth:`borrow`): a new session of an agent whose
        sessions open alike (Codex's instructions, environment and tools, beyond the system
        prompt its wake shared) decodes only what is its own. The last token is always decoded:
        its logits start the reply."""
        assert session.lane is not None, "prefill_from() for a session in a lane"
        session.lane.seq.truncate(decode_from)
        if len(full) - 1 - decode_from < BORROW_MIN:
            return decode_from
        return max(decode_from, self.borrow(session, full if self.exact else full[:-1]))

    def live_prefixes(self, namespace: str) -> list[tuple[int, int]]:
        """The active sessions of ``namespace`` as prefix-KV candidates: each one's sequence
        and how many of its first tokens (the wake prefix) were decoded as whole prompt
        batches; and the lanes whose last op was the tenant's, with that op's prompt."""
        out = []
        for lane in self.lanes:
            s = lane.session
            # an op's prompt and reply, left in the lane (not while another op may cut it)
            left = s is None and lane.left_by == namespace and lane.exact
            if left and not held_by_another_op(lane):
                out.append((lane.seq.seq, lane.exact))
            if s is not None and s.tenant == namespace and (n := self._reusable(lane)):
                out.append((lane.seq.seq, n))
        return out

    def _reusable(self, lane: Lane | None) -> int:
        """How many of the first tokens of a session's lane others may start from: its wake
        prefix (decoded as whole prompt batches), or with ``exact`` its exact tokens."""
        s = lane.session if lane is not None else None
        if lane is None or s is None:
            return 0
        if self.exact:
            return lane.seq.exact
        wake = s.transcript.wake
        if wake is None or lane.seq.tokens[: len(wake)] != list(wake):
            return 0
        return len(wake)

    def _ctx(self) -> dict[str, object]:
        return self.seq.backend.context_config()

    def _entry(self, session: ResidentSession, tokens: list[int], payload: bytes) -> SnapshotEntry:
        return SnapshotEntry(
            session.tenant,
            tuple(tokens),
            payload,
            self.model,
            dict(self._ctx()),
            digest(array.array("i", tokens).tobytes()),
        )

    def park(self, session: ResidentSession) -> None:
        """Snapshot ``session``'s lane as its parked state; the lane keeps the tokens until
        :meth:`evict` (or the next activation) clears it."""
        assert session.lane is not None
        seq = session.lane.seq
        tokens = list(seq.tokens)
        session.resident, session.resident_exact = tokens, seq.exact
        if not tokens:
            return
        key = snapshot_key(session.id)
        t0 = time.perf_counter()
        payload = seq.save_state()
        self.store.put(key, self._entry(session, tokens, payload))
        self.costs.parked(len(tokens), len(payload), (time.perf_counter() - t0) * 1000)
        self.parked.add(session.id)
        prefix = self._reusable(session.lane)
        if self.index is not None and prefix:
            self.index.parked(session.tenant, key, tuple(tokens[:prefix]), len(payload))

    def evict(self, lane: Lane) -> None:
        """Park the lane's session (if any) and free its sequence."""
        if lane.session is not None:
            self.park(lane.session)
            lane.session.lane = None
            lane.session = None
        lane.seq.clear()
        lane.left_by, lane.exact = None, 0

    def activate(self, session: ResidentSession, lane: Lane) -> None:
        """Make ``session`` the one in ``lane`` (see :meth:`lane_for`)."""
        lane.used = time.monotonic()
        if lane.session is session:
            return
        self.evict(lane)
        lane.session, session.lane = session, lane
        session.bind(lane.seq)
        if session.resident:
            self._restore(session)
        session.resident = []
        self.swaps += 1

    def prefetch(self, session: ResidentSession) -> str:
        """A parked session's next request is arriving (its headers are in, its body is being
        read): bring its KV nearer before the turn asks. Into a free lane when one is free (no
        session is parked for it: this is a guess), else its snapshot from disk into the RAM
        budget. Returns what was done: "lane", "ram", or "" (nothing to do)."""
        if session.lane is not None or not session.resident:
            return ""
        got = self.space.allocate(LaneRequest(session.tenant, session=session))
        # lanes of their own streams only: one shared lane would make room by evicting
        if len(self.lanes) > 1 and got is not None and got.parks is None:
            self.activate(session, got.lane)
            self.prefetched["lane"] += 1
            return "lane"
        key = snapshot_key(session.id)
        peek = getattr(self.store, "peek", None)
        if peek is None or peek(key) is not None:
            return ""  # already in RAM (or a store with no RAM tier of its own)
        try:
            hit = self.store.get(key, model=self.model, ctx=dict(self._ctx()))
        except SnapshotError as e:  # deleted by the store: the turn rebuilds, visibly
            self._unpark(session.id)
            session.pending_resets.append(
                Reset(ResetReason.RESTORE_FAILED, str(e), len(session.resident), -1)
            )
            session.resident = []
            return ""
        if hit is None:
            return ""
        self.prefetched["ram"] += 1
        return "ram"

    def leave(self, session: ResidentSession) -> None:
        """``session`` leaves its lane without a snapshot (closed, deleted, failed to wake)."""
        lane = session.lane
        if lane is not None:
            lane.session, session.lane = None, None
            lane.seq.clear()
            lane.left_by, lane.exact = None, 0

    def _unpark(self, session_id: str) -> str:
        key = snapshot_key(session_id)
        self.parked.discard(session_id)
        if self.index is not None:
            self.index.unparked(key)
        return key

    def _restore(self, session: ResidentSession) -> None:
        assert session.lane is not None
        seq = session.lane.seq
        key = self._unpark(session.id)
        try:
            t0 = time.perf_counter()  # a disk read is inside get()
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
            seq.load_state(hit.entry.payload, hit.entry.tokens, session.resident_exact)
            ms = (time.perf_counter() - t0) * 1000
            self.costs.restored(len(hit.entry.payload), ms, hit.source)
            session.restored_from = hit.source
            if hit.source == "disk":
                self.disk_restores += 1
        except (SnapshotError, BackendError) as e:
            seq.clear()
            session.pending_resets.append(
                Reset(ResetReason.RESTORE_FAILED, str(e), len(session.resident), -1)
            )
        finally:
            self.store.delete(key)  # live now: the parked copy is stale from the next decode

    def persist(self, session: ResidentSession) -> None:
        """Make sure ``session``'s KV survives this process (closing it, or the worker)."""
        key = snapshot_key(session.id)
        try:
            if session.lane is not None:
                seq = session.lane.seq
                tokens = list(seq.tokens)
                if tokens:
                    entry = self._entry(session, tokens, seq.save_state())
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
