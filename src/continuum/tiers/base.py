"""The ``Tier`` protocol: every tier answers one request with a typed ``Hit`` or ``Miss``.

A request walks the tiers in the engine's order and stops at the first hit (DESIGN.md §2).
*Result tiers* (memo, semantic, memory_graph) serve a stored :class:`TierResult`: no backend
call. *KV tiers* (prefix_kv, layer_kv) arrange the backend's working sequence to hold a reused
prefix: their ``Hit`` says how many tokens it holds, and the backend decodes only the rest.
After a call that no result tier served, the engine hands its result to every tier's
``record``. A tier never sees another tenant's entries: ``TierRequest.namespace`` is folded into
every key, root and query (§3.8), and every tier honours ``TierRequest.policy`` (§3.9).

Adding a tier is a module with a class that satisfies :class:`Tier`, plus one line where the
engine lists its tiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from continuum.keys import OpKey
from continuum.messages import Message
from continuum.metrics import TierOutcome
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy


@dataclass(frozen=True, slots=True)
class TierResult:
    """A stored result a result tier can serve: exactly what the backend produced for it."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class TierRequest:
    """One model call as the tiers see it: its canonical input and everything in its key.

    ``messages`` (chat) or ``prompt`` (completion) is the canonical input the ``tokens`` were
    made from. ``scratch`` lets a tier keep what its lookup computed (an embedding) for its own
    ``record`` of the same request; it is never shared between requests."""

    namespace: str
    key: OpKey
    op_name: str
    params: GenerationParams
    tokens: tuple[int, ...]
    policy: ReusePolicy
    backend: str
    model: str
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    scratch: dict[str, Any] = field(default_factory=dict)
    tools: tuple[dict[str, Any], ...] | None = None  # rendered into ``tokens``; canonical order

    def serve_blocked(self) -> str:
        """Why a stored result may not be served for this request ("" if it may)."""
        if not self.policy.enabled:
            return "policy"
        if len(self.tokens) < self.policy.min_len:
            return "below min_len"
        if not (self.params.deterministic or self.policy.nondeterministic):
            return "nondeterministic"
        return ""


@dataclass(frozen=True, slots=True)
class Hit:
    """The tier serves the request: a stored ``result`` (result tiers) or ``reused`` prompt
    tokens now held by the working sequence (KV tiers)."""

    outcome: TierOutcome
    result: TierResult | None = None
    reused: int = 0


@dataclass(frozen=True, slots=True)
class Miss:
    outcome: TierOutcome


@runtime_checkable
class Tier(Protocol):
    name: str

    def lookup(self, request: TierRequest) -> Hit | Miss: ...

    def record(self, request: TierRequest, result: TierResult) -> None: ...

    def stats(self) -> dict[str, Any]: ...


def miss(tier: str, outcome: str = "miss", reason: str = "", **fields: Any) -> Miss:
    return Miss(TierOutcome(tier, outcome, reason, **fields))


def first_hit(
    tiers: Sequence[Tier], request: TierRequest, outcomes: list[TierOutcome]
) -> Hit | None:
    """Walk ``tiers`` in order, appending each outcome; return the first hit, or None."""
    for tier in tiers:
        answer = tier.lookup(request)
        outcomes.append(answer.outcome)
        if isinstance(answer, Hit):
            return answer
    return None
