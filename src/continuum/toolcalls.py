"""Tool calls in model output: found leniently, returned in OpenAI's shape.

Small instruct models do not always use their template's tags. Qwen2.5's template asks for

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Lisbon"}}
    </tool_call>

but the 0.5B/1.5B Coder models often answer with a fenced ```json block, a bare object, or an
object in a tag of their own (``<response>``) instead. :func:`parse_tool_calls` accepts all
four (several ``<tool_call>`` blocks, or a JSON list in a fence, are parallel calls). Only names
of the request's declared tools count: an object naming anything else is text, not a call.
``arguments`` comes out as a JSON *string*, as OpenAI clients expect, whether the model wrote
an object or a string holding one.

A reply that repeats a call it already made (the same name and arguments) is degenerate: a
small model given ``required`` or several tools tends to write the same call until
``max_tokens``. The repetition is never a second call: :func:`parse_tool_calls` keeps the first
of identical calls, and :func:`repeated_call_at` lets decoding end the reply where the repeated
call starts (``GenerationParams.end_repeated_call``), instead of running to the limit.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from continuum.errors import InvalidRequest

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_CLOSED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_WRAPPED = re.compile(r"<(\w+)>\s*(.*?)\s*</\1>", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*\n?(.*?)```", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, serialised

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def normalize_tools(raw: object) -> tuple[dict[str, Any], ...]:
    """OpenAI ``tools`` validated, in a canonical order (by name): the tools are rendered into
    the prompt, so the order a client happens to send them in must not change its tokens."""
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise InvalidRequest("tools must be a list of {'type': 'function', 'function': {...}}")
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(raw):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidRequest(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise InvalidRequest(f"tools[{i}].function.name must match [A-Za-z0-9_-]{{1,64}}")
        if name in out:
            raise InvalidRequest(f"tools[{i}]: the name {name!r} is declared twice")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be a JSON schema object")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise InvalidRequest(f"tools[{i}].function.description must be a string")
        clean: dict[str, Any] = {"name": name}
        if desc is not None:
            clean["description"] = desc
        clean["parameters"] = params
        out[name] = {"type": "function", "function": clean}
    return tuple(out[n] for n in sorted(out))


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as a chat template expects them: a tool call's ``arguments`` arrive from OpenAI
    clients as a JSON *string*, but templates (Qwen's) apply ``tojson`` to them — so they are
    parsed back into objects first, or the model would see them double-encoded."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if not calls:
            out.append(m)
            continue
        fixed = []
        for call in calls:
            fn = dict(call.get("function") or {})
            args = fn.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):  # not JSON: rendered as the text it is
                    fn["arguments"] = json.loads(args) if args.strip() else {}
            fixed.append({**call, "function": fn})
        out.append({**m, "tool_calls": fixed})
    return out


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(obj: object, names: Collection[str]) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
    assert isinstance(fn, dict)
    name = fn.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    args = fn.get("arguments", fn.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


def _calls(payload: str, names: Collection[str]) -> list[ToolCall] | None:
    """The calls ``payload`` (JSON: one object or a list) holds, or None if it holds none."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    calls = [_call(item, names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _distinct(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls`` without repetitions: the first of each (name, arguments) pair."""
    seen: set[tuple[str, str]] = set()
    out = []
    for c in calls:
        if (c.name, c.arguments) not in seen:
            seen.add((c.name, c.arguments))
            out.append(c)
    return out


def _identity(payload: str) -> str | None:
    """A tagged call's identity for repetition: its JSON, canonical; None when it is not JSON."""
    try:
        return json.dumps(json.loads(payload), sort_keys=True)
    except ValueError:
        return None


def repeated_call_at(text: str) -> int:
    """Where ``text``'s first ``<tool_call>`` block that repeats an earlier one (the same JSON)
    starts, -1 when none does. Only closed blocks count: a call still being written is not a
    repetition yet."""
    seen: set[str] = set()
    for m in _CLOSED.finditer(text):
        key = _identity(m.group(1))
        if key is None:
            continue
        if key in seen:
            return m.start()
        seen.add(key)
    return -1


