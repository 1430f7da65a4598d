"""``ReusePolicy``: one switch, respected by every tier (DESIGN.md §3.9).

``never()`` bypasses every tier: the backend sees exactly what it would see without continuum
(no canonicalisation, no cached state). ``threshold(min_len=N)`` reuses a prefix only when it is
at least N canonical tokens long, and serves whole results (memo) only for inputs at least that
long. ``always()`` reuses whenever a tier matches. Memo results are served only for
deterministic requests unless ``nondeterministic=True`` opts in (§3.4).
"""

from __future__ import annotations

from dataclasses import dataclass

from continuum.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ReusePolicy:
    enabled: bool = True
    min_len: int = 0
    nondeterministic: bool = False

    @classmethod
    def always(cls, *, nondeterministic: bool = False) -> ReusePolicy:
        return cls(True, 0, nondeterministic)

    @classmethod
    def never(cls) -> ReusePolicy:
        return cls(False, 0, False)

    @classmethod
    def threshold(cls, min_len: int, *, nondeterministic: bool = False) -> ReusePolicy:
        if isinstance(min_len, bool) or not isinstance(min_len, int) or min_len < 0:
            raise InvalidRequest(f"min_len must be an int >= 0, got {min_len!r}")
        return cls(True, min_len, nondeterministic)

    def allows_prefix(self, length: int) -> bool:
        return self.enabled and length > 0 and length >= self.min_len

    def allows_result(self, input_len: int, deterministic: bool) -> bool:
        if not self.enabled or input_len < self.min_len:
            return False
        return deterministic or self.nondeterministic

    def describe(self) -> str:
        if not self.enabled:
            return "never"
        return "always" if self.min_len == 0 else f"threshold(min_len={self.min_len})"
