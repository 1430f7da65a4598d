"""Idle work: what a worker decodes for a session between its turns.

After a reply, a session's eager glue (the template tokens that open the next user message)
can be decoded before the next message exists; while a message is fed and goes quiet, a
speculative finish can decode the rest of the prompt as if it had ended. :class:`IdleRunner`
does that on one background thread, one job per session at a time, and never in a request's
way:

- on a worker with one lane, it waits while any request waits for the worker or runs, and
  takes the worker only if it is free at that moment (a request arriving meanwhile waits for
  at most one small decode);
- on a worker whose lanes are decoded together, its decodes ride in the batch steps beside
  everyone's, so it need not wait for other sessions; it waits only for the session's own lane,
  and lets ``glue_quiet_ms`` pass after the reply first, so that a next request sent at once
  (an agent loop) takes the glue into its own prefill instead of waiting for it; it steps
  aside, too, for a turn of the session already on its way (its turn lock taken).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from continuum.stateful.kv_space import IDLE, Lane

if TYPE_CHECKING:
    from continuum.backends.batching import BatchScheduler
    from continuum.backends.context_guard import ContextGuard
    from continuum.stateful.arrival import Arriving
    from continuum.stateful.config import WorkerConfig

log = logging.getLogger(__name__)


class IdleSession(Protocol):
    """A session as its idle work sees it (:class:`~continuum.stateful.session.ChatSession`)."""

    @property
    def id(self) -> str: ...

    @property
    def arrival(self) -> Arriving | None: ...

    @property
    def lane(self) -> Lane | None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def in_turn(self) -> bool: ...

    def idle_step(self, speculate: bool) -> None: ...


class IdleWorker(Protocol):
    """The worker as its idle runner sees it (:class:`~continuum.stateful.worker.Worker`): the
    guard and lanes to decode on, and whether a request is on its way."""

    @property
    def config(self) -> WorkerConfig: ...

    @property
    def scheduler(self) -> BatchScheduler | None: ...

    @property
    def guard(self) -> ContextGuard: ...

    @property
    def busy(self) -> bool: ...

    @property
    def is_open(self) -> bool: ...

    def on_lane(self, lane: Lane) -> AbstractContextManager[None]: ...


class IdleRunner:
    """The worker's background thread for eager glue and speculative finishes."""

    def __init__(self, worker: IdleWorker) -> None:
        self._worker = worker
        self._queue: queue.SimpleQueue[tuple[IdleSession, float] | None] | None = None
        self._pending = 0
        self._queued: set[int] = set()  # sessions with a job in the queue (by id())
        self._lock = threading.Lock()

    def schedule(self, session: IdleSession) -> None:
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._loop, name="continuum-idle", daemon=True).start()
        with self._lock:
            if id(session) in self._queued:
                return  # one job per session in the queue is enough: it reads fresh state
            self._queued.add(id(session))
            self._pending += 1
        self._queue.put((session, time.perf_counter()))

    def settle(self, timeout: float) -> bool:
        """Wait until queued idle work is done; False on timeout."""
        deadline = time.perf_counter() + timeout
        while self._pending:
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)

    def _loop(self) -> None:
        assert self._queue is not None
        while (job := self._queue.get()) is not None:
            session, t_job = job
            with self._lock:
                self._queued.discard(id(session))
            try:
                self._run(session, t_job)
            except Exception:  # idle work must never take the worker down
                log.exception("idle work for %s failed", session.id)
            finally:
                with self._lock:
                    self._pending -= 1

    def _run(self, session: IdleSession, t_job: float) -> None:
        """Decode ``session``'s glue (or a speculative finish of the message it is being fed)
        if nothing else wants its lane. The session's own turn lock is left alone, so a turn
        that arrives is never refused as busy; it waits for the lane instead."""
        w = self._worker
        delay = w.config.speculate_after_ms
        arrival = session.arrival
        if arrival is not None and delay is not None:
            _sleep_until(lambda: arrival.t_last + delay / 1000, lambda: session.arrival is None)
        elif w.scheduler is not None:
            _sleep_until(lambda: t_job + w.config.glue_quiet_ms / 1000, lambda: False)
        if w.scheduler is None:
            while w.busy and w.is_open:
                time.sleep(0.002)  # a request is waiting or running: it goes first
            if not w.is_open or not w.guard.acquire(blocking=False):
                return  # the next turn or feed does the work itself
        else:
            w.guard.acquire()
        try:
            lane = session.lane
            if not w.is_open or session.closed or lane is None or lane.holder is not None:
                return
            if w.busy or session.in_turn:
                return  # a request on its way does the work in its own prefill
            lane.holder = IDLE
            try:
                with w.on_lane(lane):
                    session.idle_step(speculate=delay is not None)
            except CancelledError:
                pass  # a turn took its decode back, to do it in its own prefill
            finally:
                lane.holder = None
        finally:
            w.guard.release()


def _sleep_until(when: Callable[[], float], stop: Callable[[], bool]) -> None:
    while not stop():
        left = when() - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left)
