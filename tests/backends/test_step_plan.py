"""The step planner's inter-token budget: the prompts that yield (a stateless request's) are
capped only while replies generate, by the measured cost of a generating call and of a prompt
token, never below the 8-token exact chunk; other prompts and the replies' tokens never are."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from continuum.backends.step_plan import PrefillShare, StepPlanner, check_itl_budget, protects
from continuum.errors import InvalidRequest


@dataclass(eq=False)
class R:
    pending: list[int] = field(default_factory=list)
    next_token: int | None = None
    tenant: str = ""
    steps: int = 0
    yields: bool = False
    context: int = 0
    started: float = 0.0


def test_no_budget_without_replies_generating_or_without_a_budget() -> None:
    p = StepPlanner(PrefillShare.OLDEST, 2.0)
    assert p.chunk_room(generating=False) is None
    assert StepPlanner(PrefillShare.OLDEST, None).chunk_room(generating=True) is None


def test_the_budget_starts_at_the_smallest_exact_chunk_then_follows_the_costs() -> None:
    p = StepPlanner(PrefillShare.OLDEST, 2.0)
    assert p.chunk_room(generating=True) == 8  # costs unknown yet
    p.timed(generated=4, prompt=0, ms=80.0)  # a call of replies' tokens alone: 80 ms
    p.timed(generated=0, prompt=16, ms=80.0)  # 5 ms a prompt token
    assert p.chunk_room(generating=True) == 16  # one more step's worth of time: 80 ms
    p.timed(generated=0, prompt=4, ms=400.0)  # a prompt's tail (< 8 tokens): not a chunk cost
    assert p.chunk_room(generating=True) == 16
    slow = StepPlanner(PrefillShare.OLDEST, 3.0)
    slow.timed(generated=1, prompt=0, ms=10.0)
    slow.timed(generated=0, prompt=8, ms=800.0)  # a slow prompt token: never below 8
    assert slow.chunk_room(generating=True) == 8


def test_only_the_prompts_that_yield_are_capped() -> None:
    p = StepPlanner(PrefillShare.OLDEST, 2.0)
    gen, short = R(next_token=7), R(pending=list(range(40)))
    op = R(pending=list(range(2000)), yields=True)
    items = p.plan([gen, short, op], room=512, chunks=16)
    got = {id(r): len(t) for r, t in items}
    assert got == {id(gen): 1, id(short): 40, id(op): 16}
    uncapped = {id(r): len(t) for r, t in p.plan([gen, short, op], room=512)}
    assert uncapped[id(op)] == 512 - 1 - 40
    session = R(pending=list(range(2000)))  # a session's prompt: the room left, first
    got = {id(r): len(t) for r, t in p.plan([gen, op, session], room=512, chunks=16)}
    assert got == {id(gen): 1, id(session): 511}  # nothing left for the op this step
    small_op = R(pending=list(range(100)), yields=True)  # fits the room, not the budget
    got = {id(r): len(t) for r, t in p.plan([gen, small_op], room=512, chunks=16)}
    assert got == {id(gen): 1, id(small_op): 16}
    assert p.plan([gen, small_op], room=512, chunks=4) == [(gen, [7])]  # below 8: waits


@pytest.mark.parametrize("bad", [0, 1.0, -2, True, "2", float("nan")])
def test_a_budget_below_one_and_a_half_steps_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="itl_budget"):
        check_itl_budget(bad)
    assert check_itl_budget(None) is None and check_itl_budget(3) == 3.0


def test_only_a_sessions_reply_holds_stateless_prompts_to_the_budget() -> None:
    session_gen, op_gen = R(next_token=7), R(next_token=9, yields=True)
    op_prompt = R(pending=list(range(300)), yields=True)
    assert protects([session_gen, op_prompt])
    assert protects([session_gen, op_gen, op_prompt])
    # stateless requests alone (agents with no session key): nobody to protect
    assert not protects([op_gen, op_prompt])
    assert not protects([R(pending=[1, 2, 3]), op_prompt])  # prompts only: nothing generates


def test_las_puts_the_least_served_program_first_whatever_its_tenant_or_age() -> None:
    """Least attained service: the prompt whose sequence held the fewest tokens goes first,
    for whole prompts and for chunks alike."""
    p = StepPlanner(PrefillShare.LAS, None)
    old_long = R(pending=list(range(300)), context=4000)  # an agent ten steps in, oldest
    young = R(pending=list(range(300)), context=200)  # an agent on its second step
    got = p.plan([old_long, young], room=400)
    assert [(id(r), len(t)) for r, t in got] == [(id(young), 300), (id(old_long), 100)]
    third = R(pending=list(range(300)), context=900)
    got = p.plan([old_long, third, young], room=400)  # chunks go by service too
    assert [(id(r), len(t)) for r, t in got] == [(id(young), 300), (id(third), 100)]
    oldest = StepPlanner(PrefillShare.OLDEST, None).plan([old_long, young], room=400)
    assert oldest[0][0] is old_long  # today's rule: the oldest first (equal lengths here)
    assert PrefillShare.parse("las") is PrefillShare.LAS


def test_age_puts_the_program_that_started_first_first_whatever_its_tenant_or_request() -> None:
    """Program age: the prompt of the session that started first goes first, for whole
    prompts and chunks alike, though its request came last and its tenant was served last."""
    p = StepPlanner(PrefillShare.AGE, None)
    p.served = {"a": 1, "b": 0}  # tenant b was served longest ago
    young = R(pending=list(range(300)), tenant="b", started=50.0, context=100)  # came first
    old = R(pending=list(range(300)), tenant="a", started=10.0, context=4000)
    got = p.plan([young, old], room=400)
    assert [(id(r), len(t)) for r, t in got] == [(id(old), 300), (id(young), 100)]
    older = R(pending=list(range(300)), started=5.0)
    got = p.plan([young, old, older], room=400)  # chunks go by age too
    assert [(id(r), len(t)) for r, t in got] == [(id(older), 300), (id(old), 100)]
    assert PrefillShare.parse("age") is PrefillShare.AGE
