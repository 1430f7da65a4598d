"""The context guard: reentrant for callers, callers before the step loop, given up while a
caller waits for a batched decode (at any depth) and taken back at the same depth."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from continuum.backends.context_guard import ContextGuard


def _in_thread(fn: object) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    t.start()
    return t


def test_reentrant_and_held_only_by_its_thread() -> None:
    g = ContextGuard()
    with g, g:
        assert g.held
        got: list[bool] = []
        _in_thread(lambda: got.append(g.acquire(blocking=False))).join()
        assert got == [False]  # another thread cannot take it
    assert not g.held
    got.clear()
    t = _in_thread(lambda: (got.append(g.acquire(blocking=False)), g.release()))
    t.join()
    assert got == [True]


def test_release_without_holding_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="does not hold"):
        ContextGuard().release()
    with pytest.raises(RuntimeError, match="needs the context guard held"):
        ContextGuard().wait_for(lambda: True)


def test_wait_gives_the_guard_up_at_any_depth_and_takes_it_back() -> None:
    g = ContextGuard()
    fut: Future[int] = Future()
    order: list[str] = []

    def other() -> None:
        with g:  # only possible while the first thread waits
            order.append("other")
        fut.set_result(7)

    with g, g, g:
        _in_thread(other)
        assert g.wait(fut) == 7
        order.append("back")
        assert g.held
        g.release()  # depth 3 restored: two more releases still hold it
        g.release()
        assert g.held
        g.acquire()
        g.acquire()
    assert order == ["other", "back"] and not g.held


def test_a_step_waits_for_callers_and_callers_waiting_go_first() -> None:
    g = ContextGuard()
    order: list[str] = []
    g.acquire()
    stepping = threading.Event()

    def step() -> None:
        stepping.set()
        with g.step():
            order.append("step")

    t = _in_thread(step)
    stepping.wait()
    time.sleep(0.05)
    assert order == []  # the caller holds it
    late = _in_thread(lambda: (g.acquire(), order.append("caller"), g.release()))
    time.sleep(0.05)
    g.release()
    late.join(5)
    t.join(5)
    assert order == ["caller", "step"]  # a caller that waited goes before the step


def test_wait_for_wakes_on_a_release_and_rechecks_under_the_guard() -> None:
    g = ContextGuard()
    state = {"free": False}

    def free_it() -> None:
        time.sleep(0.05)
        with g:
            state["free"] = True

    with g:
        t = _in_thread(free_it)
        g.wait_for(lambda: state["free"])
        assert g.held and state["free"]
    t.join()


def test_a_waiting_caller_that_fails_gives_nothing_back_twice() -> None:
    g = ContextGuard()
    fut: Future[int] = Future()
    fut.set_exception(ValueError("boom"))
    with g:
        with pytest.raises(ValueError, match="boom"):
            g.wait(fut)
        assert g.held
    assert not g.held


class _SlowFuture(Future[int]):
    """A future whose waiter wakes late (as a thread does that the GIL has not let run yet)."""

    def result(self, timeout: float | None = None) -> int:
        value = super().result(timeout)
        time.sleep(0.1)
        return value


@pytest.mark.parametrize("between", ["steps", "calls"])
def test_a_caller_whose_decode_a_step_finished_goes_before_the_next_call(between: str) -> None:
    """The step loop finishes a caller's future and at once asks for the next step (or, within
    the step, goes on to its next call): the caller (slow to wake) gets the guard back first,
    so the end of its reply does not wait for a whole step of another sequence."""
    g = ContextGuard()
    order: list[str] = []
    fut = _SlowFuture()
    waiting = threading.Event()

    def loop() -> None:
        waiting.wait()
        with g.step():
            fut.set_result(1)
            if between == "calls":
                g.let_callers_in()
                order.append("next")
        if between == "steps":
            with g.step():
                order.append("next")

    t = _in_thread(loop)
    with g:
        waiting.set()
        assert g.wait(fut) == 1
        order.append("caller")
    t.join(5)
    assert order == ["caller", "next"]


def test_a_cancelled_wait_leaves_no_claim_behind() -> None:
    """A future cancelled (a withdrawn decode) or failed still hands the guard back once: the
    step loop is not left waiting for a caller that is gone."""
    g = ContextGuard()
    for finish in (Future.cancel, lambda f: f.set_exception(ValueError("boom"))):
        fut: Future[int] = Future()
        with g:
            _in_thread(lambda fut=fut, finish=finish: (time.sleep(0.02), finish(fut)))
            with pytest.raises(Exception):  # noqa: B017 - CancelledError or ValueError
                g.wait(fut)
            assert g.held
        stepped = threading.Event()

        def step(stepped: threading.Event = stepped) -> None:
            with g.step():
                stepped.set()

        _in_thread(step)
        assert stepped.wait(2)  # nothing counted as waiting any more


def test_a_step_lets_waiting_callers_in_between_its_calls() -> None:
    """Inside a step, between two decode calls: a caller that came during the first call goes
    before the second; with nobody waiting (or outside a step) the step goes straight on."""
    g = ContextGuard()
    order: list[str] = []
    gave: list[bool] = []
    first_call = threading.Event()

    def loop() -> None:
        with g.step():
            gave.append(g.let_callers_in())  # nobody waits yet
            order.append("call 1")
            first_call.set()
            deadline = time.monotonic() + 5
            while not g.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            gave.append(g.let_callers_in())
            order.append("call 2")

    t = _in_thread(loop)
    first_call.wait(5)
    with g:
        order.append("caller")
    t.join(5)
    assert order == ["call 1", "caller", "call 2"] and gave == [False, True]
    with g:
        assert not g.let_callers_in()  # a caller holding it is not a step
