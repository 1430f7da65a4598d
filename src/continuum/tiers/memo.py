"""The memo tier: exact key -> stored result, O(1).

Serves a result only when the policy allows it: deterministic requests (temperature 0 or a fixed
seed) unless the policy opts into nondeterministic reuse (DESIGN.md §3.4). Entries carry the
memo *version* they were stored under; resuming a run bumps the version, so no entry stored
before the resume is served after it (§3.10). Bounded by ``capacity`` entries, LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from continuum.keys import OpKey
from continuum.metrics import TierOutcome
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss


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

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.version = 1
        self._entries: OrderedDict[OpKey, MemoEntry] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: OpKey) -> MemoEntry | None:
        entry = self._entries.get(key)
        if entry is None or entry.version != self.version:
            return None
        self._entries.move_to_end(key)
        return entry

    def put(self, entry: MemoEntry) -> None:
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
        return {
            "entries": len(self._entries),
            "evictions": self.evictions,
            "bytes": self.bytes_resident(),
            "version": self.version,
        }

    def bump_version(self) -> int:
        self.version += 1
        return self.version

    def entries(self) -> list[MemoEntry]:
        return list(self._entries.values())

    def bytes_resident(self) -> int:
        return sum(len(e.text.encode()) + 4 * len(e.tokens) for e in self._entries.values())
