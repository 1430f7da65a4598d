"""The memo tier: exact key -> stored result, O(1).

Serves a result only when the policy allows it: deterministic requests (temperature 0 or a fixed
seed) unless the policy opts into nondeterministic reuse (DESIGN.md §3.4). Entries carry the
memo *version* they were stored under; resuming a run bumps the version, so no entry stored
before the resume is served after it (§3.10). Bounded by ``capacity`` entries, LRU.

With a ``shared`` store (Redis), every entry is also written there and a local miss looks
there, so one process's results serve the others; the version is the shared one. A shared store
that cannot be reached degrades the tier to its RAM copy, with a warning, never an error.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from continuum.errors import StoreError
from continuum.keys import OpKey
from continuum.metrics import TierOutcome
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss

log = logging.getLogger(__name__)


class SharedResults(Protocol):
    """Where a memo tier shares its entries
    (:class:`~continuum.store.redis_results.RedisResultStore`)."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, record: dict[str, Any]) -> None: ...

    def version(self) -> int: ...

    def bump(self, above: int) -> int: ...


@dataclass(frozen=True, slots=True)
class MemoEntry:
    key: OpKey
    version: int
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int


class MemoTier:
    name = "memo"

    def __init__(self, capacity: int = 10_000, *, shared: SharedResults | None = None) -> None:
        self.capacity = capacity
        self.version = 1
        self._entries: OrderedDict[OpKey, MemoEntry] = OrderedDict()
        self.evictions = 0
        self.shared = shared
        self.shared_hits = 0  # entries another process stored
        self.shared_errors = 0
        if shared is not None:
            self.version = self._shared(shared.version, 1)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: OpKey) -> MemoEntry | None:
        entry = self._entries.get(key)
        if entry is None and self.shared is not None:
            entry = self._from_shared(key)
        if entry is None or entry.version != self.version:
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, entry: MemoEntry) -> None:
        if self.shared is not None:
            record = {k: v for k, v in asdict(entry).items() if k != "key"}
            self._shared(lambda: self.shared.put(entry.key, record), None)
        self._keep(entry)

    def _from_shared(self, key: OpKey) -> MemoEntry | None:
        assert self.shared is not None
        record = self._shared(lambda: self.shared.get(key), None)
        if record is None or record.get("version") != self.version:
            return None
        try:
            entry = MemoEntry(key=key, **{**record, "tokens": tuple(record["tokens"])})
        except (TypeError, KeyError):
            log.warning("ignored a malformed shared memo record under %s", key)
            return None
        self.shared_hits += 1
        self._keep(entry)
        return entry

    def _shared(self, call: Any, fallback: Any) -> Any:
        """One call to the shared store; unreachable: the fallback, logged and counted."""
        try:
            return call()
        except StoreError as e:
            self.shared_errors += 1
            log.warning("memo tier: shared store failed (%s); serving from this process only", e)
            return fallback

    def _keep(self, entry: MemoEntry) -> None:
        self._entries[entry.key] = entry
        self._entries.move_to_end(entry.key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evictions += 1

    # -- the Tier protocol ---------------------------------------------------------------------
    def lookup(self, request: TierRequest) -> Hit | Miss:
        blocked = request.serve_blocked()
        if blocked:
            return miss(self.name, "skipped", blocked)
        entry = self.get(request.key)
        if entry is None:
            return miss(self.name)
        result = TierResult(entry.text, entry.tokens, entry.finish_reason, entry.prompt_tokens)
        return Hit(TierOutcome(self.name, "hit"), result)

    def record(self, request: TierRequest, result: TierResult) -> None:
        if request.policy.enabled:
            self.put(
                MemoEntry(
                    request.key,
                    self.version,
                    result.text,
                    result.tokens,
                    result.finish_reason,
                    result.prompt_tokens,
                )
            )

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "entries": len(self._entries),
            "evictions": self.evictions,
            "bytes": self.bytes_resident(),
            "version": self.version,
        }
        if self.shared is not None:
            out |= {"shared_hits": self.shared_hits, "shared_errors": self.shared_errors}
        return out

    def bump_version(self, at_least: int = 0) -> int:
        """Move to a version no entry was stored under (above ``at_least``, a resumed run's
        saved version); shared, every process moves there."""
        want = max(self.version, at_least)
        if self.shared is not None:
            want = self._shared(lambda: self.shared.bump(want), want + 1)
        else:
            want += 1
        self.version = want
        return self.version

    def entries(self) -> list[MemoEntry]:
        return list(self._entries.values())

    def bytes_resident(self) -> int:
        return sum(len(e.text.encode()) + 4 * len(e.tokens) for e in self._entries.values())
