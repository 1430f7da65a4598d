"""What every request returns: one result type for a turn of a session, a stateless request
(a ``TokenOp``: chat, completions, Responses) and a tool run (a ``ToolOp``), with one
:class:`~continuum.metrics.Metrics` vocabulary. A front end formats one type, whatever
served the request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from continuum.metrics import Metrics
from continuum.toolcalls import ToolCall


@dataclass(frozen=True, slots=True)
class ContextItem:
    """Prior context the memory graph surfaced for a request."""

    op_id: int
    run_id: int
    question: str
    answer: str
    score: float
    similarity: float | None
    shared_entities: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Result:
    """One request's reply and what it cost. ``tokens`` are the generated ids (for a session,
    exactly as they stay resident: the end-of-generation token excluded); ``finish_reason``
    is ``stop`` (end of turn or a stop string), ``length``, or ``tool`` for a tool run.

    ``calls`` are the reply's tool calls as the session parsed and stored them — their ids are
    the ones a client must send back — or None where nobody parsed them (a stateless request:
    its front end parses the text). ``turn`` is the session's turn number (None: stateless);
    ``value`` a tool run's return value; ``surfaced`` the prior-run context the memory graph
    passed into the call."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    metrics: Metrics
    calls: tuple[ToolCall, ...] | None = None
    turn: int | None = None
    value: Any = None
    surfaced: tuple[ContextItem, ...] = ()
