"""The conversation a session starts from: new, or reopened from the history log.

A :class:`~continuum.stateful.session.ChatSession` is made from a :class:`Conversation`: a new
one is its system prompt and continuity context alone; a reopened one also brings what the log
kept of it (:meth:`Conversation.reopened`) — the messages, the turns taken, the continuity note
of its last compaction and when it was created (its transcript's clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from continuum.store.base import ContinuityNote, SessionRecord, StoredMessage


@dataclass(frozen=True, slots=True)
class Conversation:
    """A session's conversation so far. ``created_at`` None: a new session, created now."""

    system: str | None
    continuity: str | None
    history: tuple[StoredMessage, ...] = ()
    turns: int = 0
    note: ContinuityNote | None = None
    created_at: float | None = None

    @classmethod
    def reopened(cls, record: SessionRecord, history: Sequence[StoredMessage]) -> Conversation:
        """The stored session ``record`` with its ``history`` (the log's messages)."""
        return cls(
            record.system,
            record.continuity,
            tuple(history),
            record.turns,
            record.note,
            record.created_at,
        )

    @property
    def clock(self) -> datetime | None:
        """When the conversation began, as its transcript renders dates (None: now)."""
        return datetime.fromtimestamp(self.created_at) if self.created_at is not None else None


__all__ = ["Conversation"]
