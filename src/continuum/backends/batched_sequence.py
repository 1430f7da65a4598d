"""A resident sequence whose decodes and replies ride in a
:class:`~continuum.backends.batching.BatchScheduler`'s steps (a lane of a worker with several)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from continuum.backends.base import GenOut, Logits, SequenceView
from continuum.backends.batching import BatchScheduler
from continuum.backends.step_plan import Program
from continuum.params import GenerationParams


class BatchedSequence(SequenceView):
    """A resident sequence whose decodes and replies go through a :class:`BatchScheduler`:
    they ride in the steps it builds for every sequence of the context, with the caller's
    :class:`ContextGuard` given up while they wait. Direct operations (truncate, restore a
    snapshot) are the backend's: the step loop applies them as commands
    (:meth:`ContextGuard.apply`)."""

    __slots__ = ("_prefill", "scheduler")

    def __init__(self, scheduler: BatchScheduler, seq: int) -> None:
        super().__init__(scheduler.backend, seq)
        self.scheduler = scheduler
        self._prefill: Future[Logits] | None = None  # the decode() waiting now, if any

    def decode(self, tokens: list[int] | tuple[int, ...]) -> tuple[Logits | None, float]:
        """Decode ``tokens`` in the coming steps; ``CancelledError`` if :meth:`withdraw` took
        them back before a step did (nothing was decoded)."""
        if not tokens:
            return None, 0.0
        t = time.perf_counter()
        s = self.scheduler
        self._prefill = fut = s.prefill(self.seq, tokens, program=self.program)
        try:
            logits = s.guard.wait(fut)
        finally:
            self._prefill = None
        return logits, (time.perf_counter() - t) * 1000.0

    @property
    def program(self) -> Program:
        """Whose prompts these are, for the scheduler's steps."""
        return Program(self.tenant, self.started)

    def withdraw(self) -> bool:
        """Take back the decode waiting now if no step has started it (for a request that
        needs this sequence more: it decodes those tokens itself)."""
        fut = self._prefill
        return fut is not None and self.scheduler.cancel(fut)

    def generate(
        self,
        logits: Logits,
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
    ) -> GenOut:
        s = self.scheduler
        fut = s.submit(
            self.seq,
            (),
            params,
            on_text=on_text,
            t0=t0,
            logits=logits,
            program=self.program,
        )
        return s.guard.wait(fut)

    def reply(
        self,
        tokens: list[int] | tuple[int, ...],
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        yields: bool = False,
    ) -> tuple[GenOut, float]:
        t = time.perf_counter()
        s = self.scheduler
        fut = s.submit(
            self.seq,
            tokens,
            params,
            on_text=on_text,
            t0=t0,
            program=self.program,
            yields=yields,
        )
        out = s.guard.wait(fut)
        waited = (t - t0) * 1000.0 if t0 is not None else 0.0
        return out, max(0.0, out.ttft_ms - waited)  # submitted until the first token
