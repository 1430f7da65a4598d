"""The transcript renderer, without a model: segments, the cache it carries forward, and how
often it renders the template.

The tokenizer here is one token per character (a stand-in for the vocabulary, not for a model:
nothing is decoded); the chat template is the real built-in ChatML template."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from continuum.backends.chat_format import ChatFormat
from continuum.errors import ChatTemplateError
from continuum.hashing import message_identity
from continuum.stateful.transcript import Transcript
from continuum.store.sqlite import StoredMessage


@dataclass
class _Model:
    digest: str = "sha256:test"


class CountingFormat(ChatFormat):
    def __init__(self, source: str | None = None) -> None:
        base = ChatFormat.builtin("chatml")
        super().__init__("chatml", source or base.source)
        self.renders = 0

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kw: Any) -> str:
        self.renders += 1
        return super().render(messages, add_generation_prompt, **kw)


@dataclass
class CharVocab:
    chat_format: CountingFormat = field(default_factory=CountingFormat)
    model: _Model = field(default_factory=_Model)
    n_ctx: int = 4096
    add_bos: bool = False
    bos_id: int = 0

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return [ord(c) for c in text]


def stored(role: str, content: str, gen: tuple[int, ...] | None = None) -> StoredMessage:
    m = {"role": role, "content": content}
    return StoredMessage(m, message_identity(m), gen, "sha256:test" if gen else None)


def text(tokens: tuple[int, ...] | list[int]) -> str:
    return "".join(map(chr, tokens))


def test_segments_concatenate_to_the_rendered_window() -> None:
    vocab = CharVocab()
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    hist = [stored("user", "hi"), stored("assistant", "hello"), stored("user", "bye")]
    t = tr.target("Be brief.", hist, 0, 0)
    fmt = ChatFormat.builtin("chatml")
    msgs = [{"role": "system", "content": "Be brief."}] + [m.message for m in hist]
    assert text(t.tokens()) == fmt.render(msgs, add_generation_prompt=False)
    assert text(t.full()) == fmt.render(msgs, add_generation_prompt=True)
    assert len(t.segments) == 3 and text(t.segments[0]).endswith("hi<|im_end|>\n")


def test_generated_tokens_are_kept_as_generated() -> None:
    vocab = CharVocab()
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    gen = (1, 2, 3)  # ids the model produced for "hello" (not its re-tokenization)
    hist = [stored("user", "hi"), stored("assistant", "hello", gen), stored("user", "x")]
    seg = tr.target(None, hist, 0, 0).segments[1]
    assert seg == (*map(ord, "<|im_start|>assistant\n"), *gen, *map(ord, "<|im_end|>\n"))


def test_a_warm_turn_renders_only_what_is_new() -> None:
    vocab = CharVocab()
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    hist = [stored("user", "hi")]
    t = tr.target("S", hist, 0, 0)
    reply = stored("assistant", "ok", (7, 8))
    seg = tr.reply_segment("S", hist, t, reply)
    assert seg is not None
    tr.remember("S", t, seg)
    hist = [*hist, reply]
    vocab.chat_format.renders = 0
    base = tr.base_tokens("S", hist)  # from the cache: no render at all
    assert vocab.chat_format.renders == 0 and base == [*t.tokens(), *seg.tokens]
    nxt = [*hist, stored("user", "more")]
    t2 = tr.target("S", nxt, 0, len(hist))  # two cached segments reused
    assert t2.segments[:2] == (*t.segments, seg.tokens)
    assert vocab.chat_format.renders == 2  # the new message, and the generation prompt


def test_fit_moves_the_window_to_a_user_message_under_the_high_water_mark() -> None:
    vocab = CharVocab()
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    hist = [stored("user" if i % 2 == 0 else "assistant", "x" * 50) for i in range(10)]
    whole = tr.target("S", hist, 0, 0).prompt_len()
    t = tr.fit("S", hist, 0, max_tokens=10, high_water=whole // 2)
    assert t.window > 0 and hist[t.window].message["role"] == "user"
    assert t.prompt_len() + 10 <= whole // 2


def test_a_moving_window_goes_down_to_the_low_water_mark_where_it_can() -> None:
    vocab = CharVocab()
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    hist = [stored("user" if i % 2 == 0 else "assistant", "x" * 50) for i in range(12)]
    whole = tr.target("S", hist, 0, 0).prompt_len()
    high = tr.fit("S", hist, 0, max_tokens=10, high_water=whole - 1)
    low = tr.fit("S", hist, 0, max_tokens=10, high_water=whole - 1, low_water=whole // 2)
    assert hist[low.window].message["role"] == "user"
    assert low.window > high.window  # further: room for several turns before the next move
    assert low.prompt_len() + 10 <= whole // 2 < high.prompt_len() + 10
    # nothing fits under a low-water mark that small: the high-water mark decides alone
    wake_only = tr.target("S", hist, len(hist) - 2, 0).prompt_len() + 10
    tiny = tr.fit("S", hist, 0, max_tokens=10, high_water=whole - 1, low_water=wake_only - 1)
    assert tiny.window == high.window


def test_a_template_that_rewrites_earlier_text_is_refused() -> None:
    # renders only the last message: appending one rewrites everything before it
    last_only = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    vocab = CharVocab(chat_format=CountingFormat(last_only))
    tr = Transcript(vocab, continuity=None)  # type: ignore[arg-type]
    with pytest.raises(ChatTemplateError):
        tr.target(None, [stored("user", "a"), stored("assistant", "b")], 0, 0)


def test_a_dated_template_renders_the_same_every_time_for_a_session() -> None:
    """A template that prints the time (``strftime_now``, as Llama 3's prints today's date):
    a transcript renders it with its session's clock, so the preamble never changes under it."""
    base = ChatFormat.builtin("chatml").source
    dated = CharVocab(chat_format=CountingFormat("{{ strftime_now('%H:%M:%S.%f') }}\n" + base))
    when = datetime(2026, 12, 1, 23, 59, 59, 999999)
    tr = Transcript(dated, continuity=None, clock=when)  # type: ignore[arg-type]
    hist = [stored("user", "a"), stored("assistant", "b"), stored("user", "c")]
    first = tr.target("sys", hist, 0, 0)
    again = tr.target("sys", hist, 0, 0)
    assert first.full() == again.full() and text(first.wake).startswith("23:59:59.999999\n")
    # without a clock, the template reads the time of each render: two renders differ
    fmt = dated.chat_format
    assert fmt.render([{"role": "user", "content": "x"}], False) != fmt.render(
        [{"role": "user", "content": "x"}], False
    )
