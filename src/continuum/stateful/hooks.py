"""The seam between a session turn and the reuse stack above it.

A turn renders its canonical prompt, then asks its worker's :class:`TurnTiers` (the engine, which
owns the result tiers: memo, semantic, memory graph) whether a stored reply answers exactly
that prompt. If one does, nothing is decoded and the stored reply is committed as the turn's
reply; otherwise the turn decodes its suffix and generates, and hands the reply to ``record``.
This package defines the seam so it never imports the tiers (layers point down, DESIGN.md §2).
"""

from __future__ import annotations

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


class ParkedIndex(Protocol):
    """Where parked sessions are announced as prefix entries (the engine's layer KV tier): a
    stateless request of the same tenant that starts with a parked session's wake prefix can
    restore its snapshot and keep those tokens. ``prefix`` is the wake prefix — the tokens
    decoded as whole prompt batches, so reusing them is exact — and the snapshot under ``key``
    holds it followed by the rest of the conversation."""

    def parked(self, namespace: str, key: str, prefix: tuple[int, ...], nbytes: int) -> None: ...

    def unparked(self, key: str) -> None: ...
