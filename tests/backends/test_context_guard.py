"""The context guard: reentrant for callers, callers before the step loop, given up while a
caller waits for a batched decode (at any depth) and taken back at the same depth; with a loop
attached, the callers' commands applied on the loop's thread, between its steps."""

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


class _Loop:
    """A step loop in miniature: it attaches to the guard, steps while asked to, and applies
    the callers' commands wherever it waits (its idle wait, the guard in ``step()``)."""

    def __init__(self, g: ContextGuard) -> None:
        self.g, self.cond, self.steps, self.stop = g, threading.Condition(), 0, False
        self.ident: int | None = None
        self.stepping = threading.Event()
        self.thread = _in_thread(self.run)
        while self.ident is None:
            time.sleep(0.001)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def run(self) -> None:
        self.g.attach(self.wake)
        self.ident = threading.get_ident()
        try:
            while True:
                with self.cond:
                    while not (self.stop or self.stepping.is_set() or self.g.pending):
                        self.cond.wait()
                    if self.stop:
                        return
                if self.g.serve():
                    continue
                with self.g.step():
                    self.steps += 1
                    time.sleep(0.002)
                    self.g.let_callers_in()
        finally:
            self.g.detach()

    def close(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify()
        self.thread.join(5)


def test_commands_are_applied_on_the_loops_thread_with_the_caller_holding_the_guard() -> None:
    g = ContextGuard()
    loop = _Loop(g)
    try:
        where = g.apply(threading.get_ident)  # the loop idles: its wait wakes for the command
        assert where == loop.ident
        loop.stepping.set()  # now it steps: the command goes between two steps
        with g:
            before = loop.steps
            assert g.apply(threading.get_ident) == loop.ident
            assert g.apply(lambda: loop.steps) == before  # no step ran while it held the guard
            assert g.held
        assert not g.held  # apply took the guard for the command and gave it back
    finally:
        loop.close()


def test_a_commands_exception_reaches_its_caller_and_the_loop_goes_on() -> None:
    g = ContextGuard()
    loop = _Loop(g)
    try:
        loop.stepping.set()

        def bad() -> None:
            raise ValueError("a snapshot of another model")

        with pytest.raises(ValueError, match="another model"):
            g.apply(bad)
        seen = loop.steps
        deadline = time.monotonic() + 5
        while loop.steps == seen and time.monotonic() < deadline:
            time.sleep(0.005)
        assert loop.steps > seen  # still stepping
        assert g.apply(lambda: 41 + 1) == 42
    finally:
        loop.close()


def test_without_a_loop_the_caller_applies_its_command_itself() -> None:
    g = ContextGuard()
    assert g.apply(threading.get_ident) == threading.get_ident()
    loop = _Loop(g)
    loop.close()  # detached as it ended
    assert g.apply(threading.get_ident) == threading.get_ident()
    g.attach(lambda: None)  # this thread is a loop now: its own commands run at once
    assert g.apply(threading.get_ident) == threading.get_ident()
    with pytest.raises(RuntimeError, match="attached"):
        g.attach(lambda: None)  # a second loop on one guard is refused


def test_commands_from_many_callers_all_run_on_the_loop_in_turn() -> None:
    g = ContextGuard()
    loop = _Loop(g)
    loop.stepping.set()
    seen: list[int] = []
    inside = [0]

    def command() -> int:
        inside[0] += 1
        assert inside[0] == 1  # never two at once
        time.sleep(0.001)
        inside[0] -= 1
        return threading.get_ident()

    try:
        threads = [_in_thread(lambda: seen.extend(g.apply(command) for _ in range(20)))]
        threads += [_in_thread(lambda: seen.extend(g.apply(command) for _ in range(20)))]
        for t in threads:
            t.join(10)
        assert seen == [loop.ident] * 40
    finally:
        loop.close()


def test_waiters_whose_predicates_stay_false_do_not_wake_each_other() -> None:
    """A failed check gives the guard back without counting as a change: two waiters check
    again only after a release by someone who held the guard (or a notify), not after each
    other's failed checks, which used to keep a core busy while sessions waited for lanes."""
    g = ContextGuard()
    checks = [0, 0]
    state = {"go": False}
    started = threading.Barrier(3)

    def waiter(i: int) -> None:
        def ready() -> bool:
            checks[i] += 1
            return state["go"]

        started.wait()
        with g:
            g.wait_for(ready)

    threads = [_in_thread(lambda i=i: waiter(i)) for i in range(2)]
    started.wait()
    deadline = time.monotonic() + 5
    while min(checks) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # both wait now; nothing changes
    settled = list(checks)
    time.sleep(0.3)
    assert checks == settled and max(settled) <= 4, settled
    with g:
        pass  # a release by a caller that held the guard: each checks once more
    deadline = time.monotonic() + 5
    while min(c - s for c, s in zip(checks, settled, strict=True)) < 1:
        assert time.monotonic() < deadline, (checks, settled)
        time.sleep(0.01)
    again = list(checks)
    time.sleep(0.2)
    assert checks == again
    g.notify()  # state changed without a release: each checks once more
    deadline = time.monotonic() + 5
    while min(c - a for c, a in zip(checks, again, strict=True)) < 1:
        assert time.monotonic() < deadline, (checks, again)
        time.sleep(0.01)
    state["go"] = True
    g.notify()
    for t in threads:
        t.join(5)
        assert not t.is_alive()
