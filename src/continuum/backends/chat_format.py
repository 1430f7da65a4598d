"""Chat formats: render OpenAI-shaped messages to model text, and split it per message.

A format is a Jinja2 template — the GGUF's own ``tokenizer.chat_template`` when it has one,
else a named built-in (``gemma``, ``chatml``, ``llama3``). Stateful sessions need more than one
rendered string: they need each message's own *segment* of text, so a resident prefix can be
verified and kept message by message. Segments come from incremental rendering —
``segment[i] = render(messages[:i+1])[len(render(messages[:i])):]`` — which is only sound when
the template is prefix-stable; :meth:`ChatFormat.segments` checks that and raises
:class:`ChatTemplateError` when it is not, rather than guessing.

The built-in Gemma format renders a leading system message as the opening of the first user
turn (as Gemma's official template does), but ends the system segment before the user content,
so the wake phase can prefill the system prompt before any user message exists.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from continuum.errors import ChatTemplateError, InvalidMessage

GEMMA = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<start_of_turn>user\\n' + message['content'] + '\\n\\n' }}"
    "{% else %}"
    "{% set after_system = loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'system' %}"
    "{% if after_system and message['role'] != 'assistant' %}"
    "{% elif after_system %}{{ '<end_of_turn>\\n<start_of_turn>model\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<start_of_turn>model\\n' }}"
    "{% else %}{{ '<start_of_turn>user\\n' }}{% endif %}"
    "{{ message['content'] }}<end_of_turn>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if messages and messages[-1]['role'] == 'system' %}{{ '<end_of_turn>\\n' }}{% endif %}"
    "{{ '<start_of_turn>model\\n' }}"
    "{% endif %}"
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

BUILTIN_TEMPLATES = {"gemma": GEMMA, "chatml": CHATML, "llama3": LLAMA3}


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``tojson`` as transformers' ``apply_chat_template`` defines it — the rendering models were
    trained on: keys in their order, no HTML escaping (Jinja's own filter sorts keys and turns
    ``<`` into ``\u003c``)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _clock(now: _dt.datetime | None) -> Callable[[str], str]:
    """The template's ``strftime_now``: the time given (a session's, frozen, so every render of
    its conversation agrees), or the time of the call."""
    return lambda fmt: (now or _dt.datetime.now()).strftime(fmt)


@dataclass(frozen=True, slots=True)
class AssistantSplit:
    header: str
    content: str
    close: str


class ChatFormat:
    """One chat template, compiled once."""

    def __init__(self, name: str, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _clock(None)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(
                f"chat template {name!r} does not compile: {e}. "
                "Pick a built-in format with chat_format='gemma'|'chatml'|'llama3'."
            ) from None

    @classmethod
    def builtin(cls, name: str, *, bos_token: str = "", eos_token: str = "") -> ChatFormat:
        try:
            source = BUILTIN_TEMPLATES[name]
        except KeyError:
            raise ChatTemplateError(
                f"unknown chat format {name!r}; built-ins are {', '.join(BUILTIN_TEMPLATES)}"
            ) from None
        return cls(name, source, bos_token=bos_token, eos_token=eos_token)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        now: _dt.datetime | None = None,
    ) -> str:
        """The template over ``messages``; ``now`` is the time its ``strftime_now`` reads (a
        session passes its own, so a date in the preamble cannot change between renders)."""
        if not messages:
            # the empty conversation is the empty text for a template that cannot render one
            # (Qwen's reads messages[0]); a template that renders a preamble for it keeps it
            try:
                return self._render(messages, add_generation_prompt, tools, now)
            except ChatTemplateError:
                return ""
        return self._render(messages, add_generation_prompt, tools, now)

    def _render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[dict[str, Any]] | None,
        now: _dt.datetime | None,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=list(tools) if tools else None,
                strftime_now=_clock(now),
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # a third-party template can fail in any way
            raise ChatTemplateError(f"chat template {self.name!r} failed to render: {e}") from None

    def segments(self, messages: list[dict[str, Any]]) -> list[str]:
        """Each message's own text; their concatenation is the rendered conversation."""
        out: list[str] = []
        prev = self.render([], add_generation_prompt=False) if messages else ""
        if messages:
            out_first_prefix = prev
        for i in range(len(messages)):
            cur = self.render(messages[: i + 1], add_generation_prompt=False)
            if not cur.startswith(prev):
                raise ChatTemplateError(
                    f"chat template {self.name!r} is not prefix-stable at message {i}: rendering "
                    "one more message rewrote earlier text, so resident state cannot be verified "
                    "per message. Use a built-in format (chat_format='chatml' etc.)."
                )
            out.append(cur[len(prev) :])
            prev = cur
        if messages:
            out[0] = out_first_prefix + out[0]
        return out

    def generation_prompt(self, messages: list[dict[str, Any]]) -> str:
        """Text that opens the assistant's reply after ``messages``."""
        without = self.render(messages, add_generation_prompt=False)
        with_ = self.render(messages, add_generation_prompt=True)
        if not with_.startswith(without):
            raise ChatTemplateError(
                f"chat template {self.name!r}: the generation prompt rewrites earlier text"
            )
        return with_[len(without) :]

    @functools.cached_property
    def system_anywhere(self) -> bool:
        """The template renders a system message that follows other messages as a message of
        its own, prefix-stable (Qwen's ChatML does; Gemma 3's refuses any role order but
        alternating user/model turns). Probed once, by rendering such a conversation."""
        parts = ("\u2063first\u2063", "\u2063second\u2063", "\u2063later\u2063")
        probe = [
            {"role": "system", "content": parts[0]},
            {"role": "system", "content": parts[1]},  # Codex sends two in a row
            {"role": "user", "content": "u"},
            {"role": "system", "content": parts[2]},
            {"role": "user", "content": "v"},
        ]
        try:
            text = "".join(self.segments(probe))
        except ChatTemplateError:
            return False
        at = [text.find(p) for p in parts]
        return -1 not in at and at == sorted(at)

    def fit_systems(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` as this template takes them. System (developer) messages after the
        first message stay where they are when the template renders them there
        (:attr:`system_anywhere`); otherwise every system message is folded, in order, into
        one leading system message, its parts a blank line apart."""
        systems = [m for m in messages if m["role"] == "system"]
        if not systems or self.system_anywhere:
            return messages
        if len(systems) == 1 and messages[0] is systems[0]:
            return messages
        merged = {"role": "system", "content": "\n\n".join(m["content"] for m in systems)}
        return [merged, *(m for m in messages if m["role"] != "system")]

    def check_systems(self, history: Sequence[dict[str, Any]]) -> None:
        """``InvalidMessage`` for a system message in ``history`` (the messages after a
        session's system prompt) when this template cannot render one there."""
        if self.system_anywhere:
            return
        for i, m in enumerate(history):
            if m["role"] == "system":
                why = (
                    f"'system' after other messages cannot be rendered by chat template "
                    f"{self.name!r}: send system messages first (or as the session's system "
                    "prompt)"
                )
                raise InvalidMessage(i, "role", why)

    @property
    def tool_call_tags(self) -> bool:
        """The template asks for tool calls inside ``<tool_call>`` tags (Qwen2.5, Hermes)."""
        return "<tool_call>" in self.source

    def split_assistant(self, segment: str, header: str, content: str) -> AssistantSplit | None:
        """Split an assistant segment into header + content + close, or None if the template
        changed the content (e.g. trimmed it), in which case generated tokens cannot be kept."""
        if not segment.startswith(header):
            return None
        rest = segment[len(header) :]
        if not rest.startswith(content):
            return None
        return AssistantSplit(header, content, rest[len(content) :])
