"""Compaction: when a session's window moves past the high-water mark, the model summarises the
conversation into a continuity note instead of forgetting the turns that leave (seed 000:
"stateful does not mean infinite").

A session chooses ``compaction="window"`` (the turns leaving the window are dropped from it, as
before) or ``"summary"``. With ``"summary"``, a turn that would move the window first asks the
model, on the session's own resident sequence, to summarise the conversation so far: the
conversation is resident, so only the request to summarise is decoded, then the note is
generated (greedy, at most ``note_tokens``). The new window is rendered with the note in front
of its first message — after the wake prefix, which stays resident — and the recent turns kept
verbatim. The history keeps every original message; the note is stored with the session
(:class:`~continuum.store.base.ContinuityNote`), so a reopened session renders the same window.

A summary is only made from history the turn verified unchanged (an edit moves the window the
windowed way), and only when the request to summarise fits the context; otherwise the window
moves without a new note, and the reset's detail says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from continuum.backends.base import SequenceView
from continuum.errors import InvalidRequest
from continuum.messages import Message
from continuum.metrics import Compaction, ResetReason
from continuum.params import GenerationParams
from continuum.stateful.plan import common_prefix
from continuum.stateful.transcript import Transcript
from continuum.stateful.turn import TurnLimits, TurnPlan
from continuum.store.base import ContinuityNote, StoredMessage

CompactionMode = Literal["window", "summary"]
NOTE_TOKENS = 192  # the longest continuity note the model may write, by default
NOTE_OVERHEAD = 32  # the note's header and the blank line after it, in tokens (at most)
MODES: tuple[CompactionMode, ...] = ("window", "summary")

INSTRUCTION = (
    "Before we go on: write a short summary of our conversation so far, so that it can be "
    "continued from the summary alone. Keep every fact about me, every name, number, place "
    "and decision exactly as stated. Reply with the summary only."
)


def check_mode(value: object) -> CompactionMode:
    if value not in MODES:
        raise InvalidRequest(f"compaction must be one of {', '.join(MODES)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Summary:
    """A continuity note the model wrote, and what writing it cost."""

    note: ContinuityNote
    cost: Compaction


def summarise(
    transcript: Transcript,
    seq: SequenceView,
    system: str | None,
    history: list[StoredMessage],
    window: int,
    note_tokens: int,
    reserve: Callable[[int], None],
) -> Summary | None:
    """Ask the model, on ``seq`` (which holds the committed conversation, or part of it), to
    summarise ``history``; the note will stand for ``history[:window]``. None when the request
    does not fit the context or the model wrote nothing. ``reserve(n)`` makes room for ``n``
    tokens in the context. Leaves the summary's tokens resident (the next plan truncates)."""
    t0 = time.perf_counter()
    backend = seq.backend
    base = transcript.base_tokens(system, history)
    shown = transcript.render_list(system, history, transcript.window)
    before = transcript.render(shown, add_generation_prompt=False)
    asked: list[Message] = [*shown, {"role": "user", "content": INSTRUCTION}]
    after = transcript.render(asked, add_generation_prompt=True)
    if not after.startswith(before):
        return None
    prompt = [*base, *backend.tokenize(after[len(before) :], special=True)]
    if len(prompt) + note_tokens + 1 > backend.n_ctx:
        return None
    keep = min(common_prefix(seq.tokens, base), len(prompt) - 1)
    seq.truncate(keep)
    reserve(len(prompt) + note_tokens)
    logits, _ = seq.decode(prompt[keep:])
    assert logits is not None
    params = GenerationParams(temperature=0.0, max_tokens=note_tokens)
    out = seq.generate(logits, params)
    text = out.text.strip()
    if not text:
        return None
    cost = Compaction(
        messages=window,
        note_tokens=len(backend.tokenize(text, special=False)),
        summary_evaluated=len(prompt) - keep,
        summary_generated=len(out.tokens),
        summary_ms=(time.perf_counter() - t0) * 1000.0,
    )
    return Summary(ContinuityNote(window, text), cost)


def compacting_plan(
    prepare: Callable[..., TurnPlan],
    limits: TurnLimits,
    transcript: Transcript,
    seq: SequenceView,
    history: list[StoredMessage],
    note_tokens: int,
    reserve: Callable[[int], None],
) -> tuple[TurnPlan, Summary | None]:
    """A summary-compacting session's turn plan within ``limits`` (``prepare(limits,
    window_at=)`` is the turn's :func:`~continuum.stateful.turn.prepare_turn`). A window that
    moves forward over verified history first gets a continuity note written by the model; the
    plan is then made again with the note rendered. An edit before the note's window makes the
    note stale: it is dropped. Sets ``transcript.note``; the caller restores it if the turn
    fails."""
    tr = transcript
    room = replace(limits, reserve=note_tokens + NOTE_OVERHEAD)  # should the window move
    prep = prepare(room)
    if tr.note is not None and prep.diverged_at < tr.note.window:
        tr.note = None  # it summarises messages the client has since replaced
        prep = prepare(room)
    window = prep.target.window
    if window <= tr.window:
        return prep, None
    if prep.diverged_at < len(history) or not tr.same_wake(prep.system):
        return _told(prep, "; no new continuity note: the turn edited the history"), None
    summary = summarise(tr, seq, prep.system, history, window, note_tokens, reserve)
    if summary is None:
        why = "the request to summarise does not fit the context, or the summary was empty"
        return _told(prep, f"; no new continuity note: {why}"), None
    tr.note = summary.note
    # the plan keeps the wake prefix, which the summary left resident as it was
    prep = prepare(limits, window_at=window)
    said = f"; the {window} messages before it compacted into a continuity note"
    return _told(prep, said), summary


def _told(prep: TurnPlan, said: str) -> TurnPlan:
    """``prep`` with ``said`` added to its high-water reset's detail."""
    resets = tuple(
        replace(r, detail=r.detail + said) if r.reason is ResetReason.HIGH_WATER else r
        for r in prep.resets
    )
    return replace(prep, resets=resets)


__all__ = [
    "INSTRUCTION",
    "MODES",
    "CompactionMode",
    "Summary",
    "check_mode",
    "compacting_plan",
    "summarise",
]
