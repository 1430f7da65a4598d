"""Per-request metrics and reset records (DESIGN.md §3.3, vocabulary §7).

Every request reports what it cost and what it reused; a rebuild of resident state is never
silent: it appears as a :class:`Reset` with one of the fixed reasons.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class ResetReason(enum.StrEnum):
    DIVERGENCE = "divergence"  # the wake prefix (system prompt) changed: rebuilt from scratch
    HIGH_WATER = "high_water"  # would cross the high-water mark: rebuilt from bounded history
    EVICTED = "evicted"  # resident KV was dropped (LRU eviction, process restart)
    RESTORE_FAILED = "restore_failed"  # a parked KV snapshot could not be restored
    MODEL_CHANGED = "model_changed"  # the session was created on another model file


@dataclass(frozen=True, slots=True)
class Reset:
    reason: ResetReason
    detail: str
    tokens_dropped: int
    tokens_rebuilt: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.reason.value,
            "detail": self.detail,
            "tokens_dropped": self.tokens_dropped,
            "tokens_rebuilt": self.tokens_rebuilt,
        }


@dataclass(frozen=True, slots=True)
class Compaction:
    """A turn that compacted: the ``messages`` leaving the window were summarised by the model
    into a continuity note of ``note_tokens`` tokens, prefilled after the wake prefix. What
    the summary cost: the prompt tokens it decoded (the conversation was resident, so only the
    request to summarise), the tokens it generated, and its wall time (inside ``ttft_ms``)."""

    messages: int
    note_tokens: int
    summary_evaluated: int
    summary_generated: int
    summary_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """What one request cost, in one vocabulary whatever served it: a turn of a session, a
    stateless request (a ``TokenOp``: chat, completions, Responses), a tool run.

    ``prompt_tokens`` is the prompt's length; ``prompt_tokens_evaluated`` counts every prompt
    token decoded for the request (the suffix, plus any rebuild or summary); ``tokens_reused``
    counts prompt tokens it did not decode thanks to reuse (resident KV kept, a copied or
    restored prefix, a stored reply: then every prompt token). ``reuse_known`` is False when a
    remote server did not say what it reused (``tokens_reused`` is then 0 and reported as
    ``unknown``). ``tokens_truncated`` counts resident tokens dropped at a divergence (an
    edited message).

    ``lookup_ms`` runs from the call to the end of the tiers' lookups (rendering included);
    ``ttft_ms`` from the call to the first sampled token; ``prefill_ms`` is the time spent
    inside llama.cpp decoding this request's prompt tokens (the raw floor; None where the
    path does not time it apart: a stateless request).

    ``context_used``, ``context_limit`` and ``high_water`` are those of the session's resident
    sequence after the turn, and ``wire_chars`` what its client sent (None for a stateless
    request, which keeps no sequence).

    Prefill on arrival and eager glue (``ChatSession.feed``/``commit``): ``fed_tokens`` were
    decoded while the message was still arriving and kept (they are part of
    ``tokens_reused``, not of ``prompt_tokens_evaluated``, which counts what was decoded after
    the end of input); ``eager_tokens_used`` / ``eager_tokens_discarded`` are the template
    tokens decoded ahead of this message while the session was idle that were kept, or
    truncated because the message turned out different (another role). For a fed message,
    ``ttft_ms`` runs from ``commit()``: from the end of input.

    ``hit_tier`` is the tier that served the request: a result tier (``memo``, ``semantic``,
    ``memory_graph``: nothing decoded, a stored reply), ``prefix_kv`` (resident KV was kept or
    copied), ``layer_kv`` (it came back from a snapshot), ``cold``, or ``tool`` (a tool ran);
    ``tiers`` holds what every tier consulted said, in pipeline order.
    """

    hit_tier: str = "cold"  # memo | semantic | memory_graph | prefix_kv | layer_kv | cold | tool
    prompt_tokens: int = 0
    prompt_tokens_evaluated: int = 0
    tokens_reused: int = 0
    reuse_known: bool = True
    tokens_truncated: int = 0
    completion_tokens: int = 0
    backend_called: bool = False
    lookup_ms: float = 0.0
    ttft_ms: float = 0.0
    prefill_ms: float | None = None
    total_ms: float = 0.0
    context_used: int | None = None
    context_limit: int | None = None
    high_water: int | None = None
    wire_chars: int | None = None
    resets: tuple[Reset, ...] = field(default_factory=tuple)
    fed_tokens: int = 0
    eager_tokens_used: int = 0
    eager_tokens_discarded: int = 0
    tiers: tuple[TierOutcome, ...] = ()
    compaction: Compaction | None = None  # the turn moved the window and summarised what left

    def tier(self, name: str) -> TierOutcome | None:
        """The outcome of tier ``name``, or None if it was not consulted."""
        return next((t for t in self.tiers if t.tier == name), None)

    def outcome_of(self, name: str) -> str:
        t = self.tier(name)
        return t.outcome if t is not None else ""

    def to_dict(self) -> dict[str, Any]:
        """Every field, as the server's ``usage.continuum`` and the event log show it: what
        the path does not know (None) left out, an unknown reuse as ``"unknown"``."""
        d = {k: v for k, v in asdict(self).items() if v is not None}
        d["resets"] = [r.to_dict() for r in self.resets]
        d["tiers"] = [t.to_dict() for t in self.tiers]
        if not self.reuse_known:
            d["tokens_reused"] = "unknown"
        return d


@dataclass(frozen=True, slots=True)
class TierOutcome:
    """What one tier said about one request (DESIGN.md §7 tier names).

    ``outcome`` is ``hit`` or the kind of miss the tier reports (``miss``, ``near_miss``,
    ``guard_rejected``, ``ineligible``, ``stale``, ``unverified``, ``skipped``); ``reason`` says
    why in words when that helps (``policy``, ``nondeterministic``, a snapshot error)."""

    tier: str
    outcome: str
    reason: str = ""
    score: float | None = None  # semantic: the best candidate's cosine
    tokens: int = 0  # KV tiers: prompt tokens the hit restored
    source: str = ""  # layer_kv: "ram" or "disk"
    surfaced: int = 0  # memory_graph: prior-run items surfaced as context (never a hit)
    rejected: int = 0  # layer_kv: snapshots found corrupt or incompatible (fell through)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", 0, None) or k == "outcome"}
