"""Summary compaction on a real model: at the high-water mark the model writes a continuity note
of the conversation on its resident sequence, the new window is rendered with the note after
the wake prefix, and the history keeps every message.

Gemma 3 270M is a base model, so its notes are not good summaries; these tests pin the
mechanics (what is decoded, what is rendered, what is stored); one test runs the instruct
default model, Qwen2.5-Coder-0.5B. What the notes retain is measured by ``continuum bench
compaction`` on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum import (
    GenerationParams,
    InvalidRequest,
    ModelFile,
    ResetReason,
    Worker,
    resolve_model,
)
from continuum.bench.conversation import SYSTEM, TURNS
from continuum.stateful.compaction import INSTRUCTION
from continuum.stateful.transcript import NOTE_HEADER
from tests.conftest import WorkerFactory

PARAMS = GenerationParams(max_tokens=24)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def compacting(make_worker: WorkerFactory, mf: ModelFile, **kw: object) -> Worker:
    return make_worker(mf, n_ctx=1024, high_water=300, compaction="summary", note_tokens=48, **kw)


@pytest.mark.slow
def test_crossing_the_high_water_mark_writes_a_note_and_keeps_the_wake_prefix(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = compacting(make_worker, gemma)
    s = w.create_session(SYSTEM)
    wake = len(s.wake_tokens(SYSTEM))
    results = [s.append([user(t.content)], PARAMS) for t in TURNS[:12]]
    compacted = [i for i, r in enumerate(results) if r.metrics.compaction is not None]
    assert compacted, "12 turns must cross a 300-token high-water mark"
    r = results[compacted[0]]
    c = r.metrics.compaction
    assert c is not None
    # the conversation was resident: the summary decoded only the request to summarise
    ask = w.backend.tokenize(INSTRUCTION, special=False)
    assert len(ask) <= c.summary_evaluated <= len(ask) + 12
    assert 0 < c.summary_generated <= 48 and c.note_tokens > 0
    (reset,) = r.metrics.resets
    assert reset.reason is ResetReason.HIGH_WATER and "continuity note" in reset.detail
    assert r.metrics.tokens_reused == wake  # the wake prefix stays resident
    note = s.transcript.note
    last = results[compacted[-1]].metrics.compaction
    assert note is not None and last is not None and note.window == last.messages
    assert note.window % 2 == 0  # a window starts at a user message
    # the window's first message is rendered with the note in front; the history is whole
    first = s.transcript.render_list(SYSTEM, s._history, s.transcript.window)[1]
    assert str(first["content"]).startswith(NOTE_HEADER)
    assert NOTE_HEADER not in str(s.history)
    assert len(s.history) == 1 + 2 * 12
    assert r.metrics.context_used <= 300
    assert r.metrics.prompt_tokens_evaluated == c.summary_evaluated + (
        r.metrics.context_used - len(r.tokens) + 1 - wake
    )  # the summary's request, then the window after the wake prefix
    following = compacted[0] + 1
    if following < len(results) and following not in compacted:
        assert results[following].metrics.tokens_reused == r.metrics.context_used
        assert results[following].metrics.resets == ()


@pytest.mark.slow
def test_the_note_is_stored_and_a_reopened_session_renders_the_same_window(
    gemma: ModelFile, make_worker: WorkerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "h.db"
    w = compacting(make_worker, gemma, store=store, session_snapshots=False)
    s = w.create_session(SYSTEM)
    for t in TURNS[:10]:
        s.append([user(t.content)], PARAMS)
    note = s.transcript.note
    assert note is not None
    resident = list(w.seq.tokens)
    sid = s.id
    assert w.store.load_session(sid).note == note
    w.close()

    w2 = compacting(make_worker, gemma, store=store, rebuild_reserve_tokens=24)
    s2 = w2.open_session(sid)
    assert s2.compaction == "summary" and s2.transcript.note == note
    opened = list(w2.seq.tokens)  # the same window, with the note, as the first worker had
    assert opened[: len(resident)] == resident
    assert len(opened) - len(resident) <= 4  # and the last reply's closing glue
    r = s2.append([user("What is my name?")], PARAMS)
    assert [x.reason for x in r.metrics.resets] == [ResetReason.EVICTED]


@pytest.mark.slow
def test_an_edit_before_the_note_drops_it(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    w = compacting(make_worker, gemma)
    s = w.create_session(SYSTEM)
    for t in TURNS[:10]:
        s.append([user(t.content)], PARAMS)
    assert s.transcript.note is not None
    edited = [m for m in s.history if m["role"] != "system"][:1]
    edited[0] = user("My name is Tomasz.")
    r = s.turn([*edited, user("What is my name?")], PARAMS)
    assert s.transcript.note is None and r.metrics.compaction is None
    assert w.store.load_session(s.id).note is None
    assert len(s.history) == 1 + 3


@pytest.mark.slow
def test_windowed_sessions_write_no_note_and_a_bad_mode_is_refused(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, n_ctx=1024, high_water=300)
    s = w.create_session(SYSTEM)
    results = [s.append([user(t.content)], PARAMS) for t in TURNS[:10]]
    assert any(r.metrics.resets for r in results)
    assert all(r.metrics.compaction is None for r in results) and s.transcript.note is None
    with pytest.raises(InvalidRequest, match="compaction must be one of window, summary"):
        w.create_session(SYSTEM, compaction="forget")  # type: ignore[arg-type]
    assert s.compaction == "window"


@pytest.mark.slow
def test_a_window_moved_by_an_edited_turn_writes_no_note_and_says_why(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    # windows moved just under the mark, so the long turn below is sure to move it again
    w = compacting(make_worker, gemma, low_water=1.0)
    s = w.create_session(SYSTEM)
    for t in TURNS[:10]:
        s.append([user(t.content)], PARAMS)
    note = s.transcript.note
    assert note is not None
    msgs = [m for m in s.history if m["role"] != "system"]
    msgs[-2] = user("I changed my mind about that.")  # an edit after the note's window
    long = user("Here is a long story about my week. " * 12)
    r = s.turn([*msgs, long], PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason is ResetReason.HIGH_WATER and "the turn edited the history" in reset.detail
    assert r.metrics.compaction is None and s.transcript.note == note  # the old note still holds


@pytest.mark.slow
def test_on_the_default_model_the_note_is_written_from_the_resident_conversation(
    make_worker: WorkerFactory,
) -> None:
    """Qwen2.5-Coder-0.5B-Instruct, the instruct default: it writes a note in words, from a
    conversation it did not prefill again, and the next turn reads it in its window."""
    w = compacting(make_worker, resolve_model("qwen2.5-coder-0.5b"))
    s = w.create_session(SYSTEM)
    results = [s.append([user(t.content)], PARAMS) for t in TURNS[:10]]
    done = [r.metrics.compaction for r in results if r.metrics.compaction is not None]
    assert done, "10 turns must cross a 300-token high-water mark"
    ask = w.backend.tokenize(INSTRUCTION, special=False)
    assert all(len(ask) <= c.summary_evaluated <= len(ask) + 12 for c in done)
    note = s.transcript.note
    assert note is not None and len(note.text.split()) >= 3
    window = s.transcript.render_list(SYSTEM, s._history, s.transcript.window)
    assert note.text in str(window[1]["content"])
