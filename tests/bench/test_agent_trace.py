"""The seeded trace of ``bench agents-paused``: the same for every server, shaped as stated."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum.bench.agent_trace import TraceShape, make_trace, tool_output
from continuum.errors import InvalidRequest


def test_one_seed_one_trace_another_seed_another() -> None:
    assert make_trace(8, seed=3) == make_trace(8, seed=3)
    assert make_trace(8, seed=3) != make_trace(8, seed=4)
    # more agents add agents: the first ones' calls stay as they were (only arrivals spread)
    assert [a.steps for a in make_trace(4)] == [a.steps for a in make_trace(8)[:4]]


def test_the_pauses_follow_the_stated_distribution() -> None:
    """A log-normal with the given median and 90th percentile (drawn over many agents)."""
    pauses = [s.pause_s for a in make_trace(2000) for s in a.steps if s.pause_s]
    assert statistics.median(pauses) == pytest.approx(2.0, rel=0.1)
    over = sum(p > 20.0 for p in pauses) / len(pauses)
    assert over == pytest.approx(0.10, abs=0.015)
    shape = TraceShape(pause_median_s=0.5, pause_p90_s=3.0)
    assert shape.sigma == pytest.approx(math.log(6.0) / 1.2815515655446004)


@given(
    agents=st.integers(1, 40),
    steps=st.tuples(st.integers(1, 6), st.integers(0, 6)).map(lambda t: (t[0], t[0] + t[1])),
    tokens=st.tuples(st.integers(1, 500), st.integers(0, 500)).map(lambda t: (t[0], sum(t))),
    stagger=st.floats(0, 30),
    seed=st.integers(0, 10_000),
)
@settings(max_examples=60, deadline=None)
def test_every_agent_keeps_to_the_shape(
    agents: int, steps: tuple[int, int], tokens: tuple[int, int], stagger: float, seed: int
) -> None:
    shape = TraceShape(steps=steps, result_tokens=tokens, stagger_s=stagger)
    trace = make_trace(agents, shape, seed)
    assert [a.agent for a in trace] == list(range(agents))
    assert [a.start_s for a in trace] == sorted(a.start_s for a in trace)
    assert all(0 <= a.start_s <= stagger for a in trace)
    for a in trace:
        assert steps[0] <= len(a.steps) <= steps[1]
        first, *rest = a.steps
        assert first.result_tokens == 0  # the first call sends the task
        assert all(tokens[0] <= s.result_tokens <= tokens[1] for s in rest)
        assert a.steps[-1].pause_s == 0 and all(s.pause_s > 0 for s in a.steps[:-1])
        assert a.paused_s == pytest.approx(sum(s.pause_s for s in a.steps))


def test_tool_outputs_are_deterministic_and_grow_with_their_size() -> None:
    assert tool_output(3, 2, 500) == tool_output(3, 2, 500)
    assert tool_output(3, 2, 500) != tool_output(4, 2, 500)  # agents' outputs differ
    for step in (2, 3):  # a test log, a source file
        assert len(tool_output(0, step, 2000)) > 5 * len(tool_output(0, step, 200))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"steps": (0, 3)}, "steps"),
        ({"steps": (5, 2)}, "steps"),
        ({"result_tokens": (0, 10)}, "result_tokens"),
        ({"result_tokens": (10, 9)}, "result_tokens"),
        ({"pause_median_s": 0.0}, "median"),
        ({"pause_median_s": 5.0, "pause_p90_s": 2.0}, "90th"),
        ({"stagger_s": -1.0}, "stagger_s"),
    ],
)
def test_a_bad_shape_is_a_typed_error_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        TraceShape(**kwargs)


def test_no_agents_is_a_typed_error() -> None:
    with pytest.raises(InvalidRequest, match="agents"):
        make_trace(0)
