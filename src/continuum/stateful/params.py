"""What a stateful turn returns (decode parameters live in :mod:`continuum.params`)."""

from __future__ import annotations

from dataclasses import dataclass

from continuum.metrics import TurnMetrics
from continuum.params import GenerationParams
from continuum.toolcalls import ToolCall

__all__ = ["GenerationParams", "TurnResult"]


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn's reply and what it cost. ``tokens`` are the generated ids, exactly as they
    stay resident (the end-of-generation token excluded)."""

    turn: int
    text: str
    tokens: tuple[int, ...]
    finish_reason: str  # "stop" (end of turn or a stop string) | "length"
    metrics: TurnMetrics
    calls: tuple[ToolCall, ...] | None = None  # the reply's tool calls (None: not parsed)
