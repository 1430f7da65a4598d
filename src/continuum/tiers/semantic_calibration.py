"""What the semantic tier serves at first sight, learned from verified outcomes and held to δ.

In the verified mode (:class:`~continuum.tiers.semantic.SemanticTier` with ``delta``) nothing on
the request path asks a judge. A candidate is served at first sight only when its cosine is at
or above the threshold this object has learned for it; every other candidate that passed the
guard is answered cold and judged off the path (:mod:`continuum.tiers.semantic_promotion`), and
each judgment is an observation ``(entry, cosine, accepted)`` here.

The pooled threshold (vCache's error bound, with a pooled estimate). For a cut ``t``, the
observations at or above it are the requests the tier would have served at ``t``; ``k`` of
those ``n`` were judged wrong. The estimated share of wrong hits is ``(k + 1) / (n + 2)`` (the
posterior mean under a uniform prior: with no wrong judgment yet it needs ``n >= 1/δ - 2``
observations before it serves anything). The threshold is the lowest observed cosine whose
estimate is ``<= δ``; until one exists the tier serves nothing at first sight.

Per entry (vCache's per-entry thresholds). Judgments are kept per *answer*: an entry promoted to
serve another's answer joins that entry's group (:meth:`Calibration.join`), so every request
judged against any wording of one answer teaches the same threshold. Once a group holds
``MIN_FIT`` observations with both verdicts among them, :func:`entry_threshold` fits the
logistic model vCache uses, ``P(right | cosine s) = 1 / (1 + exp(-γ (s - t)))``, and the group
is served from the lowest cosine whose estimated share of wrong answers is ``<= δ`` with ``t``
taken at its one-sided 95% upper bound. That threshold replaces the pooled one for the group:
it can be lower (a group whose wordings are judged alike early) or higher. The fit is a
maximum a posteriori estimate with a Gaussian prior (``PRIOR_SD``), which keeps the slope
finite when the verdicts separate perfectly — the common case with a few observations; the
prior is the assumption that a group's boundary is no sharper than about 0.05 of cosine
between 50% and 99% right. And always: a group judged wrong for a request at cosine ``w`` is
never served at first sight to a request at or below ``w``.

Exploration. A served candidate is never judged, so the observations above the threshold would
stop; every ``explore``-th candidate that would be served is answered cold and judged instead
(:meth:`Calibration.explores`), which keeps the estimates honest as traffic changes.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from continuum.errors import InvalidRequest

DEFAULT_DELTA = 0.01
DEFAULT_EXPLORE = 10  # every 10th would-be first-sight hit is judged instead of served
MIN_FIT = 6  # a group's observations (both verdicts among them) before its own fit is used
KEEP = 200  # a group fits its latest observations: bounded work, and it follows drift
UPPER_Z = 1.645  # the one-sided 95% bound on a group's boundary t
# prior standard deviations of the logit's intercept (at the group's mean cosine) and slope
PRIOR_SD = np.array([10.0, 100.0])


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


def _log_posterior(theta: np.ndarray, x: np.ndarray, y: np.ndarray, prec: np.ndarray) -> float:
    z = x @ theta
    return float(np.sum(y * z - np.logaddexp(0.0, z)) - 0.5 * theta @ prec @ theta)


def _map_fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Newton's method with step halving on the (concave) log posterior: the estimate and the
    Laplace approximation of its covariance."""
    prec = np.diag(1.0 / PRIOR_SD**2)
    theta = np.zeros(2)
    value = _log_posterior(theta, x, y, prec)
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        hess = x.T @ (x * (p * (1.0 - p))[:, None]) + prec
        step = np.linalg.solve(hess, x.T @ (y - p) - prec @ theta)
        scale = 1.0
        while (new := _log_posterior(theta + scale * step, x, y, prec)) < value and scale > 1e-6:
            scale /= 2
        theta, value = theta + scale * step, new
        if np.abs(scale * step).max() < 1e-9:
            break
    p = 1.0 / (1.0 + np.exp(-(x @ theta)))
    return theta, np.linalg.inv(x.T @ (x * (p * (1.0 - p))[:, None]) + prec)


