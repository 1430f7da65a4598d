"""What the semantic tier serves at first sight, learned from verified outcomes and held to δ.

In the verified mode (:class:`~continuum.tiers.semantic.SemanticTier` with ``delta``) nothing on
the request path asks a judge. A candidate is served at first sight only when its cosine is at
or above the threshold this object has learned; every other candidate that passed the guard is
answered cold and judged off the path (:mod:`continuum.tiers.semantic_promotion`), and each
judgment is an observation ``(cosine, accepted)`` here.

The pooled threshold (vCache's error bound, with a pooled estimate). For a cut ``t``, the
observations at or above it are the requests the tier would have served at ``t``; ``k`` of
those ``n`` were judged wrong. The estimated share of wrong hits is ``(k + 1) / (n + 2)`` (the
posterior mean under a uniform prior: with no wrong judgment yet it needs ``n >= 1/δ - 2``
observations before it serves anything). The threshold is the lowest observed cosine whose
estimate is ``<= δ``; until one exists the tier serves nothing at first sight.

Per entry (vCache's per-entry thresholds, in the direction that is safe to learn from a few
observations): an entry judged wrong for a request at cosine ``w`` is never served at first
sight to a request at or below ``w`` — its threshold is above both the pooled one and ``w``.

Exploration. A served candidate is never judged, so the observations above the threshold would
stop; every ``explore``-th candidate that would be served is answered cold and judged instead
(:meth:`Calibration.explores`), which keeps the estimate honest as traffic changes.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Any

from continuum.errors import InvalidRequest

DEFAULT_DELTA = 0.01
DEFAULT_EXPLORE = 10  # every 10th would-be first-sight hit is judged instead of served


def check_delta(delta: object) -> float:
    if (
        isinstance(delta, bool)
        or not isinstance(delta, (int, float))
        or not 0.0 < float(delta) <= 0.5
    ):
        raise InvalidRequest(
            f"delta is the largest acceptable share of wrong hits, in (0, 0.5]; got {delta!r} "
            "(0.01 means at most 1 in 100 served answers wrong)"
        )
    return float(delta)


class Calibration:
    """The pooled δ-bounded threshold and the per-entry floors (see the module docstring).
    Thread-safe: the promotion worker observes while request threads read."""

    def __init__(self, delta: float = DEFAULT_DELTA, *, explore: int = DEFAULT_EXPLORE) -> None:
        self.delta = check_delta(delta)
        if isinstance(explore, bool) or not isinstance(explore, int) or explore < 0:
            raise InvalidRequest(f"explore is every n-th would-be hit (0: never), got {explore!r}")
        self.explore = explore
        self._scores: list[float] = []  # every observation's cosine, sorted
        self._wrong: list[float] = []  # the cosines of the observations judged wrong, sorted
        self._floor: dict[int, float] = {}  # entry id -> the highest cosine it was judged wrong at
        self._threshold: float | None = None
        self._would_serve = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._scores)

    def observe(self, entry_id: int, score: float, correct: bool) -> None:
        """One judgment: the entry ``entry_id`` was (``correct``) or was not a correct answer
        for a request at cosine ``score``."""
        with self._lock:
            bisect.insort(self._scores, score)
            if not correct:
                bisect.insort(self._wrong, score)
                self._floor[entry_id] = max(score, self._floor.get(entry_id, -1.0))
            self._threshold = self._pooled()

    def forget(self, entry_id: int) -> None:
        with self._lock:
            self._floor.pop(entry_id, None)

    def _pooled(self) -> float | None:
        n_all = len(self._scores)
        for i, t in enumerate(self._scores):
            if i and self._scores[i - 1] == t:
                continue  # the cut at a repeated cosine takes all of its observations
            n = n_all - i
            k = len(self._wrong) - bisect.bisect_left(self._wrong, t)
            if (k + 1) / (n + 2) <= self.delta:
                return t
        return None

    def threshold(self, entry_id: int | None = None) -> float | None:
        """The lowest cosine at which ``entry_id`` is served at first sight; None: not yet."""
        with self._lock:
            pooled = self._threshold
            floor = self._floor.get(entry_id) if entry_id is not None else None
        if pooled is None or floor is None or floor < pooled:
            return pooled
        return math.nextafter(floor, math.inf)

    def explores(self) -> bool:
        """Whether this would-be hit is judged instead (every ``explore``-th)."""
        if not self.explore:
            return False
        with self._lock:
            self._would_serve += 1
            return self._would_serve % self.explore == 0

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "delta": self.delta,
                "observations": len(self._scores),
                "judged_wrong": len(self._wrong),
                "threshold": self._threshold,
                "entries_with_floor": len(self._floor),
            }
