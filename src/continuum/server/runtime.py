"""The server's runtime: a few job threads in front of the engine; a bounded queue feeds them.

HTTP handlers never touch a model. They submit a job (a plain callable) to :class:`Executor`,
whose ``threads`` run jobs in order of arrival and hand results back as futures. With one
thread, jobs run one at a time. With more (``--parallel N`` gives N + 1), session turns on
different lanes of the context run at once — their decodes are batched together by the
worker's scheduler, whose step loop is the context's one owner (every other action on the
context is a command it applies between steps), not by this queue. When the queue is full,
:meth:`Executor.submit` raises :class:`~continuum.errors.Overloaded` at once (the handler
answers ``429`` with ``Retry-After``) instead of letting requests pile up.

Which queued job runs next is the workers' lane order (``--lane-order``,
:mod:`continuum.stateful.lane_order`): with ``arrival`` the one queued first; with ``age`` or
``las`` the job of the program (session) that started first, or holds the fewest tokens, goes
first, a job that waited ``STARVE_S`` before any. With more requests than job threads, requests
wait here rather than for a lane, so the order must hold here too. A job names its program by
the session id it will run on, when the request says it (a session header or hint); a job of no
known program is a program that starts when it is queued.

Stopping is bounded (:meth:`Executor.stop`): jobs still queued fail with
:class:`~continuum.errors.ShuttingDown` (a 503), and the threads get a grace period to finish the
jobs they run; the server's state interrupts the model after it (:meth:`ServerState.close`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from continuum.errors import Overloaded, ShuttingDown
from continuum.stateful.lane_order import LaneOrder, Waiter, rank

log = logging.getLogger(__name__)

# a program's (session's) start and the tokens it holds, or None when it is not open here
Programs = Callable[[str], tuple[float, int] | None]


@dataclass(eq=False)
class _Job:
    fn: Callable[[], Any]
    future: Future[Any]
    bounded: bool
    since: float  # time.monotonic() when queued
    program: str | None  # the session it runs on, when known


# how long a closing server waits for running work, twice: before and after it interrupts the
# model (uvicorn waits as long for open connections first)
CLOSE_GRACE_S = 10.0


class Executor:
    """Jobs run in order of arrival on ``threads`` job threads. At most ``max_queue`` requests
    wait; cleanup jobs (``bounded=False``: dropping a message whose client went away) are never
    refused, so a full queue cannot leave a session holding half a message."""

    def __init__(
        self,
        max_queue: int = 16,
        retry_after_s: int = 1,
        threads: int = 1,
        order: LaneOrder = LaneOrder.ARRIVAL,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self._jobs: list[_Job] = []  # queued, in order of arrival
        self._cond = threading.Condition()
        self.max_queue = max_queue
        self._waiting = 0  # bounded jobs queued, not yet running
        self.retry_after_s = retry_after_s
        self._closed = False
        self._stopping = False  # the threads end once the queue is empty
        self.running = 0
        self.threads = threads
        self.order = order
        self.programs: Programs | None = None  # set once sessions exist (the engine is built)
        self._threads = [
            threading.Thread(target=self._loop, name=f"continuum-job-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    @property
    def depth(self) -> int:
        """Requests waiting (not counting the one running)."""
        return self._waiting

    @property
    def queued(self) -> int:
        """Jobs waiting, cleanup jobs included."""
        return len(self._jobs)

    def submit(
        self, fn: Callable[[], Any], *, bounded: bool = True, program: str | None = None
    ) -> Future[Any]:
        """Queue ``fn``; ``program``: the session it runs on, when known (the order above)."""
        if self._closed:
            raise ShuttingDown()
        fut: Future[Any] = Future()
        with self._cond:
            if bounded and self._waiting >= self.max_queue:
                raise Overloaded(self.retry_after_s, self._waiting)
            self._waiting += bounded
            self._jobs.append(_Job(fn, fut, bounded, time.monotonic(), program))
            self._cond.notify()
        return fut

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on a job thread and wait (for setup and teardown, not requests)."""
        return self.submit(fn, bounded=False).result()

    def _next(self) -> _Job:  # under _cond, with jobs queued
        if self.order is LaneOrder.ARRIVAL or len(self._jobs) == 1:
            return self._jobs.pop(0)
        now = time.monotonic()
        programs = self.programs

        def key(job: _Job) -> tuple[int, float, float]:
            known = programs(job.program) if programs and job.program else None
            started, service = known if known is not None else (job.since, 0)
            return rank(Waiter(job.since, started, service), self.order, now)

        job = min(self._jobs, key=key)  # the first queued among equals
        self._jobs.remove(job)
        return job

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._next()
                self._waiting -= job.bounded
            if not job.future.set_running_or_notify_cancel():
                continue
            with self._cond:
                self.running += 1
            try:
                job.future.set_result(job.fn())
            except BaseException as e:  # delivered to the waiting handler
                job.future.set_exception(e)
            finally:
                with self._cond:
                    self.running -= 1

    def stop(self, grace_s: float) -> bool:
        """Take no more jobs; fail the queued ones with :class:`ShuttingDown`; wait up to
        ``grace_s`` for the running ones. True when every job thread has ended. Call it again
        to wait again (after interrupting what the jobs wait on)."""
        with self._cond:
            self._closed = self._stopping = True
            queued, self._jobs = self._jobs, []
            for job in queued:
                self._waiting -= job.bounded
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(ShuttingDown())
            self._cond.notify_all()
        deadline = time.monotonic() + grace_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Stop, letting running jobs finish (up to a minute)."""
        self.stop(60.0)