def entry_threshold(observations: Sequence[tuple[float, bool]], delta: float) -> float | None:
    """The lowest cosine at which a group is served within ``delta`` by its own logistic fit
    (see the module docstring); None: too few observations, one verdict only, or verdicts that
    do not improve with similarity."""
    if len(observations) < MIN_FIT:
        return None
    s = np.array([o[0] for o in observations], dtype=float)
    y = np.array([float(o[1]) for o in observations])
    if y.min() == y.max():
        return None
    centre = float(s.mean())
    (alpha, gamma), cov = _map_fit(np.column_stack([np.ones_like(s), s - centre]), y)
    if gamma <= 0:
        return None
    t = centre - alpha / gamma
    grad = np.array([-1.0 / gamma, alpha / gamma**2])  # of t = centre - alpha / gamma
    t_upper = t + UPPER_Z * math.sqrt(max(float(grad @ cov @ grad), 0.0))
    return float(t_upper + math.log((1.0 - delta) / delta) / gamma)


class Calibration:
    """The pooled δ-bounded threshold, the groups' own thresholds and floors (see the module
    docstring). Thread-safe: the promotion worker observes while request threads read."""

    def __init__(self, delta: float = DEFAULT_DELTA, *, explore: int = DEFAULT_EXPLORE) -> None:
        self.delta = check_delta(delta)
        if isinstance(explore, bool) or not isinstance(explore, int) or explore < 0:
            raise InvalidRequest(f"explore is every n-th would-be hit (0: never), got {explore!r}")
        self.explore = explore
        self._scores: list[float] = []  # every observation's cosine, sorted
        self._wrong: list[float] = []  # the cosines of the observations judged wrong, sorted
        self._group: dict[int, int] = {}  # a promoted entry -> the entry whose answer it serves
        self._members: dict[int, set[int]] = {}  # a group that was joined -> its live entries
        self._seen: dict[int, list[tuple[float, bool]]] = {}  # a group -> its observations
        self._own: dict[int, float] = {}  # a group -> its fitted threshold
        self._floor: dict[int, float] = {}  # a group -> the highest cosine judged wrong at
        self._threshold: float | None = None
        self._would_serve = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._scores)

    def observe(self, entry_id: int, score: float, correct: bool) -> None:
        """One judgment: the entry ``entry_id`` was (``correct``) or was not a correct answer
        for a request at cosine ``score``."""
        with self._lock:
            group = self._group.get(entry_id, entry_id)
            bisect.insort(self._scores, score)
            if not correct:
                bisect.insort(self._wrong, score)
                self._floor[group] = max(score, self._floor.get(group, -1.0))
            self._threshold = self._pooled()
            seen = self._seen.setdefault(group, [])
            seen.append((score, correct))
            del seen[:-KEEP]
            own = entry_threshold(seen, self.delta)
            if own is None:
                self._own.pop(group, None)
            else:
                self._own[group] = own

    def join(self, entry_id: int, anchor_id: int) -> None:
        """``entry_id`` now serves ``anchor_id``'s answer: it learns and is served as that
        answer's group."""
        with self._lock:
            group = self._group.get(anchor_id, anchor_id)
            if entry_id != group:
                self._group[entry_id] = group
                self._members.setdefault(group, {group}).add(entry_id)

    def forget(self, entry_id: int) -> None:
        """The entry is gone; its group's observations go with the group's last entry."""
        with self._lock:
            group = self._group.pop(entry_id, entry_id)
            members = self._members.get(group)
            if members is not None:
                members.discard(entry_id)
                if members:
                    return
                del self._members[group]
            self._seen.pop(group, None)
            self._own.pop(group, None)
            self._floor.pop(group, None)

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
            group = self._group.get(entry_id, entry_id) if entry_id is not None else None
            own = self._own.get(group) if group is not None else None
            base = own if own is not None else self._threshold
            floor = self._floor.get(group) if group is not None else None
        if base is None or floor is None or floor < base:
            return base
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
            own = sorted(self._own.values())
            return {
                "delta": self.delta,
                "observations": len(self._scores),
                "judged_wrong": len(self._wrong),
                "threshold": self._threshold,
                "entries_with_floor": len(self._floor),
                "groups_observed": len(self._seen),
                "groups_fitted": len(own),
                "group_threshold_median": own[len(own) // 2] if own else None,
            }
