"""The Responses API's data: input items to chat messages, a reply to output items, and the
store of responses that ``previous_response_id`` continues.

A response is a point in a conversation. The store keeps, per tenant, each stored response's
*chain*: the conversation up to and including its own output, as chat messages. Its own output
is kept as the text the model generated (a call it wrote as bare JSON stays that text), so a
request that continues it renders the reply as exactly those tokens, and the prefix KV tier —
whose slot holds the prompt and the reply as generated — serves the whole chain: only the new
input items are decoded. Continuing an older response forks the conversation at that point;
its prefix is served from wherever the tiers keep it (a slot, or a layer-KV snapshot).

``instructions`` are not part of the chain (as in OpenAI's API, a request's instructions
replace the previous ones): they are the system message in front of it.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from continuum.errors import InvalidRequest
from continuum.messages import Message
from continuum.server.errors import PreviousResponseNotFound, ResponseNotFound
from continuum.server.responses_tools import ResponsesTools, custom_arguments
from continuum.stateful.transcript import NOTE_HEADER
from continuum.store.base import HistoryLog
from continuum.toolcalls import ToolCall

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")
COMPACTION_VERSION = 1


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_id(previous: str | None) -> str:
    """``resp_<root>_<unique>``: every response of a chain carries its first response's root,
    the key a router in front hashes on (``continuum fleet``'s HAProxy config), so a chain
    stays on one worker."""
    parts = (previous or "").split("_")
    inherited = len(parts) == 3 and parts[0] == "resp" and len(parts[1]) == 16
    root = parts[1] if inherited else uuid.uuid4().hex[:16]
    return f"resp_{root}_{uuid.uuid4().hex}"


def chain_root(rid: str) -> str:
    """``resp_<root>``: the same for every response of one chain (see :func:`response_id`)."""
    return "_".join(rid.split("_")[:2])


def _text(content: object, where: str, field: str = "content") -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.{field} must be a string or a list of text parts")
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidRequest(
                f"{where}.{field}[{i}]: content parts of type {kind!r} are not supported "
                f"(send {', '.join(TEXT_PARTS)} parts)"
            )
        out.append(part["text"])
    return "".join(out)


def input_messages(raw: object, left_out: list[str] | None = None) -> list[Message]:
    """Responses ``input`` (a string, or a list of items) as chat messages: messages (a
    ``developer`` message is a system message, kept where it stands), then a ``function_call``
    or ``custom_tool_call`` as an assistant message's ``tool_calls`` (calls right after an
    assistant message are that turn's, as the output items of one response are), a
    ``function_call_output`` or ``custom_tool_call_output`` as a ``tool`` message. A
    ``reasoning`` item (another model's, opaque) is left out of the prompt and named in
    ``left_out``. Other item types are a 400 naming the type."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("input must be a string or a non-empty list of items")
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(str(item.get("role")))
            if role is None:
                raise InvalidRequest(f"{where}.role must be one of {', '.join(ROLES)}")
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind in ("function_call", "custom_tool_call"):
            call = _call(item, where)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the same model turn
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "compaction":  # what /v1/responses/compact returned: the note, as read
            out.append({"role": "user", "content": note_message(read_compaction(item, where))})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidRequest(f"{where}: {kind} needs a call_id string")
            output = _output(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            if left_out is not None:
                left_out.append("reasoning")
        else:
            raise InvalidRequest(
                f"{where}: input items of type {kind!r} are not supported (message, "
                "function_call, function_call_output, custom_tool_call, "
                "custom_tool_call_output, reasoning, compaction are)"
            )
    return out


CALL_ITEMS = ("function_call", "custom_tool_call")


def check_outputs(chain: list[Message], new_from: int, made: list[dict[str, Any]]) -> None:
    """Every tool output from ``chain[new_from:]`` on answers a call made before it: in the
    chain, or in ``made`` (the output items of the response it continues). An output for a
    call nobody made is a 400, as OpenAI's API answers it: the model would read an answer
    to a question it never asked."""
    calls = {str(c.get("call_id")) for c in made if c.get("type") in CALL_ITEMS}
    for i, m in enumerate(chain):
        if m["role"] == "assistant":
            calls |= {str(c.get("id")) for c in m.get("tool_calls") or []}
        elif m["role"] == "tool" and i >= new_from and m.get("tool_call_id") not in calls:
            raise InvalidRequest(
                f"no tool call found for the function_call_output with call_id "
                f"{m.get('tool_call_id')!r}: send the function_call item it answers before it, "
                "or previous_response_id of the response that made the call"
            )


def _output(raw: object, where: str) -> str:
    """A tool call's output: a string, or a list of text parts (joined)."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return _text(raw, where.removesuffix(".output"), field="output")
    raise InvalidRequest(f"{where} must be a string or a list of input_text parts")


def compaction_item(note: str) -> dict[str, Any]:
    """The ``compaction`` output item of ``/v1/responses/compact``. Its ``encrypted_content``
    is the continuity note, base64-encoded with a version tag: opaque to clients, as the API
    has it, but not encrypted (it is the client's own conversation, summarised)."""
    blob = json.dumps({"v": COMPACTION_VERSION, "note": note}).encode()
    content = base64.urlsafe_b64encode(blob).decode()
    return {"id": new_id("cmp"), "type": "compaction", "encrypted_content": content}


def read_compaction(item: dict[str, Any], where: str) -> str:
    """The note inside a ``compaction`` input item; a 400 when this server did not write it."""
    try:
        data = json.loads(base64.urlsafe_b64decode(str(item.get("encrypted_content", ""))))
        if data.get("v") != COMPACTION_VERSION or not isinstance(data.get("note"), str):
            raise ValueError
        return str(data["note"])
    except (ValueError, TypeError, AttributeError, binascii.Error):
        raise InvalidRequest(
            f"{where}: this compaction item's encrypted_content was not written by this "
            "server's /v1/responses/compact; send the items it returned unchanged"
        ) from None


def user_item(message: Message) -> dict[str, Any]:
    """A user message as a Responses item (as the compaction's output lists it)."""
    text = {"type": "input_text", "text": message["content"]}
    return {
        "type": "message",
        "id": new_id("msg"),
        "status": "completed",
        "role": "user",
        "content": [text],
    }


def note_message(note: str) -> str:
    """A continuity note as the text of the user message that carries it."""
    return f"{NOTE_HEADER}\n{note}"


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call`` or ``custom_tool_call`` input item as a chat tool call (a custom
    call's input as the one argument its tool was offered with)."""
    name, call_id = item.get("name"), item.get("call_id")
    if item.get("type") == "custom_tool_call":
        text = item.get("input")
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(text, str):
            raise InvalidRequest(f"{where}: custom_tool_call needs name, call_id and input strings")
        args = custom_arguments(text)
    else:
        args = item.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
            raise InvalidRequest(
                f"{where}: function_call needs name, call_id and arguments strings"
            )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def truncated(messages: list[Message], fits: Callable[[list[Message]], bool]) -> list[Message]:
    """``truncation: "auto"``: the conversation without its oldest turns, as few dropped as
    make it ``fits``. A leading system message (the instructions) is kept; the rest is cut
    before a user message, so no tool result loses its call. Unchanged when it fits, or when
    even the last turn alone does not (the request is then a context_length_exceeded error)."""
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(head) :]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user" and i > 0]
    if fits(messages) or not starts:
        return messages
    lo, hi = 0, len(starts) - 1
    best = len(starts) - 1
    while lo <= hi:  # fewer messages as the cut moves later
        mid = (lo + hi) // 2
        if fits([*head, *rest[starts[mid] :]]):
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return [*head, *rest[starts[best] :]]


def chat_tool_choice(raw: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Responses' ``{"type": "function" | "custom", "name": ...}`` in chat's form; the rest as
    it is (chat's validation names a mistake)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and kind in ("function", "custom") and "function" not in raw:
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def chat_response_format(text: object) -> dict[str, Any] | None:
    """``text.format`` in chat's ``response_format`` form."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt if isinstance(fmt, dict) else None
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")},
    }


def output_items(
    content: str | None, calls: list[ToolCall], tools: ResponsesTools
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if content:
        items.append(
            {
                "type": "message",
                "id": new_id("msg"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        )
    for c in calls:
        items.append(tools.item(c))
    return items


def response_usage(prompt: int, completion: int, cached: int | None, extra: Any) -> dict[str, Any]:
    """The Responses API's usage object; ``cached`` None (unknown) makes the details null,
    which the SDKs read as absent (the Agents SDK as no cached tokens), never a reported 0."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": None if cached is None else {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
        "continuum": extra,
    }


@dataclass(frozen=True, slots=True)
class Stored:
    """A stored response: its object as returned, and its chain (see the module docstring),
    of which the first ``inherited`` messages are its previous response's chain."""

    body: dict[str, Any]
    chain: tuple[Message, ...]
    inherited: int = 0


class ResponseStore:
    """Stored responses per tenant: the most recent ``capacity`` in memory, and all of them
    in ``log`` (the history store, when the server has one) so they outlive the process,
    for ``retention_s``. Thread-safe."""

    def __init__(
        self,
        capacity: int = 4096,
        log: HistoryLog | None = None,
        retention_s: float = 30 * 86400.0,
    ) -> None:
        self.capacity = capacity
        self.log = log
        self.retention_s = retention_s
        self._items: OrderedDict[tuple[str, str], Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, tenant: str, stored: Stored) -> None:
        if self.log is not None:  # first, so a failed write loses nothing already answered
            parent = stored.body.get("previous_response_id")
            added = stored.chain[stored.inherited :]
            self.log.put_response(
                tenant,
                stored.body["id"],
                parent,
                added,
                stored.body,
                retention_s=self.retention_s,
            )
        with self._lock:
            self._items[(tenant, stored.body["id"])] = stored
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, tenant: str, response_id: str, *, previous: bool = False) -> Stored:
        """The response; to continue it (``previous``), a deleted one's chain still serves."""
        with self._lock:
            found = self._items.get((tenant, response_id))
        if found is None and self.log is not None:
            got = self.log.get_response(tenant, response_id, deleted_ok=previous)
            if got is not None:
                found = Stored(got[0], tuple(got[1]))
        if found is None:
            raise (PreviousResponseNotFound if previous else ResponseNotFound)(response_id)
        return found

    def delete(self, tenant: str, response_id: str) -> None:
        with self._lock:
            held = self._items.pop((tenant, response_id), None) is not None
        logged = self.log is not None and self.log.delete_response(tenant, response_id)
        if not (held or logged):
            raise ResponseNotFound(response_id)


class Local:
    """One WebSocket connection's responses (the Responses API's WebSocket mode): a ``store:
    false`` response is kept here, never in the server's store, so the next ``response.create``
    on the same connection continues it by ``previous_response_id`` and sends only new input;
    another connection, or this one after a reconnect, gets ``previous_response_not_found``.
    The most recent ``capacity`` are kept; a continuation that fails drops the response it
    continued. Used by one connection's turns, one at a time."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def get(self, response_id: str) -> Stored | None:
        return self._items.get(response_id)

    def put(self, stored: Stored) -> None:
        self._items[stored.body["id"]] = stored
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def drop(self, response_id: str) -> None:
        self._items.pop(response_id, None)


def response_body(
    rid: str, model: str, request: dict[str, Any], output: list[dict[str, Any]], finish: str
) -> dict[str, Any]:
    """The response object (``status`` ``incomplete`` when the output hit its token limit), with
    every field of the Responses schema: the sampling parameters as they applied (a default
    is its value, not null), those the server does not implement at their no-op values."""
    incomplete = finish == "length"
    now = int(time.time())
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "completed_at": now if finish else None,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": output,
        "instructions": request.get("instructions"),
        "tools": [_echoed(t) for t in request.get("tools") or []],
        "tool_choice": request.get("tool_choice") or "auto",
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "previous_response_id": request.get("previous_response_id"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": None,
        "temperature": _number(request.get("temperature"), 1.0),
        "top_p": _number(request.get("top_p"), 1.0),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "reasoning": None,
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": request.get("truncation") or "disabled",
        "store": request.get("store", True) is not False,
        "background": False,
        "service_tier": "default",
        "metadata": request.get("metadata") or {},
        "safety_identifier": None,
        "prompt_cache_key": request.get("prompt_cache_key"),
        "usage": None,
    }


def _number(value: object, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) else default


def _echoed(tool: object) -> object:
    """A request's function tool as the response lists it (every field present)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    fields = ("description", "parameters", "strict")
    return {**tool, **{k: tool.get(k) for k in fields}}


__all__ = [
    "ResponseStore",
    "Stored",
    "chat_response_format",
    "chat_tool_choice",
    "input_messages",
    "output_items",
    "response_body",
    "response_usage",
]
