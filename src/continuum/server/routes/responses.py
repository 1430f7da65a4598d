"""``POST /v1/responses`` (streamed as Responses events or not), ``GET`` and ``DELETE
/v1/responses/{id}``.

A response runs as the chat request it maps onto (:mod:`continuum.server.responses`), through
the reuse stack. ``previous_response_id`` puts the stored chain of that response in front of the
new input; the prefix KV tier holds that chain's KV (its reply as generated), so only the new
items are decoded. An unknown id is a ``404 previous_response_not_found``, never ignored.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import HTTPConnection

from continuum.errors import BackendError, InvalidRequest
from continuum.messages import Message
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.results import Result
from continuum.server.deps import (
    Served,
    SessionTurn,
    State,
    check_model,
    hinted_session,
    parse_body,
    pause_hint,
    prefetch,
    run,
    session_hint,
    tenant,
)
from continuum.server.errors import error_response
from continuum.server.preflight import chat_messages
from continuum.server.responses import (
    Local,
    Stored,
    chain_root,
    check_outputs,
    compaction_item,
    input_messages,
    new_id,
    output_items,
    response_body,
    response_id,
    response_usage,
    truncated,
    user_item,
)
from continuum.server.responses_tools import ResponsesTools, read_tools
from continuum.server.routes.chat import shape
from continuum.server.schemas import CompactRequest, ResponsesRequest, cached_of, result_usage
from continuum.server.sse import Job, OnText, Split, run_watched, split_reply, stream_with
from continuum.server.state import ServerState
from continuum.stateful.compaction import INSTRUCTION, NOTE_TOKENS
from continuum.stateful.transcript import NOTE_HEADER
from continuum.toolcalls import ToolParsing

router = APIRouter()


@dataclass
class _Reply:
    """Turns one op's result into the response object, and stores it."""

    state: ServerState
    namespace: str
    request: ResponsesRequest
    chain: list[Message]  # the stored chain in front of this request, then its new input
    inherited: int  # how many of ``chain`` are the stored chain's
    tools: ResponsesTools  # the request's tools, read: how a call comes back
    left_out: tuple[str, ...] = ()  # what the request sent that the prompt leaves out
    usage_of: Callable[[Any], dict[str, Any]] = result_usage  # chat-shaped usage of the result
    local: Local | None = None  # a WebSocket's own responses: where store: false ones are kept
    rid: str = field(default_factory=lambda: new_id("resp"))

    def body(self, result: Result, output: list[dict[str, Any]], finish: str) -> dict[str, Any]:
        raw = self.request.model_dump()
        body = response_body(self.rid, self.state.model_id, raw, output, finish)
        if self.left_out:  # visible, never silent: hosted tools, other models' reasoning
            body["continuum"] = {"left_out": list(self.left_out)}
        u = self.usage_of(result)
        body["usage"] = response_usage(
            u["prompt_tokens"],
            u["completion_tokens"],
            cached_of(u),
            u["continuum"],
        )
        reply: Message = {"role": "assistant", "content": result.text}  # as generated
        stored = Stored(body, (*self.chain, reply), self.inherited)
        if self.request.store:
            self.state.responses.put(self.namespace, stored)
        elif self.local is not None:
            self.local.put(stored)
        return body


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request, state: State) -> Response:
    prefetch(state, request)  # a session named in the headers: its KV comes back meanwhile
    req = await parse_body(state, request, ResponsesRequest)
    turn = prepare(state, req, request)
    if not req.stream:
        result = await run_watched(state, turn.job, request)
        state.metrics.observe(result)
        content, calls, finish = split_reply(turn.parsing, result)
        items = output_items(content, calls, turn.reply.tools)
        return JSONResponse(turn.reply.body(result, items, finish))
    return stream_with(state, turn.job, Events(turn.reply), turn.parsing)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A Responses request read and checked, ready to run: its job (a stateless op, or a turn
    of the session its hint names), how its result becomes the response, how calls are told."""

    job: Job[Any]
    reply: _Reply
    parsing: ToolParsing | None


def prepare(
    state: ServerState,
    req: ResponsesRequest,
    conn: HTTPConnection,
    local: Local | None = None,
) -> Prepared:
    """Everything decidable from the request, checked before any work (a 4xx, never an
    error event after a prefill): the model, its fields, tools, the chain of
    ``previous_response_id`` (``local`` first: a WebSocket's responses), input, context."""
    check_model(state, req.model)
    req.refuse_unimplemented()
    ns = tenant(state, conn)
    offered = read_tools(req.tools, state.config.hosted_tools)
    left_out = list(offered.left_out)
    chain, inherited = _chain(state, ns, req.previous_response_id, req.input, left_out, local)
    chat = req.chat([*_head(req.instructions), *chain], offered)
    tools, parsing, params = shape(chat, state.config.request_defaults)
    # "auto" drops the oldest turns to fit; otherwise it all must fit, as stateless does
    windowed = req.truncation == "auto"
    messages = chat_messages(state, chat.messages, tools, params, windowed=windowed)
    reply = _Reply(
        state,
        ns,
        req,
        chain,
        inherited,
        offered,
        tuple(left_out),
        local=local,
        rid=response_id(req.previous_response_id),
    )
    pause = pause_hint(conn)
    hint = None if req.previous_response_id else session_hint(conn, req.prompt_cache_key, req.user)
    # a remote backend's router keeps the conversation together: by its hint, else its chain
    op = TokenOp(
        "chat.completions",
        messages=tuple(messages),
        params=params,
        tools=tools,
        affinity=hint or chain_root(reply.rid),
    )
    if hint is not None and state.worker is not None:  # re-sends everything: a resident session

        def find() -> Served:
            return hinted_session(state, hint, ns, messages, tools)

        turn = SessionTurn(state, find, messages, params, tools, parsing, pause)
        reply.usage_of = turn.usage
        return Prepared(turn, reply, parsing)

    def job(on_text: OnText | None) -> Result:
        ran = op
        if req.truncation == "auto":
            ran = _fitted(state, op, params.max_tokens)
        return state.ops.run(ran, on_text, namespace=ns)

    return Prepared(job, reply, parsing)


def _chain(
    state: ServerState,
    ns: str,
    previous: str | None,
    raw_input: object | None,
    left_out: list[str] | None = None,
    local: Local | None = None,
) -> tuple[list[Message], int]:
    """The stored chain of ``previous`` (``local``'s first; a 404 when unknown), then the new
    input's messages; and how many of them are the stored chain's. Input items left out of the
    prompt are named in ``left_out``. A tool output must answer a call the conversation made."""
    chain: list[Message] = []
    made: list[dict[str, Any]] = []  # the previous response's output items
    if previous is not None:
        found = local.get(previous) if local is not None else None
        if found is None:
            found = state.responses.get(ns, previous, previous=True)
        chain, made = list(found.chain), list(found.body.get("output") or [])
    inherited = len(chain)
    if raw_input is not None:
        chain += input_messages(raw_input, left_out)
    check_outputs(chain, inherited, made)
    return chain, inherited


def _head(instructions: str | None) -> list[Message]:
    """The instructions as the system message in front of the chain."""
    return [{"role": "system", "content": instructions}] if instructions else []


def _fitted(state: ServerState, op: TokenOp, max_tokens: int) -> TokenOp:
    """``op`` with the oldest turns dropped until its prompt and ``max_tokens`` fit."""
    backend, n_ctx = state.engine.backend, state.engine.n_ctx
    if n_ctx is None:  # a remote backend: its server decides
        return op

    def fits(messages: list[Message]) -> bool:
        n = len(backend.prompt_tokens(messages, None, tools=op.tools))
        return bool(n + max_tokens < n_ctx)

    assert op.messages is not None
    kept = truncated(list(op.messages), fits)
    return replace(op, messages=tuple(kept)) if len(kept) < len(op.messages) else op


@router.post("/v1/responses/compact", response_model=None)
async def compact_response(request: Request, state: State) -> Response:
    """The conversation as its user messages and one ``compaction`` item that carries the
    model's summary of the rest; sent back as the next ``input``, it stands for the
    conversation. The summary runs as an op through the reuse stack: the prefix KV tier holds
    the chain of ``previous_response_id``, so only the request to summarise is decoded."""
    req = await parse_body(state, request, CompactRequest)
    check_model(state, req.model)
    ns = tenant(state, request)
    chain, _ = _chain(state, ns, req.previous_response_id, req.input)
    if not chain:
        raise InvalidRequest("nothing to compact: send input or previous_response_id")
    ask: Message = {"role": "user", "content": INSTRUCTION}
    asked = [*_head(req.instructions), *chain, ask]
    params = GenerationParams(temperature=0.0, max_tokens=NOTE_TOKENS)
    op = TokenOp("chat.completions", messages=tuple(asked), params=params)
    result = await run(state, lambda: state.ops.run(op, None, namespace=ns))
    state.metrics.observe(result)
    note = result.text.strip()
    if not note:
        raise BackendError("the model wrote an empty summary; compact again or keep the input")
    said = [m for m in chain if m["role"] == "user"]
    kept = [m for m in said if not str(m["content"]).startswith(NOTE_HEADER)]  # not old notes
    u = result_usage(result)
    return JSONResponse(
        {
            "id": new_id("cmp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*(user_item(m) for m in kept), compaction_item(note)],
            "usage": response_usage(
                u["prompt_tokens"],
                u["completion_tokens"],
                cached_of(u),
                u["continuum"],
            ),
        }
    )


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, request: Request, state: State) -> Response:
    return JSONResponse(state.responses.get(tenant(state, request), response_id).body)


@router.delete("/v1/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, request: Request, state: State) -> Response:
    state.responses.delete(tenant(state, request), response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@dataclass
class Events:
    """The Responses streaming events of one reply: ``response.created``, the output items as
    they are added and completed (text deltas, function-call arguments), ``response.completed``;
    each with its ``type`` and ``sequence_number``, and no ``[DONE]``. As Server-Sent Events,
    or (``socket``) each event's JSON alone, one WebSocket message each."""

    reply: _Reply
    socket: bool = False
    seq: int = 0
    text: str = ""
    message: dict[str, Any] | None = None
    failed: bool = False  # the reply ended with an error event

    def _event(self, kind: str, **fields: Any) -> str:
        data = json.dumps({"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return data if self.socket else f"event: {kind}\ndata: {data}\n\n"

    def opening(self) -> list[str]:
        raw = self.reply.request.model_dump()
        start = response_body(self.reply.rid, self.reply.state.model_id, raw, [], "")
        start["status"] = "in_progress"
        return [
            self._event("response.created", response=start),
            self._event("response.in_progress", response=start),
        ]

    def piece(self, text: str) -> list[str]:
        out = []
        if self.message is None:
            self.message = {
                "type": "message",
                "id": new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            out.append(self._event("response.output_item.added", output_index=0, item=self.message))
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=self.message["id"],
                    output_index=0,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        self.text += text
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self.message["id"],
                output_index=0,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def closing(self, result: Any, split: Split) -> list[str]:
        content, calls, finish = split
        out = self.piece(content) if content else []
        items = []
        if self.message is not None:
            part = {"type": "output_text", "text": self.text, "annotations": []}
            mid = self.message["id"]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=mid,
                    output_index=0,
                    content_index=0,
                    text=self.text,
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=mid,
                    output_index=0,
                    content_index=0,
                    part=part,
                )
            )
            done = {**self.message, "status": "completed", "content": [part]}
            out.append(self._event("response.output_item.done", output_index=0, item=done))
            items.append(done)
        for call in output_items(None, calls, self.reply.tools):
            out += self._call_events(len(items), call)
            items.append(call)
        body = self.reply.body(result, items, finish)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=body)]

    def _call_events(self, i: int, call: dict[str, Any]) -> list[str]:
        """A call's events: its item added, its arguments (a custom tool's input) as one delta
        and done, the item done."""
        iid = call["id"]
        added = {**call, "status": "in_progress"}
        if call["type"] == "custom_tool_call":
            added["input"] = ""
            text, kind = call["input"], "response.custom_tool_call_input"
            done = self._event(f"{kind}.done", item_id=iid, output_index=i, input=text)
        else:
            added["arguments"] = ""
            text, kind = call["arguments"], "response.function_call_arguments"
            done = self._event(
                f"{kind}.done", item_id=iid, output_index=i, name=call["name"], arguments=text
            )
        return [
            self._event("response.output_item.added", output_index=i, item=added),
            self._event(f"{kind}.delta", item_id=iid, output_index=i, delta=text),
            done,
            self._event("response.output_item.done", output_index=i, item=call),
        ]

    def failure(self, error: Exception) -> list[str]:
        self.failed = True
        e = json.loads(bytes(error_response(error).body))["error"]
        return [self._event("error", code=e["code"], message=e["message"], param=e["param"])]
