"""Who may touch a llama.cpp context now: one caller, or the batch step loop.

A context is not thread-safe (STYLE.md: one owner serialises access). :class:`ContextGuard` is
that owner's lock, shared by everything on one context — the engine's stateless ops, the
stateful worker's sessions, and the :class:`~continuum.backends.batching.BatchScheduler`'s step
loop:

- callers take it reentrantly (``with guard:``), and go before the step loop: a step waits
  while any caller holds the guard or waits for it, and lets waiting callers in between its
  ``llama_decode`` calls, so a short caller section (truncate a sequence, restore a snapshot,
  commit a turn) is never queued behind a stream of steps, nor behind a whole step;
- a caller whose work is a batched decode gives the guard up while it waits
  (:meth:`wait`, :meth:`wait_for`), however deeply it holds it, and takes it back at the same
  depth afterwards; once a step has finished its decode, it counts as waiting for the guard
  (so goes before the next step) even before its thread wakes. Other callers run only at
  such waits, never in the middle of a section, so the state they share changes only where
  the code says it may.

Commands: with a step loop attached (:meth:`attach`), the context has one owner thread. A
caller's action on it (truncate a sequence, copy one, save or restore a snapshot) is a command
(:meth:`apply`): the caller takes the guard, hands the action to the loop and waits; the loop
applies it between its steps — where it waits for the guard, lets callers in, or idles — on
the caller's behalf, and no step runs meanwhile (the caller still holds the guard). So every
llama.cpp call on the context is made by the loop's thread, while the guard keeps deciding who
acts when. Without a loop (one lane, or the loop gone) the caller applies it itself.

A caller in :meth:`wait_for` checks its predicate again only after something may have changed
what it waits on: a release by anyone who held the guard for work (a caller, a step, a waiter
giving the guard up for the first time), a :meth:`notify`, or its ``recheck_s``. A failed check
gives the guard back without counting as a change, so waiters whose predicates stay false do not
wake each other in turn (with two or more, that was a loop that kept a core busy and held the
step loop back from the guard).

Invariant: ``_owner`` is the thread holding the guard (``_depth`` times), ``_STEP`` while the
step loop runs a step, or None. Commands wait in ``_commands`` only while their callers hold
the guard, and only while a loop is attached (``_loop``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

_T = TypeVar("_T")
_STEP = -1  # the owner while the step loop holds the guard


class ContextGuard:
    """A reentrant lock that callers take before the step loop (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._waiting = 0  # callers waiting to take the guard: the step loop lets them go first
        self._changes = 0  # releases that may have changed what wait_for callers wait on
        self._commands: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._loop: int | None = None  # the attached step loop's thread
        self._wake: Callable[[], None] = _nothing  # wakes the loop where it waits elsewhere

    # -- callers ---------------------------------------------------------------------------------
    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            if self._owner is not None and not blocking:
                return False
            self._take(me, 1)
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release() of a context guard this thread does not hold")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed()

    def __enter__(self) -> ContextGuard:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def held(self) -> bool:
        """This thread holds the guard."""
        return self._owner == threading.get_ident()

    @property
    def waiting(self) -> int:
        """How many callers wait to take the guard now."""
        with self._cond:
            return self._waiting

    def wait(self, future: Future[_T]) -> _T:
        """``future.result()`` with the guard given up meanwhile (if this thread holds it).
        Once the future is done, the caller is counted as waiting for the guard: a step that
        finished its future does not start the next step before the caller has the guard
        back (else a reply's end — its commit, the response's last event — would wait for a
        whole step of another sequence, a long prefill chunk)."""
        with self.released(future):
            return future.result()

    def wait_for(self, predicate: Callable[[], bool], recheck_s: float | None = None) -> None:
        """Give the guard up until ``predicate()`` — checked with the guard held, after every
        release by anyone, and every ``recheck_s`` seconds when given (a predicate that also
        depends on the time) — is true. The caller must hold the guard."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                raise RuntimeError("wait_for() needs the context guard held")
        first = True  # the caller may have changed state before: its first release counts
        while True:
            # counted before the check, so a change made during it (a notify from a thread
            # that does not hold the guard) wakes this caller again
            with self._cond:
                seen = self._changes
            if predicate():
                return
            with self._cond:
                depth, self._owner, self._depth = self._depth, None, 0
                if first:
                    self._changes += 1  # (so this caller checks once more, at once)
                first = False
                self._cond.notify_all()  # callers taking the guard, the step loop
                self._await_change(seen, recheck_s)
                self._take(me, depth)

    def _await_change(self, seen: int, recheck_s: float | None) -> None:  # under _cond
        """Wait until a change is counted after ``seen``, or ``recheck_s`` has passed."""
        deadline = None if recheck_s is None else time.monotonic() + recheck_s
        while self._changes == seen:
            if deadline is None:
                self._cond.wait()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _changed(self) -> None:  # under _cond
        self._changes += 1
        self._cond.notify_all()

    @contextmanager
    def released(self, until: Future[Any] | None = None) -> Iterator[None]:
        """The guard given up for the block (if this thread holds it), taken back after at the
        same depth: for work that needs no context (a database commit) while others step.
        With ``until``: from the moment that future is done, this thread counts as waiting
        for the guard (see :meth:`wait`)."""
        me = threading.get_ident()
        claim = [False, False]  # [counted as waiting, taken back]

        def done(_: Future[Any]) -> None:  # on the thread that finished it (a step)
            with self._cond:
                if not claim[1]:
                    claim[0] = True
                    self._waiting += 1

        with self._cond:
            depth = self._depth if self._owner == me else 0
            if depth:
                self._owner, self._depth = None, 0
                self._changed()
        if depth and until is not None:
            until.add_done_callback(done)
        try:
            yield
        finally:
            if depth:
                with self._cond:
                    claim[1] = True
                    if claim[0]:
                        self._waiting -= 1  # _take counts this thread again while it waits
                    self._take(me, depth)

    def _take(self, me: int, depth: int) -> None:  # under _cond
        self._waiting += 1
        try:
            while self._owner is not None:
                self._cond.wait()
        finally:
            self._waiting -= 1
        self._owner, self._depth = me, depth

    def apply(self, action: Callable[[], _T]) -> _T:
        """``action()`` — an action on the context — applied by the attached step loop between
        its steps, this caller holding the guard meanwhile (taken here if it does not hold it
        yet); applied here when no loop is attached or this is the loop's thread. Its result,
        or its exception."""
        with self:
            with self._cond:
                direct = self._loop is None or self._loop == threading.get_ident()
                if not direct:
                    done: Future[_T] = Future()
                    self._commands.append((action, done))
                    self._cond.notify_all()
                    wake = self._wake
            if direct:
                return action()
            wake()
            return done.result()

    # -- the step loop ---------------------------------------------------------------------------
    def attach(self, wake: Callable[[], None]) -> None:
        """From the step loop's thread: from now on it applies the callers' commands.
        ``wake()`` wakes it where it waits on something else than the guard (its idle wait),
        to call :meth:`serve`."""
        with self._cond:
            if self._loop is not None:
                raise RuntimeError("a step loop is attached to this context guard already")
            self._loop, self._wake = threading.get_ident(), wake

    def detach(self) -> None:
        """From the step loop's thread as it ends: the commands waiting are applied, and
        callers apply theirs themselves from now on."""
        with self._cond:
            self._serve_locked()
            self._loop, self._wake = None, _nothing

    @property
    def pending(self) -> bool:
        """Commands wait for the loop to apply them."""
        return bool(self._commands)

    def serve(self) -> bool:
        """From the step loop's thread: apply the commands waiting; True if there were any."""
        with self._cond:
            return self._serve_locked()

    def _serve_locked(self) -> bool:  # under _cond, on the loop's thread
        if not self._commands:
            return False
        commands = list(self._commands)
        self._commands.clear()
        self._cond.release()  # an action may take long (a snapshot): others may queue meanwhile
        try:
            for action, done in commands:
                try:
                    result = action()
                except BaseException as e:
                    done.set_exception(e)
                else:
                    done.set_result(result)
        finally:
            self._cond.acquire()
        return True

    def _wait_serving(self) -> None:  # under _cond, on the loop's thread: wait, or apply
        if not self._serve_locked():
            self._cond.wait()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Hold the guard for one batch step, once no caller holds it or waits for it
        (applying the commands of those that hold it meanwhile)."""
        with self._cond:
            while self._owner is not None or self._waiting:
                self._wait_serving()
            self._owner = _STEP
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._changed()

    def let_callers_in(self) -> bool:
        """From inside :meth:`step`, between two ``llama_decode`` calls: if callers wait for
        the guard, give it to them and take it back once none holds it or waits for it (a
        reply's end, a new turn's submit then go ahead of the step's next call instead of
        after the whole step). True if it was given up."""
        with self._cond:
            if self._owner != _STEP or not self._waiting:
                return False
            self._owner = None
            self._changed()
            while self._owner is not None or self._waiting:
                self._wait_serving()
            self._owner = _STEP
            return True

    def notify(self) -> None:
        """Wake threads in :meth:`wait_for` (state they wait on changed without a release)."""
        with self._cond:
            self._changed()


def _nothing() -> None:
    pass
