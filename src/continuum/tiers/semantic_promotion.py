"""Off the request path: judge near-misses on their answers, and promote the vetted ones.

Krites' design (arXiv 2602.13165) in the semantic tier's verified mode. A request whose best
candidate passed the guard but was not served at first sight is answered cold; once its answer
is stored, a :class:`Proposal` goes to this worker's queue and the request returns. The worker
asks the judge (:class:`~continuum.tiers.verifier.JudgeVerifier`) whether the candidate's
stored answer is a correct answer to the new request: shown the two requests (``kind="intent"``)
or both requests and both answers (``kind="answer"``; ``bench semantic-verified`` compares
the two, and on this project's sets the answers did not help). Its verdict is handed to the
tier, which counts it as an observation of its calibration and, when accepted, promotes the
mapping: the new request's entry serves the candidate's answer from then on (one vetted answer
per intent).

No request waits on a judgment. A full queue drops the proposal (counted: ``dropped``); a
judgment that times out, cannot be made or says no is a rejected promotion, counted by reason;
nothing is served because of a proposal until its judge accepted it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from continuum.errors import InvalidRequest
from continuum.tiers.semantic_entries import SemanticEntry
from continuum.tiers.verifier import JudgeVerifier, Verdict

log = logging.getLogger(__name__)

QUEUE_SIZE = 256


@dataclass(frozen=True, slots=True)
class Proposal:
    """A near-miss answered cold: ``entry`` (the new request's own entry, just stored) might be
    answered by ``anchor``'s result; ``score`` is their cosine."""

    anchor: SemanticEntry
    entry: SemanticEntry
    score: float


class Promoter:
    """One worker thread judging proposals in arrival order (see the module docstring)."""

    def __init__(
        self,
        judge: JudgeVerifier,
        decided: Callable[[Proposal, Verdict], None],
        *,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise InvalidRequest(f"queue_size is a count >= 1, got {queue_size!r}")
        self.judge = judge
        self._decided = decided
        self._queue: queue.Queue[Proposal | None] = queue.Queue(maxsize=queue_size)
        self._idle = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.counts: Counter[str] = Counter()

    def submit(self, proposal: Proposal) -> bool:
        """Queue a proposal; False when the queue is full or closed (dropped, counted)."""
        with self._idle:
            if self._closed:
                self.counts["dropped"] += 1
                return False
            try:
                self._queue.put_nowait(proposal)
            except queue.Full:
                self.counts["dropped"] += 1
                return False
            self._pending += 1
            self.counts["proposed"] += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="semantic-promotion", daemon=True
                )
                self._thread.start()
        return True

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued proposal is decided; False if ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Stop taking proposals, finish the queued ones' worker, close the judge."""
        with self._idle:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()
        self.judge.close()

    def _run(self) -> None:
        while (proposal := self._queue.get()) is not None:
            try:
                self._decide(proposal)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _decide(self, p: Proposal) -> None:
        new, old = p.entry, p.anchor
        if self.judge.kind == "answer":
            verdict = self.judge.verify_answers(new.query, old.query, new.text, old.text)
        else:
            verdict = self.judge.verify(new.query, old.query)
        self.counts["promoted" if verdict.accepted else f"rejected_{verdict.reason}"] += 1
        try:
            self._decided(p, verdict)
        except Exception:  # the worker outlives a failed promotion; it is counted and logged
            self.counts["errors"] += 1
            log.exception("semantic tier: applying a verdict failed")

    def stats(self) -> dict[str, Any]:
        return dict(self.counts) | {"pending": self._pending}
