"""The verified semantic tier's calibration: a threshold learned from judged outcomes within an
error bound delta, each answer group's own logistic fit, floors, exploration, and the bad values
it refuses."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum import InvalidRequest
from continuum.tiers.semantic_calibration import (
    MIN_FIT,
    Calibration,
    check_delta,
    entry_threshold,
)


@pytest.mark.parametrize("delta", [0, 0.0, -0.1, 0.51, 1.0, math.nan, math.inf, "0.1", True, None])
def test_a_delta_outside_the_bound_is_refused(delta: object) -> None:
    with pytest.raises(InvalidRequest, match=r"delta .*\(0, 0\.5\]"):
        check_delta(delta)
    with pytest.raises(InvalidRequest):
        Calibration(delta)  # type: ignore[arg-type]


@pytest.mark.parametrize("explore", [-1, 1.5, "2", True])
def test_a_bad_exploration_rate_is_refused(explore: object) -> None:
    with pytest.raises(InvalidRequest, match="explore"):
        Calibration(0.1, explore=explore)  # type: ignore[arg-type]


def test_nothing_is_served_until_enough_judgments_agree() -> None:
    c = Calibration(0.1)  # (k + 1) / (n + 2) <= 0.1 with k = 0 needs n >= 8
    assert c.threshold() is None
    for i in range(7):
        c.observe(i, 0.9 + i / 100, True)
    assert c.threshold() is None and c.threshold(3) is None
    c.observe(7, 0.85, True)
    assert c.threshold() == 0.85 and len(c) == 8


def test_a_wrong_judgment_raises_the_threshold_and_the_entry_floor() -> None:
    c = Calibration(0.1)
    for i in range(20):
        c.observe(i, 0.80 + i / 100, True)  # 0.80 .. 0.99
    assert c.threshold() == 0.80
    c.observe(100, 0.95, False)  # one wrong at 0.95: 21 at >= 0.80 with k = 1: 2/23 <= 0.1
    assert c.threshold() == 0.80
    c.observe(100, 0.97, False)  # k = 2 at >= 0.80: 3/24 > 0.1, and no cut is within it
    assert c.threshold() is None and c.threshold(5) is None  # the tier stops serving
    for i in range(20):
        c.observe(200 + i, 0.985, True)
    assert c.threshold() == 0.80  # 3/44 <= 0.1: the two wrongs are diluted again
    floor = c.threshold(100)  # but the entry judged wrong twice is not served at <= 0.97
    assert floor is not None and floor > 0.97
    d = c.as_dict()
    assert d["observations"] == 42 and d["judged_wrong"] == 2 and d["entries_with_floor"] == 1


def test_an_entry_judged_wrong_is_not_served_at_or_below_that_cosine() -> None:
    c = Calibration(0.2)
    for i in range(10):
        c.observe(i, 0.7, True)
    c.observe(42, 0.9, False)  # k = 1 of n = 11 at >= 0.7: 2/13 <= 0.2
    assert c.threshold() == 0.7
    floor = c.threshold(42)
    assert floor is not None and floor > 0.9  # this entry: only above where it was wrong
    assert c.threshold(7) == 0.7  # the others keep the pooled threshold
    c.forget(42)
    assert c.threshold(42) == 0.7


def test_every_nth_would_be_hit_is_explored() -> None:
    c = Calibration(0.1, explore=3)
    assert [c.explores() for _ in range(7)] == [False, False, True, False, False, True, False]
    assert not any(Calibration(0.1, explore=0).explores() for _ in range(5))


@given(
    st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), max_size=60),
    st.sampled_from([0.05, 0.1, 0.25, 0.5]),
)
def test_the_threshold_is_the_lowest_cut_within_delta(
    observations: list[tuple[float, bool]], delta: float
) -> None:
    c = Calibration(delta)
    for i, (score, right) in enumerate(observations):
        c.observe(i, score, right)

    def within(t: float) -> bool:
        above = [right for s, right in observations if s >= t]
        return (above.count(False) + 1) / (len(above) + 2) <= delta

    good = sorted({s for s, _ in observations if within(s)})
    assert c.threshold() == (good[0] if good else None)


# -- per group: the logistic fit ---------------------------------------------------------------
SEPARATED = [(0.70, False), (0.74, False), (0.78, False)] + [
    (0.84 + i / 100, True) for i in range(9)
]


def test_a_group_needs_enough_observations_and_both_verdicts() -> None:
    assert entry_threshold(SEPARATED[: MIN_FIT - 1], 0.05) is None
    assert entry_threshold([(0.8 + i / 100, True) for i in range(12)], 0.05) is None
    assert entry_threshold([(0.8 + i / 100, False) for i in range(12)], 0.05) is None
    # verdicts that get worse with similarity: no boundary to learn
    assert entry_threshold([(s, not right) for s, right in SEPARATED], 0.05) is None


def test_a_separated_group_is_served_above_its_last_wrong_and_tighter_with_more_evidence() -> None:
    t = entry_threshold(SEPARATED, 0.05)
    assert t is not None and 0.78 < t < 1.0
    strict = entry_threshold(SEPARATED, 0.01)
    assert strict is not None and strict > t  # a smaller delta: a higher threshold
    more = SEPARATED + [(0.80 + i / 200, True) for i in range(8)] + [(0.76, False)]
    tighter = entry_threshold(more, 0.05)
    assert tighter is not None and tighter < t  # right answers closer to the boundary


def test_a_fitted_group_is_served_where_the_pooled_threshold_serves_nothing() -> None:
    c = Calibration(0.05, explore=0)
    for score, right in SEPARATED:
        c.observe(1, score, right)
    for i in range(5):
        c.observe(2, 0.95, i % 2 == 0)  # another group, five observations: no fit
    assert c.threshold() is None  # pooled: 5 wrong of 17, far from 5%
    assert c.threshold(2) is None
    own = c.threshold(1)
    assert own is not None and own == entry_threshold(SEPARATED, 0.05)
    d = c.as_dict()
    assert d["groups_fitted"] == 1 and d["groups_observed"] == 2
    assert d["group_threshold_median"] == own


def test_a_promoted_entry_learns_and_is_served_as_its_anchors_group() -> None:
    c = Calibration(0.05, explore=0)
    c.join(10, 1)  # entry 10 serves entry 1's answer
    c.join(11, 10)  # and 11 serves 10's: the same answer, the same group
    for i, (score, right) in enumerate(SEPARATED):
        c.observe((1, 10, 11)[i % 3], score, right)
    t = c.threshold(1)
    assert t is not None and c.threshold(10) == t == c.threshold(11)
    assert c.as_dict()["groups_observed"] == 1
    c.forget(1)  # the anchor is evicted: its wordings still serve, with what was learned
    assert c.threshold(10) == t == c.threshold(11)
    c.forget(10)
    c.forget(11)  # the last wording gone: so is the group
    assert c.as_dict()["groups_observed"] == 0 and c.threshold(11) is None


def test_on_a_group_that_follows_the_model_served_answers_stay_within_delta() -> None:
    """A stream near one answer whose right share follows the logistic model (boundary 0.8,
    slope 60): what is served at first sight is wrong at most about delta of the time, and
    most requests above the boundary are served once the group has learned."""
    rng = random.Random(3)
    delta = 0.05
    c = Calibration(delta, explore=10)
    served, wrong, above = 0, 0, 0
    for _ in range(1500):
        s = rng.uniform(0.6, 1.0)
        right = rng.random() < 1 / (1 + math.exp(-60 * (s - 0.8)))
        t = c.threshold(1)
        if t is not None and s >= t and not c.explores():
            served += 1
            wrong += not right
        else:
            c.observe(1, s, right)
        above += s >= 0.9
    assert served > above // 2  # the group serves (its threshold came down below 0.9)
    assert wrong / served <= delta
