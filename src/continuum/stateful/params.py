"""Decode parameters of a turn and what a turn returns."""

from __future__ import annotations

from dataclasses import dataclass

from continuum.backends.llamacpp import SamplingParams
from continuum.errors import InvalidRequest
from continuum.metrics import TurnMetrics


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How to generate a reply. Greedy (temperature 0) by default."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def validate(self) -> None:
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or (self.max_tokens < 1)
        ):
            raise InvalidRequest(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise InvalidRequest(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequest("stop must be a tuple of non-empty strings")
        self.sampling().validate()

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn's reply and what it cost. ``tokens`` are the generated ids, exactly as they
    stay resident (the end-of-generation token excluded)."""

    turn: int
    text: str
    tokens: tuple[int, ...]
    finish_reason: str  # "stop" (end of turn or a stop string) | "length"
    metrics: TurnMetrics