def parse_tool_calls(text: str, names: Collection[str]) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a reply. ``content`` is the text outside the calls, stripped; with no
    call found it is ``text`` unchanged and ``calls`` is empty. Identical calls count once."""
    content, calls = _parse(text, names)
    return content, _distinct(calls)


def _parse(text: str, names: Collection[str]) -> tuple[str, list[ToolCall]]:
    if not names:
        return text, []
    tagged = list(_TAGGED.finditer(text))
    if tagged:
        calls: list[ToolCall] = []
        for i, m in enumerate(tagged):
            found = _calls(m.group(1), names)
            cut = i == len(tagged) - 1 and not m.group(0).endswith("</tool_call>")
            if found is None and cut and calls:
                break  # a reply cut at max_tokens in its last call keeps the calls before it
            if found is None:
                return text, []
            calls += found
        return _TAGGED.sub("", text).strip(), calls
    for m in _FENCED.finditer(text):
        found = _calls(m.group(1).strip(), names)
        if found:
            return (text[: m.start()] + text[m.end() :]).strip(), found
    stripped = text.strip()
    wrapped = _WRAPPED.fullmatch(stripped)  # a call in a tag of the model's own: <response>
    if wrapped is not None:
        stripped = wrapped.group(2)
    if stripped.startswith(("{", "[")):
        found = _calls(stripped, names)
        if found:
            return "", found
    return text, []


def _tag_start(t: str) -> int:
    """The first place in ``t`` where ``<tool_call>`` starts or may yet start (its end when
    there is none)."""
    at = t.find("<")
    while at >= 0:
        if CALL_START.startswith(t[at : at + len(CALL_START)]):
            return at
        at = t.find("<", at + 1)
    return len(t)


def _may_hold_call(rest: str) -> bool:
    """Whether a fence whose text after the opening backticks is ``rest`` is, or may yet be, a
    fenced call (:data:`_FENCED`: an optional ``json``/``tool_call`` name, whitespace, then a
    JSON object or list)."""
    for name in ("json", "tool_call", ""):
        if not rest.startswith(name):
            if name.startswith(rest):
                return True  # the name is still being written
            continue
        after = rest[len(name) :].lstrip()
        if not after or after[0] in "{[":
            return True
    return False


@dataclass(frozen=True, slots=True)
class ToolParsing:
    """A chat reply is checked for calls to these declared tools; ``parallel`` False keeps
    only the first call."""

    names: frozenset[str]
    parallel: bool = True

    def streamable(self, text: str) -> int:
        """How much of ``text.lstrip()``, a reply still being written, is content whatever
        comes next. It ends where a call could still start: at the first ``<`` that could open
        ``<tool_call>``, at a fence that is or may yet be a call (```` ```json ````, a bare
        ```` ``` ```` followed by ``{``/``[``, or one not yet closed or named), at backticks
        that may yet open a fence; a fence named otherwise (```` ```bash ````), or closed and
        not a call, is content through its end. Trailing whitespace is held too (content is
        stripped around a call), and none of it streams when the reply opens like a bare or
        wrapped call (``{``, ``[``, ``<``). :meth:`split`'s content then always starts with
        what was streamed (once stripped): see :func:`unsent`."""
        t = text.lstrip()
        if not t or t[0] in "{[<":
            return 0
        limit = _tag_start(t)
        i = 0
        while i < limit:
            b = t.find("`", i, limit)
            if b < 0:
                break
            if not t.startswith("```", b):
                if t[b:].strip("`"):  # inline code: text
                    i = b + 1
                    continue
                limit = b  # backticks at the end: a fence may be opening
                break
            end = self._fence_end(t, b)
            if end is None:
                limit = b
                break
            i = end
        return len(t[:limit].rstrip())

    def _fence_end(self, t: str, b: int) -> int | None:
        """Where the fence opening at ``b`` ends as text, or None while it is, or may yet be,
        a call. A fence named for something else is text to its close (to the end while open)."""
        rest = t[b + 3 :]
        closed = _FENCED.match(t, b)
        if not _may_hold_call(rest):
            return closed.end() if closed is not None else len(t)
        if closed is None or _calls(closed.group(1).strip(), self.names) is not None:
            return None
        return closed.end()

    def split(self, text: str, finish: str) -> tuple[str | None, list[ToolCall], str]:
        """(content, calls, finish_reason) of a reply: ``tool_calls`` when it made any."""
        content, calls = parse_tool_calls(text, self.names)
        if not calls:
            return text, [], finish
        return content or None, calls if self.parallel else calls[:1], "tool_calls"


def unsent(content: str | None, streamed: str) -> str | None:
    """What of a reply's ``content`` (:meth:`ToolParsing.split`'s) is still to send after
    ``streamed`` went out as :meth:`ToolParsing.streamable` allowed."""
    if not streamed:
        return content
    c = (content or "").lstrip()
    assert c.startswith(streamed), "streamed text is always the content's beginning"
    return c[len(streamed) :]


__all__ = [
    "CALL_END",
    "ToolCall",
    "ToolParsing",
    "new_call_id",
    "normalize_tools",
    "parse_tool_calls",
    "repeated_call_at",
    "template_messages",
    "unsent",
]
