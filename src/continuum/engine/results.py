"""What running an op returns: its result, its metrics with one outcome per tier, and the
running totals an engine keeps per namespace view."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from continuum.metrics import TierOutcome
from continuum.tiers.memory_graph import ContextItem


@dataclass(frozen=True, slots=True)
class OpMetrics:
    """What one op cost. ``hit_tier`` is the tier that served it (``cold``: no reuse,
    ``tool``: a tool run); ``tiers`` holds what every tier consulted said, in pipeline order."""

    hit_tier: str  # memo | semantic | memory_graph | prefix_kv | layer_kv | cold | tool
    prompt_tokens: int
    tokens_sent: int  # prompt tokens the backend evaluated for this op
    tokens_saved: int  # prompt tokens it did not evaluate thanks to reuse
    backend_called: bool
    lookup_ms: float
    ttft_ms: float
    total_ms: float
    tokens_saved_known: bool = True  # False: a remote server did not report cached tokens
    tiers: tuple[TierOutcome, ...] = ()

    def tier(self, name: str) -> TierOutcome | None:
        """The outcome of tier ``name``, or None if it was not consulted."""
        return next((t for t in self.tiers if t.tier == name), None)

    def outcome_of(self, name: str) -> str:
        t = self.tier(name)
        return t.outcome if t is not None else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "hit_tier": self.hit_tier,
            "prompt_tokens": self.prompt_tokens,
            "tokens_sent": self.tokens_sent,
            "tokens_saved": self.tokens_saved if self.tokens_saved_known else "unknown",
            "backend_called": self.backend_called,
            "lookup_ms": self.lookup_ms,
            "ttft_ms": self.ttft_ms,
            "total_ms": self.total_ms,
            "tiers": [t.to_dict() for t in self.tiers],
        }


@dataclass(frozen=True, slots=True)
class OpResult:
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    metrics: OpMetrics
    value: Any = None  # a ToolOp's return value
    surfaced: tuple[ContextItem, ...] = ()  # prior-run context from the memory graph


@dataclass
class SessionStats:
    ops: int = 0
    backend_calls: int = 0
    calls_eliminated: int = 0
    tokens_sent: int = 0
    tokens_saved: int = 0
    tool_runs: int = 0
    snapshot_errors: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    lookup_ms: list[float] = field(default_factory=list)

    def record(self, m: OpMetrics) -> None:
        self.ops += 1
        self.hits[m.hit_tier] += 1
        self.tokens_sent += m.tokens_sent
        self.tokens_saved += m.tokens_saved
        self.snapshot_errors += sum(t.rejected for t in m.tiers)
        if m.backend_called:
            self.backend_calls += 1
        elif m.hit_tier != "tool":
            self.calls_eliminated += 1
        if m.hit_tier == "tool":
            self.tool_runs += 1
        self.lookup_ms.append(m.lookup_ms)

    def hit_rate(self) -> float:
        model_ops = self.ops - self.hits["tool"]
        reused = sum(n for t, n in self.hits.items() if t not in ("cold", "tool"))
        return reused / model_ops if model_ops else 0.0
