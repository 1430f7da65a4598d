"""The transcript renderer: a session's window as canonical token segments, rendered once.

A *target* is the canonical prompt of a window: the wake tokens (BOS, template preamble, system
prompt and continuity), then one token segment per message, then the generation prompt. It is
built through the model's own chat template, message by message: segment ``j`` is the text the
template adds when message ``j`` is appended, which must leave everything before it unchanged
(a template that rewrites earlier text is refused with ``ChatTemplateError``, never guessed).
An assistant message the model generated keeps its token ids exactly as generated.

The renderer carries its work forward: the segments of the last committed window, and the text
they were rendered from, are cached; a turn renders only the messages after the cache. Nothing
here touches KV: it is pure given the tokenizer and the template.

Window invariant: a rendered conversation is always ``[system] + history[window:]`` where
``history[window]`` is a user message (or ``window == 0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from continuum.backends.base import SequenceBackend
from continuum.errors import ChatTemplateError, ContextOverflow
from continuum.messages import Message
from continuum.store.sqlite import ContinuityNote, StoredMessage
from continuum.toolcalls import template_messages

Tools = tuple[dict[str, Any], ...] | None

SENTINEL = "\u2063\u2063continuum-next-message\u2063\u2063"
NOTE_HEADER = "Summary of our conversation before this message (earlier turns were compacted):"


def with_note(message: Message, note: str) -> Message:
    """``message`` (a window's first, a user message) as rendered with a continuity note in
    front: the model reads the summary first, then the message itself."""
    return {**message, "content": f"{NOTE_HEADER}\n{note}\n\n{message['content']}"}


@dataclass(frozen=True, slots=True)
class Target:
    """The canonical prompt of a window: wake tokens, then one token segment per message."""

    window: int
    wake: tuple[int, ...]
    segments: tuple[tuple[int, ...], ...]
    generation_prompt: tuple[int, ...]
    rendered: str  # the window's text without the generation prompt
    ends: tuple[int, ...]  # end offset of each message's segment in ``rendered``
    generation_text: str

    def tokens(self) -> list[int]:
        out = list(self.wake)
        for seg in self.segments:
            out.extend(seg)
        return out

    def full(self) -> list[int]:
        """The whole prompt: the window's tokens and the generation prompt."""
        return [*self.tokens(), *self.generation_prompt]

    def prompt_len(self) -> int:
        return len(self.wake) + sum(map(len, self.segments)) + len(self.generation_prompt)

    def verified_end(self, n_segments: int) -> int:
        return len(self.wake) + sum(len(s) for s in self.segments[:n_segments])


@dataclass(frozen=True, slots=True)
class ReplySegment:
    """A generated reply's segment tokens and the rendered window text that ends with it."""

    tokens: tuple[int, ...]
    rendered: str


class Transcript:
    """Renders a session's windows; caches the segments of the last committed one.

    ``system`` and ``tools`` are the system prompt and tools the cache was rendered for; the
    cache (``wake``, ``segments``, ``ends``, ``rendered``) always describes ``[system] +
    history[window:]`` of the committed history, or is empty. ``turn_tools`` are the tools
    the turn in progress renders with (the session sets them): the tools are part of the
    prompt's preamble, like the system prompt, so other tools are another wake."""

    def __init__(
        self, backend: SequenceBackend, continuity: str | None, clock: datetime | None = None
    ) -> None:
        self._backend = backend
        self.continuity = continuity
        # the time a template's strftime_now reads: the session's, fixed, so a dated preamble
        # renders the same every time (and the KV that holds it stays valid)
        self.clock = clock or datetime.now()
        self.system: str | None = None
        self.tools: Tools = None
        self.turn_tools: Tools = None
        self.window = 0
        self.wake: tuple[int, ...] | None = None
        self.segments: list[tuple[int, ...]] = []
        self.ends: list[int] = []
        self.rendered = ""
        # a compacted session's summary of history[:note.window], rendered in front of the
        # window's first message (after the wake prefix) while the window starts at or after it
        self.note: ContinuityNote | None = None

    # -- rendering -----------------------------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """The chat template over ``messages`` with this turn's tools."""
        return self._backend.chat_format.render(
            template_messages(messages),
            add_generation_prompt,
            tools=self.turn_tools,
            now=self.clock,
        )

    def render_list(
        self, system: str | None, hist: list[StoredMessage], window: int
    ) -> list[Message]:
        out: list[Message] = []
        if system is not None:
            content = system + (f"\n\n{self.continuity}" if self.continuity else "")
            out.append({"role": "system", "content": content})
        kept = [m.message for m in hist[window:]]
        note = self.note
        if note is not None and kept and window >= note.window:
            kept[0] = with_note(kept[0], note.text)
        return out + kept

    def wake_tokens(self, system: str | None) -> tuple[int, ...]:
        """Tokens of the stable identity: BOS, template preamble, system prompt, continuity."""
        b = self._backend
        toks = b.tokenize(self.render(self.render_list(system, [], 0), False))
        if b.add_bos and (not toks or toks[0] != b.bos_id):
            toks.insert(0, b.bos_id)
        return tuple(toks)

    def same_wake(self, system: str | None) -> bool:
        return system == self.system and self.tools == self.turn_tools and self.wake is not None

    def target(
        self, system: str | None, hist: list[StoredMessage], window: int, n_cached: int
    ) -> Target:
        """Render the window into token segments, reusing the first ``n_cached`` cached ones."""
        b = self._backend
        same = self.same_wake(system)
        wake = self.wake if same and self.wake is not None else self.wake_tokens(system)
        render = self.render_list(system, hist, window)
        offset = 1 if system is not None else 0
        if not (same and window == self.window):
            n_cached = 0
        n_cached = min(n_cached, len(self.segments))
        segs, ends = self.segments[:n_cached], self.ends[:n_cached]
        if n_cached:
            prev = self.rendered[: ends[-1]]
        else:
            prev = self.render(render[:offset], add_generation_prompt=False)
        for j in range(offset + n_cached, len(render)):
            cur = self.render(render[: j + 1], add_generation_prompt=False)
            if not cur.startswith(prev):
                b.chat_format.segments(render[: j + 1])  # raises ChatTemplateError, details
                raise ChatTemplateError(f"the chat template rewrites text before message {j}")
            segs.append(self._segment_tokens(render, j, prev, cur, hist[window + j - offset]))
            ends.append(len(cur))
            prev = cur
        with_gen = self.render(render, add_generation_prompt=True)
        if not with_gen.startswith(prev):
            b.chat_format.generation_prompt(render)  # raises ChatTemplateError, details
            raise ChatTemplateError("the generation prompt rewrites earlier text")
        gen_text = with_gen[len(prev) :]
        return Target(
            window, wake, tuple(segs), tuple(b.tokenize(gen_text)), prev, tuple(ends), gen_text
        )

    def _segment_tokens(
        self, render: list[Message], j: int, prev: str, cur: str, stored: StoredMessage
    ) -> tuple[int, ...]:
        b = self._backend
        text = cur[len(prev) :]
        if stored.gen_tokens is not None and stored.gen_model == b.model.digest:
            header = self.render(render[:j], add_generation_prompt=True)[len(prev) :]
            close = self._close(text, header, render[:j], prev, stored.message)
            if close is not None:
                return (*b.tokenize(header), *stored.gen_tokens, *b.tokenize(close))
        return tuple(b.tokenize(text))

    def _close(
        self, text: str, header: str, before: list[Message], prev: str, reply: Message
    ) -> str | None:
        """What the template puts after a generated reply's own tokens in its segment
        ``text`` (which opens with the generation prompt ``header``), or None when the
        generated tokens cannot stand for the reply. A reply of plain text keeps them only if
        the template renders the content unchanged; a reply that made tool calls keeps them
        as generated (the template's rendering of the calls may space them differently, but
        the model said what it said) when the segment opens with the header and ends as any
        assistant message does."""
        if not reply.get("tool_calls"):
            split = self._backend.chat_format.split_assistant(text, header, reply["content"])
            return split.close if split is not None else None
        plain = self.render([*before, {"role": "assistant", "content": SENTINEL}], False)
        close = plain[len(prev) :].partition(SENTINEL)[2]
        if SENTINEL not in plain or not (text.startswith(header) and text.endswith(close)):
            return None
        return close if len(header) + len(close) <= len(text) else None

    def fit(
        self,
        system: str | None,
        hist: list[StoredMessage],
        window: int,
        max_tokens: int,
        high_water: int,
        low_water: int | None = None,
    ) -> Target:
        """The earliest window start (a user message) whose prompt + max_tokens fits under
        ``low_water`` (the mark a moving window goes down to, so that it moves again only
        after several turns; default the high-water mark); else the earliest that fits under
        the high-water mark; else the latest one if it fits the context; else ContextOverflow."""
        starts = [window] + [
            i for i, m in enumerate(hist) if i > window and m.message["role"] == "user"
        ]
        for mark in dict.fromkeys((low_water or high_water, high_water)):
            lo, hi = 0, len(starts) - 1
            best: Target | None = None
            while lo <= hi:  # prompt length shrinks as the window start moves later
                mid = (lo + hi) // 2
                t = self.target(system, hist, starts[mid], 0)
                if t.prompt_len() + max_tokens <= mark:
                    best, hi = t, mid - 1
                else:
                    lo = mid + 1
            if best is not None:
                return best
        last = self.target(system, hist, starts[-1], 0)
        n_ctx = self._backend.n_ctx
        if last.prompt_len() + 1 > n_ctx:
            raise ContextOverflow(last.prompt_len() + 1, n_ctx, "the last message with its context")
        return last

    def reply_segment(
        self, system: str | None, hist: list[StoredMessage], target: Target, reply: StoredMessage
    ) -> ReplySegment | None:
        """The reply's segment, so the next turn renders only what is new; None if the template
        rewrote the reply (it is rendered next turn). The header is the generation prompt just
        decoded; the content tokens are as generated."""
        before = self.render_list(system, hist, target.window)
        cur = self.render([*before, reply.message], add_generation_prompt=False)
        if not cur.startswith(target.rendered) or reply.gen_tokens is None:
            return None
        text = cur[len(target.rendered) :]
        close = self._close(text, target.generation_text, before, target.rendered, reply.message)
        if close is None:
            return None
        tokens = (*target.generation_prompt, *reply.gen_tokens, *self._backend.tokenize(close))
        return ReplySegment(tokens, cur)

    # -- the committed window ----------------------------------------------------------------
    def remember(self, system: str | None, target: Target, reply: ReplySegment | None) -> None:
        self.system, self.tools = system, self.turn_tools
        self.wake = target.wake
        self.window = target.window
        self.segments = list(target.segments)
        self.ends = list(target.ends)
        self.rendered = target.rendered
        if reply is not None:
            self.segments.append(reply.tokens)
            self.ends.append(len(reply.rendered))
            self.rendered = reply.rendered

    def reset(self, system: str | None, wake: tuple[int, ...]) -> None:
        """An empty window after the wake phase."""
        self.system, self.wake, self.window = system, wake, 0
        self.tools = self.turn_tools
        self.segments, self.ends, self.rendered = [], [], ""

    def forget_after(self, n_cached: int, keep_cache: bool) -> None:
        """A failed turn: keep only the cached segments that still describe committed history."""
        if keep_cache:
            del self.segments[n_cached:], self.ends[n_cached:]
        else:
            self.segments, self.ends = [], []

    def base_tokens(self, system: str | None, hist: list[StoredMessage]) -> list[int]:
        """Tokens of the committed conversation: the next message's segment starts after them.
        From the cache when it covers the whole history (no rendering), else rendered."""
        if self.same_wake(system) and len(self.segments) == len(hist) - self.window:
            assert self.wake is not None
            out = list(self.wake)
            for seg in self.segments:
                out.extend(seg)
            return out
        return self.target(system, hist, self.window, len(self.segments)).tokens()

    def header_for(self, system: str | None, hist: list[StoredMessage], message: Message) -> str:
        """The template text that opens ``message``'s segment after the committed history."""
        render = self.render_list(system, hist, self.window)
        if self.same_wake(system) and len(self.segments) == len(hist) - self.window:
            prev = self.rendered or self.render(render, add_generation_prompt=False)
        else:
            prev = self.render(render, add_generation_prompt=False)
        cur = self.render([*render, {**message, "content": SENTINEL}], add_generation_prompt=False)
        if not cur.startswith(prev) or SENTINEL not in cur:
            return ""
        return cur[len(prev) : cur.index(SENTINEL)]
