"""Canonical form and cache keys (DESIGN.md §3.6).

Canonicalisation rules — applied to the *key* only: the model always receives the caller's own
text (DESIGN.md §3.13), and a stored answer is served to a request whose canonical form equals
that of the request that produced it:

1. Line endings: ``\\r\\n`` and lone ``\\r`` become ``\\n``.
2. Trailing spaces and tabs at the end of every line are removed (leading whitespace, blank lines
   and inner spacing are kept: they change what code and lists mean).
3. Tool-call arguments that are JSON are re-serialised with sorted keys and no insignificant
   whitespace; arguments that are not valid JSON are left as text (rules 1-2 still apply).
4. Message fields are compared by value, not by dict key order; text parts are joined.

Prefix length is measured on the canonical token sequence. A key is a tagged digest over:
the tenant namespace, the backend name and model identity (file digest), the op name, every
decode parameter (omitted ones at their defaults), and the canonical tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NewType

from continuum.hashing import canonical_json, digest
from continuum.messages import Message
from continuum.params import GenerationParams

OpKey = NewType("OpKey", str)

_TRAILING = re.compile(r"[ \t]+$", re.MULTILINE)


def canonical_text(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _TRAILING.sub("", text)


def _canonical_arguments(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return canonical_text(arguments)
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_messages(messages: Sequence[Message]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        c: Message = {k: v for k, v in m.items() if v is not None}
        c["content"] = canonical_text(m.get("content") or "")
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = dict(call)
                fn = call.get("function")
                if isinstance(fn, dict) and "arguments" in fn:
                    call["function"] = {**fn, "arguments": _canonical_arguments(fn["arguments"])}
                calls.append(call)
            c["tool_calls"] = calls
        out.append(c)
    return out


def op_key(
    *,
    namespace: str,
    backend: str,
    model: str,
    op_name: str,
    params: GenerationParams,
    tokens: Sequence[int],
) -> OpKey:
    head = canonical_json(
        {
            "ns": namespace,
            "backend": backend,
            "model": model,
            "op": op_name,
            "params": params.key_fields(),
        }
    )
    body = ",".join(map(str, tokens)).encode()  # the same bytes as per-token encoding, 3x faster
    return OpKey(digest(head + b"|" + body, person=b"cont-opkey"))


def tool_key(namespace: str, name: str, args: dict[str, Any]) -> OpKey:
    return OpKey(
        digest(canonical_json({"ns": namespace, "tool": name, "args": args}), person=b"cont-tool")
    )
