"""The memory graph's text: what it indexes a text by, what an op is remembered by, and the
message that carries surfaced context into a prompt."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from continuum.hashing import canonical_json
from continuum.messages import Message
from continuum.results import ContextItem
from continuum.tiers.features import entities, numbers, quotes
from continuum.tiers.semantic import split_query


def mentions(text: str) -> set[str]:
    """What the graph indexes a text by: named entities, numbers and quoted strings."""
    found = set(entities(text)) | {q for q in quotes(text) if len(q) <= 80}
    found |= {n for n in numbers(text) if not n.startswith("op:")}
    return found


def output_text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value).decode()


def renderings(value: Any) -> list[str]:
    """The ways an agent may paste a tool result into a prompt: the text itself, or JSON in
    canonical, ``json.dumps`` (key order kept or sorted) and indented form."""
    if isinstance(value, str):
        return [value]
    forms = [output_text(value)]
    for kw in ({}, {"sort_keys": True}, {"indent": 2}, {"indent": 2, "sort_keys": True}):
        with contextlib.suppress(TypeError, ValueError):
            forms.append(json.dumps(value, ensure_ascii=False, **kw))
    return list(dict.fromkeys(forms))


def context_message(items: Sequence[ContextItem]) -> dict[str, str]:
    """The system message that carries surfaced context into a prompt (``inject=True``)."""
    lines = ["Context from earlier runs (may help; verify before relying on it):"]
    for item in items:
        lines.append(f"- Q: {item.question.strip()}\n  A: {item.answer.strip()}")
    return {"role": "system", "content": "\n".join(lines)}


def graph_query(messages: Sequence[Message] | None, prompt: str | None) -> str:
    """The text an op is remembered by: its final user turn (or the last message's text)."""
    context, query = split_query(messages, prompt)
    if context is not None:
        return query
    if prompt is not None:
        return prompt
    return str(messages[-1].get("content") or "") if messages else ""


def input_text(messages: Sequence[Message] | None, prompt: str | None) -> str:
    """Everything an op's input says, for finding which earlier outputs it used."""
    if prompt is not None:
        return prompt
    parts = []
    for m in messages or ():
        parts.append(str(m.get("content") or ""))
        for call in m.get("tool_calls") or ():
            parts.append(canonical_json(call).decode())
    return "\n".join(parts)


def with_context(
    messages: Sequence[Message] | None, prompt: str | None, items: Sequence[ContextItem]
) -> tuple[tuple[Message, ...] | None, str | None]:
    """An op's input with surfaced context placed just before its final turn."""
    note = context_message(items)
    if prompt is not None:
        return None, note["content"] + "\n\n" + prompt
    msgs = list(messages or ())
    return (*msgs[:-1], note, *msgs[-1:]), None
