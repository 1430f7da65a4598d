"""Per-turn metrics and reset records (DESIGN.md §3.3, vocabulary §6).

Every turn reports what it cost and what it reused; a rebuild of resident state is never
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


@dataclass(frozen=True, slots=True)
class TurnMetrics:
    """What one turn cost.

    ``prompt_tokens_evaluated`` counts every prompt token decoded during the turn (the suffix,
    plus any rebuild); ``tokens_reused`` counts resident tokens kept from before the turn;
    ``tokens_truncated`` counts resident tokens dropped at a divergence (an edited message).
    ``ttft_ms`` runs from the call to the first sampled token; ``prefill_ms`` is the time spent
    inside llama.cpp decoding the prompt tokens of this turn (the raw floor).

    Prefill on arrival and eager glue (``ChatSession.feed``/``commit``): ``fed_tokens`` were
    decoded while the message was still arriving and kept (they are part of
    ``tokens_reused``, not of ``prompt_tokens_evaluated``, which counts what was decoded after
    the end of input); ``eager_tokens_used`` / ``eager_tokens_discarded`` are the template
    tokens decoded ahead of this message while the session was idle that were kept, or
    truncated because the message turned out different (another role). For a fed message,
    ``ttft_ms`` runs from ``commit()``: from the end of input.

    ``hit_tier`` is the tier that served the turn: a result tier (``memo``, ``semantic``,
    ``memory_graph``: nothing decoded, the stored reply committed), ``prefix_kv`` (the resident
    sequence was kept), ``layer_kv`` (it came back from a parked snapshot) or ``cold``.
    """

    prompt_tokens_evaluated: int
    tokens_reused: int
    tokens_truncated: int
    completion_tokens: int
    ttft_ms: float
    prefill_ms: float
    total_ms: float
    context_used: int
    context_limit: int
    high_water: int
    wire_chars: int
    resets: tuple[Reset, ...] = field(default_factory=tuple)
    fed_tokens: int = 0
    eager_tokens_used: int = 0
    eager_tokens_discarded: int = 0
    hit_tier: str = "cold"  # memo | semantic | memory_graph | prefix_kv | layer_kv | cold
    tiers: tuple[TierOutcome, ...] = ()  # what each tier consulted said, in pipeline order
    compaction: Compaction | None = None  # the turn moved the window and summarised what left

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["resets"] = [r.to_dict() for r in self.resets]
        d["tiers"] = [t.to_dict() for t in self.tiers]
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
