"""Constrained decoding: what shape a reply must take, as a decode parameter.

A constraint is part of :class:`~continuum.params.GenerationParams` (so of every cache key) as
canonical JSON text, one of:

- ``{"type": "json_object"}``: any JSON object (``response_format: json_object``);
- ``{"type": "json_schema", "schema": {...}}``: JSON matching the schema (``json_schema``);
- ``{"type": "tool_calls", "tools": [{"name", "parameters"}], "parallel": bool}``: one call
  (or several, when ``parallel``) to the listed tools, arguments matching each tool's schema
  (``tool_choice: required`` or a named function). With ``"lazy": true`` (``tool_choice:
  auto``) the reply is free until the model starts a call (its template's call tag, or a tag
  small models put a call in instead); from there the call must be one of these tools, as
  llama-server's lazy grammars do.

It says *what* is allowed, not *how*: a backend turns it into its own mechanism (llama.cpp: a
GBNF grammar in the model's tool-call format, see :mod:`continuum.backends.grammar`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from continuum.errors import InvalidRequest
from continuum.hashing import canonical_json


def _text(value: dict[str, Any]) -> str:
    return canonical_json(value).decode()


KINDS = ("json_object", "json_schema", "tool_calls")


def json_object() -> str:
    return _text({"type": "json_object"})


def json_schema(schema: object) -> str:
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object")
    return _text({"type": "json_schema", "schema": schema})


def tool_calls(
    tools: Sequence[dict[str, Any]], names: Sequence[str], *, parallel: bool, lazy: bool = False
) -> str:
    """A forced call to one of ``names`` among the (normalised, OpenAI-shaped) ``tools``;
    ``lazy``: only once the model starts a call."""
    declared = {t["function"]["name"]: t["function"] for t in tools}
    missing = [n for n in names if n not in declared]
    if missing:
        raise InvalidRequest(
            f"tool_choice names {missing[0]!r}, which is not among the request's tools "
            f"({', '.join(sorted(declared)) or 'none'})"
        )
    allowed = [{"name": n, "parameters": declared[n]["parameters"]} for n in sorted(set(names))]
    spec = {"type": "tool_calls", "tools": allowed, "parallel": bool(parallel)}
    return _text({**spec, "lazy": True} if lazy else spec)


def parse(constraint: str) -> dict[str, Any]:
    """The constraint's JSON, checked; a malformed one is an ``InvalidRequest``."""
    try:
        data: dict[str, Any] = json.loads(constraint)
    except ValueError:
        raise InvalidRequest(f"constraint is not JSON: {constraint[:80]!r}") from None
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in KINDS:
        raise InvalidRequest(f"constraint type must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "json_schema" and not isinstance(data.get("schema"), dict):
        raise InvalidRequest("a json_schema constraint needs a schema object")
    if kind == "tool_calls" and not (isinstance(data.get("tools"), list) and data["tools"]):
        raise InvalidRequest("a tool_calls constraint needs at least one tool")
    if not isinstance(data.get("lazy", False), bool):
        raise InvalidRequest("a constraint's lazy must be true or false")
    return data


def is_lazy(constraint: str) -> bool:
    """Whether ``constraint`` applies only once the model starts a tool call."""
    return bool(parse(constraint).get("lazy"))


__all__ = ["KINDS", "is_lazy", "json_object", "json_schema", "parse", "tool_calls"]
