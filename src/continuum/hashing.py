"""Stable, tagged digests for anything persisted or compared across processes.

Never Python's ``hash()``: these digests must be equal in every process and on every machine.
Every digest string is prefixed with its algorithm and scheme version so a change of scheme can
never be confused with a match.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any, NewType

MessageHash = NewType("MessageHash", str)

SCHEME = "b2v1"


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys, no whitespace, UTF-8: equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(data: bytes, *, person: bytes = b"") -> str:
    """A tagged blake2b-128 digest; ``person`` separates hash domains."""
    h = hashlib.blake2b(data, digest_size=16, person=person[:16])
    return f"{SCHEME}:{h.hexdigest()}"


def _call_identity(call: object) -> object:
    """A tool call by id, name and arguments *as values*: a client that re-serialises the
    arguments string (other spacing, other key order) sends the same call."""
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if not isinstance(fn, dict):
        fn = {}
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):  # not JSON: compared as the text it is
            args = json.loads(args) if args.strip() else {}
    return {"id": call.get("id"), "name": fn.get("name"), "arguments": args}


def message_identity(message: dict[str, Any]) -> MessageHash:
    """Identity of one chat message: role, content, name and tool-call ids/arguments.

    Two messages with the same identity render to the same tokens, so a resident segment whose
    identity matches can be kept (DESIGN.md §3.2).
    """
    calls = message.get("tool_calls")
    fields = {
        "role": message.get("role"),
        "content": message.get("content"),
        "name": message.get("name"),
        "tool_call_id": message.get("tool_call_id"),
        "tool_calls": [_call_identity(c) for c in calls] if calls else calls,
    }
    return MessageHash(digest(canonical_json(fields), person=b"cont-msg"))


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
