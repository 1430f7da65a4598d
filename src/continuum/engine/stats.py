"""The running totals an engine keeps per namespace view (:class:`~continuum.engine.Session`):
the sums of its requests' :class:`~continuum.metrics.Metrics`. ``tokens_sent`` and
``tokens_saved`` are seed 003's names for the totals of ``prompt_tokens_evaluated`` and
``tokens_reused``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from continuum.metrics import Metrics


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

    def record(self, m: Metrics) -> None:
        self.ops += 1
        self.hits[m.hit_tier] += 1
        self.tokens_sent += m.prompt_tokens_evaluated
        self.tokens_saved += m.tokens_reused
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
