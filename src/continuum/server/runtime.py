"""The server's runtime: a few job threads in front of the engine; a bounded queue feeds them.

HTTP handlers never touch a model. They submit a job (a plain callable) to :class:`Executor`,
whose ``threads`` run jobs in order of arrival and hand results back as futures. With one
thread, jobs run one at a time. With more (``--parallel N`` gives N + 1), session turns on
different lanes of the context run at once — their decodes are batched together by the
worker's scheduler, whose step loop is the context's one owner (every other action on the
context is a command it applies between steps), not by this queue. When the queue is full,
:meth:`Executor.submit` raises :class:`~continuum.errors.Overloaded` at once (the handler
answers ``429`` with ``Retry-After``) instead of letting requests pile up.

Stopping is bounded (:meth:`Executor.stop`): jobs still queued fail with
:class:`~continuum.errors.ShuttingDown` (a 503), and the threads get a grace period to finish the
jobs they run; the server's state interrupts the model after it (:meth:`ServerState.close`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from continuum.errors import Overloaded, ShuttingDown

log = logging.getLogger(__name__)

_STOP = object()
# how long a closing server waits for running work, twice: before and after it interrupts the
# model (uvicorn waits as long for open connections first)
CLOSE_GRACE_S = 10.0


class Executor:
    """Jobs run in order of arrival on ``threads`` job threads. At most ``max_queue`` requests
    wait; cleanup jobs (``bounded=False``: dropping a message whose client went away) are never
    refused, so a full queue cannot leave a session holding half a message."""

    def __init__(self, max_queue: int = 16, retry_after_s: int = 1, threads: int = 1) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be >= 1")
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self._queue: queue.Queue[Any] = queue.Queue()
        self.max_queue = max_queue
        self._waiting = 0  # bounded jobs queued, not yet running
        self._lock = threading.Lock()
        self.retry_after_s = retry_after_s
        self._closed = False
        self.running = 0
        self.threads = threads
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
        return self._queue.qsize()

    def submit(self, fn: Callable[[], Any], *, bounded: bool = True) -> Future[Any]:
        if self._closed:
            raise ShuttingDown()
        fut: Future[Any] = Future()
        with self._lock:
            if bounded and self._waiting >= self.max_queue:
                raise Overloaded(self.retry_after_s, self._waiting)
            self._waiting += bounded
            self._queue.put_nowait((fn, fut, bounded))
        return fut

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on a job thread and wait (for setup and teardown, not requests)."""
        return self.submit(fn, bounded=False).result()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, fut, bounded = item
            with self._lock:
                self._waiting -= bounded
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self.running += 1
            try:
                fut.set_result(fn())
            except BaseException as e:  # delivered to the waiting handler
                fut.set_exception(e)
            finally:
                with self._lock:
                    self.running -= 1

    def stop(self, grace_s: float) -> bool:
        """Take no more jobs; fail the queued ones with :class:`ShuttingDown`; wait up to
        ``grace_s`` for the running ones. True when every job thread has ended. Call it again
        to wait again (after interrupting what the jobs wait on)."""
        with self._lock:
            first, self._closed = not self._closed, True
            queued = []
            while True:
                try:
                    queued.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if first:
                queued += [_STOP] * len(self._threads)
            for item in queued:
                if item is _STOP:
                    self._queue.put_nowait(item)
                    continue
                _, fut, bounded = item
                self._waiting -= bounded
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(ShuttingDown())
        deadline = time.monotonic() + grace_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Stop, letting running jobs finish (up to a minute)."""
        self.stop(60.0)
