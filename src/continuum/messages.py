"""OpenAI-shaped chat messages: validation and normalisation at the edge.

A message list is validated in full before anything changes, so bad input loses nothing.
Normalised messages are plain dicts with ``role`` and string ``content`` (text parts are joined)
plus the optional ``name``, ``tool_calls`` and ``tool_call_id``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from continuum.errors import InvalidMessage, InvalidRequest

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, Any]


def _check_text(index: int, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(index, field, f"must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidMessage(
            index, field, f"is not valid UTF-8 (undecodable character at offset {e.start})"
        ) from None
    return value


def _content(index: int, raw: Mapping[str, Any]) -> str:
    content = raw.get("content")
    if content is None:
        if raw.get("role") == "assistant" and raw.get("tool_calls"):
            return ""
        raise InvalidMessage(index, "content", "is missing")
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InvalidMessage(
                    index, f"content[{j}]", "must be a text part {'type': 'text', 'text': str}"
                )
            parts.append(_check_text(index, f"content[{j}].text", part.get("text")))
        return "".join(parts)
    return _check_text(index, "content", content)


def normalize_message(index: int, raw: object) -> Message:
    if not isinstance(raw, Mapping):
        raise InvalidMessage(index, "message", f"must be an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidMessage(index, "role", f"{role!r} is not one of {', '.join(ROLES)}")
    msg: Message = {"role": role, "content": _content(index, raw)}
    if raw.get("name") is not None:
        msg["name"] = _check_text(index, "name", raw["name"])
    if raw.get("tool_call_id") is not None:
        msg["tool_call_id"] = _check_text(index, "tool_call_id", raw["tool_call_id"])
    if raw.get("tool_calls") is not None:
        calls = raw["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
            raise InvalidMessage(index, "tool_calls", "must be a list of objects")
        msg["tool_calls"] = [dict(c) for c in calls]
    return msg


def normalize_messages(raw: object, *, allow_empty: bool = False) -> list[Message]:
    """Validate a whole message list; raise before changing anything."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise InvalidRequest(
            f"messages must be a list of message objects, got {type(raw).__name__}"
        )
    if not raw and not allow_empty:
        raise InvalidRequest("messages is empty: send at least one message")
    return [normalize_message(i, m) for i, m in enumerate(raw)]
