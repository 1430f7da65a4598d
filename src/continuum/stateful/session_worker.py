"""What a session uses of the worker it runs on: the contract between the two.

A :class:`~continuum.stateful.session.ChatSession` runs its turns on a
:class:`~continuum.stateful.worker.Worker` and hands itself back to it (to be held in a lane,
to have its idle work scheduled, to be released). :class:`SessionWorker` names exactly that
surface, so the session depends on this contract rather than on the worker, which sits above
it: the worker imports the session, never the other way round.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from continuum.backends.base import SequenceBackend, SequenceView
    from continuum.backends.batching import BatchScheduler
    from continuum.stateful.config import WorkerConfig
    from continuum.stateful.hooks import TurnLookup, TurnQuery, TurnTiers
    from continuum.stateful.kv_space import Lane
    from continuum.stateful.residency import Residency
    from continuum.store.base import HistoryLog

# the session type the worker takes back (ChatSession); only ever an argument
SessionT_contra = TypeVar("SessionT_contra", contravariant=True)


class SessionWorker(Protocol[SessionT_contra]):
    """The worker as its sessions see it: the context and its lanes, the history log, the
    result tiers above, and the calls that hold, schedule and release a session."""

    @property
    def seq(self) -> SequenceView: ...

    @property
    def backend(self) -> SequenceBackend: ...

    @property
    def scheduler(self) -> BatchScheduler | None: ...

    @property
    def config(self) -> WorkerConfig: ...

    @property
    def store(self) -> HistoryLog: ...

    @property
    def residency(self) -> Residency: ...

    @property
    def tiers(self) -> TurnTiers | None: ...

    @property
    def busy(self) -> bool: ...

    def claim(self) -> AbstractContextManager[None]: ...

    def holding(self, session: SessionT_contra) -> AbstractContextManager[Lane]: ...

    def release(self, session: SessionT_contra) -> None: ...

    def reserve(self, total: int) -> None: ...

    def schedule_glue(self, session: SessionT_contra) -> None: ...

    def schedule_speculation(self, session: SessionT_contra) -> None: ...

    def tiers_lookup(self, query: TurnQuery) -> TurnLookup | None: ...

    def tiers_record(
        self, lookup: TurnLookup, text: str, tokens: tuple[int, ...], finish: str
    ) -> None: ...
