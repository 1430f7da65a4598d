"""The seam between a session turn and the reuse stack above it.

A turn renders its canonical prompt, then asks its worker's :class:`TurnTiers` (the engine, which
owns the result tiers: memo, semantic, memory graph) whether a stored reply answers exactly
that prompt. If one does, nothing is decoded and the stored reply is committed as the turn's
reply; otherwise the turn decodes its suffix and generates, and hands the reply to ``record``.
This package defines the seam so it never imports the tiers (layers point down, DESIGN.md §2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from continuum.messages import Message
from continuum.metrics import TierOutcome
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy


@dataclass(frozen=True, slots=True)
class TurnQuery:
    """What a turn asks: its tenant, the window as the model sees it, the canonical prompt
    tokens (generation prompt included) and the decode parameters."""

    namespace: str
    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    params: GenerationParams
    policy: ReusePolicy


@dataclass(frozen=True, slots=True)
class StoredReply:
    tier: str
    text: str
    tokens: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True, slots=True)
class TurnLookup:
    """The result tiers' answer: a stored reply (or None) and what each tier said. ``request``
    is the tiers' own handle for ``record``; opaque here."""

    reply: StoredReply | None
    outcomes: tuple[TierOutcome, ...]
    request: Any = None


class TurnTiers(Protocol):
    def lookup(self, query: TurnQuery) -> TurnLookup: ...

    def record(
        self, lookup: TurnLookup, text: str, tokens: tuple[int, ...], finish: str
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class IndexedPrefix:
    """A snapshot of the index that serves the first ``length`` tokens asked for: it is stored
    under ``key`` (the one snapshot store) and indexed by ``prefix``, which it holds first."""

    key: str
    prefix: tuple[int, ...]
    length: int


class ParkedIndex(Protocol):
    """One prefix index over a tenant's sequences that no lane holds (the engine's layer KV
    tier): parked sessions are announced in it, beside the snapshots of what stateless
    requests left. A stateless request of the same tenant that starts with a parked session's
    wake prefix can restore its snapshot and keep those tokens, and so can a new session
    (:meth:`~continuum.stateful.residency.Residency.borrow`). ``prefix`` is the wake prefix —
    the tokens decoded as whole prompt batches, so reusing them is exact — and the snapshot
    under ``key`` holds it followed by the rest of the conversation."""

    def parked(self, namespace: str, key: str, prefix: tuple[int, ...], nbytes: int) -> None: ...

    def unparked(self, key: str) -> None: ...

    def prefix_snapshot(self, namespace: str, tokens: Sequence[int]) -> IndexedPrefix | None:
        """The snapshot of ``namespace`` that serves the longest prefix of ``tokens``."""
        ...

    def reject(self, namespace: str, found: IndexedPrefix) -> None:
        """``found`` could not be loaded (gone, corrupt, made elsewhere): forget it."""
        ...
