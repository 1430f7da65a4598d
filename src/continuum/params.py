"""Decode parameters: everything that changes a generated result, with validation at the edge.

They are part of every cache key (DESIGN.md §3.6): an omitted parameter is keyed by its default
value here, which is the backend's default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from continuum import constraints
from continuum.errors import InvalidRequest

MAX_STOP = 4  # stop strings per request, as OpenAI's API allows
MAX_STOP_CHARS = 256
MAX_WAIT_MS = 60_000  # the longest wait a timing setting may ask for


def check_ms(name: str, value: object, *, off: bool = False) -> None:
    """Refuse a timing setting ``name`` that is not a number of ms in 0..MAX_WAIT_MS (or, with
    ``off``, None), with a typed error naming it."""
    if value is None and off:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_WAIT_MS  # NaN fails too
    ):
        none = " (or None: off)" if off else ""
        raise InvalidRequest(
            f"{name} must be a number of ms in 0..{MAX_WAIT_MS}{none}, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How to generate a reply. Greedy (temperature 0) by default."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # the reply's required shape (:mod:`continuum.constraints`, canonical JSON), or free text
    constraint: str | None = None
    # end the reply where it starts a tool call it already made (the same name and arguments):
    # a repetition is degenerate, never a second call (:func:`continuum.toolcalls.repeated_call_at`)
    end_repeated_call: bool = False

    def validate(self) -> None:
        if (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise InvalidRequest(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise InvalidRequest(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequest(f"top_k must be an int >= 0, got {self.top_k!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        ):
            raise InvalidRequest(f"seed must be an int >= 0 or None, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequest("stop must be a tuple of non-empty strings")
        if len(self.stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise InvalidRequest(
                f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters "
                f"each (as OpenAI's API), got {len(self.stop)} of up to "
                f"{max(map(len, self.stop))}: every string is looked for after every token"
            )
        if not isinstance(self.end_repeated_call, bool):
            raise InvalidRequest(
                f"end_repeated_call must be true or false, got {self.end_repeated_call!r}"
            )
        if self.constraint is not None:
            if not isinstance(self.constraint, str):
                raise InvalidRequest("constraint must be a string from continuum.constraints")
            constraints.parse(self.constraint)

    @property
    def deterministic(self) -> bool:
        """Greedy, or sampled with a fixed seed: the same input gives the same output."""
        return self.temperature == 0 or self.seed is not None

    def key_fields(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["temperature"] = float(self.temperature)
        d["top_p"] = float(self.top_p)
        if self.constraint is None:  # free text: keyed as before constraints existed
            del d["constraint"]
        if not self.end_repeated_call:  # keyed as before the rule existed
            del d["end_repeated_call"]
        return d

    @classmethod
    def from_dict(cls, raw: object) -> GenerationParams:
        """Build from a request dict; an unknown parameter is an error, not silently ignored."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidRequest(f"params must be an object, got {type(raw).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidRequest(
                f"unknown decode parameter(s) {unknown}; known: {', '.join(sorted(known))}"
            )
        values = dict(raw)
        if "stop" in values:
            stop = values["stop"]
            values["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        p = cls(**values)
        p.validate()
        return p
