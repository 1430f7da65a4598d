"""``POST /v1/chat/completions`` (streaming SSE or not).

Every request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the
header ``X-Continuum-Session: <id>`` a request is instead a turn of that stateful session: the
full transcript is verified against the resident prefix and only the suffix is decoded. A
session hint (``X-Session-ID``, ``prompt_cache_key``, ``user``) maps the request to a resident
session; on a backend without resident sequences (``openai_http``) the hint instead names the
conversation to the fleet's router (the op's ``affinity``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from continuum import constraints
from continuum.errors import InvalidRequest
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.server.deps import (
    SESSION_HEADER,
    Served,
    SessionTurn,
    State,
    check_model,
    check_owner,
    hint_session_id,
    hinted_session,
    own_session,
    parse_body,
    pause_hint,
    prefetch,
    session_hint,
    tenant,
)
from continuum.server.preflight import chat_messages
from continuum.server.schemas import ChatRequest, RequestDefaults, result_usage
from continuum.server.sse import respond
from continuum.toolcalls import ToolParsing, normalize_tools

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request, state: State) -> Response:
    prefetch(state, request)  # a session named in the headers: its KV comes back meanwhile
    req = await parse_body(state, request, ChatRequest)
    check_model(state, req.model)
    tools, parsing, params = shape(req, state.config.request_defaults)
    ns = tenant(state, request)
    pause = pause_hint(request)
    session_id = request.headers.get(SESSION_HEADER)
    hint = None if session_id else session_hint(request, req.prompt_cache_key, req.user)
    in_session = bool(session_id or (hint and state.worker is not None))
    messages = chat_messages(state, req.messages, tools, params, windowed=in_session)
    if in_session:
        if session_id and req.stream:
            await check_owner(state, session_id, ns)

        def find() -> Served:
            if session_id:
                return Served(own_session(state, session_id, ns))
            assert hint is not None
            return hinted_session(state, hint, ns, messages, tools)

        program = session_id or hint_session_id(ns, hint or "")
        turn = SessionTurn(state, find, messages, params, tools, parsing, pause, program=program)
        return await respond(state, turn, req, "chat.completion", turn.usage, parsing, request)
    op = TokenOp(
        "chat.completions", messages=tuple(messages), params=params, tools=tools, affinity=hint
    )
    return await respond(
        state,
        lambda cb: state.ops.run(op, cb, namespace=ns),
        req,
        "chat.completion",
        result_usage,
        parsing,
        request,
    )


def shape(
    req: ChatRequest, defaults: RequestDefaults
) -> tuple[tuple[dict[str, Any], ...] | None, ToolParsing | None, GenerationParams]:
    """A chat request's tools, how its reply is parsed for calls, and its decode parameters
    (the constraint a forced choice or ``response_format`` puts on the reply included)."""
    tools, parsing, forced = _tools(req)
    params = replace(
        req.params(defaults),
        constraint=_constraint(req, forced),
        end_repeated_call=parsing is not None,  # a repeated call is degenerate: the reply ends
    )
    return tools, parsing, params


def _tools(
    req: ChatRequest,
) -> tuple[tuple[dict[str, Any], ...] | None, ToolParsing | None, str | None]:
    """The request's tools (canonical order), how its reply is parsed for calls, and the
    constraint a forced choice puts on it. ``none`` keeps the tools in the prompt and never
    parses a call; ``auto`` (the default) parses leniently, and a call the model starts must
    name a declared tool with arguments that fit it (a lazy grammar); ``required`` and a named
    function are enforced with a grammar from the first token (one call when named or
    ``parallel_tool_calls`` is false)."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice needs tools: send the tools it may call")
        return None, None, None
    tools = normalize_tools(req.tools)
    names = frozenset(t["function"]["name"] for t in tools)
    parallel = req.parallel_tool_calls is not False
    if choice == "none":
        return tools, None, None
    if choice in (None, "auto"):
        lazy = constraints.tool_calls(tools, sorted(names), parallel=parallel, lazy=True)
        return tools, ToolParsing(names, parallel=parallel), lazy
    if choice == "required":
        forced = constraints.tool_calls(tools, sorted(names), parallel=parallel)
        return tools, ToolParsing(names, parallel), forced
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and name):
        raise InvalidRequest(
            f"tool_choice must be 'none', 'auto', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}"
        )
    return tools, ToolParsing(names, False), constraints.tool_calls(tools, [name], parallel=False)


def _response_format(req: ChatRequest) -> str | None:
    """The constraint ``response_format`` puts on the reply (``text``: none)."""
    rf = req.response_format
    if rf is None or rf.get("type") == "text":
        return None
    if rf.get("type") == "json_object":
        return constraints.json_object()
    if rf.get("type") == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequest(
                "response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}"
            )
        return constraints.json_schema(spec["schema"])
    raise InvalidRequest(
        "response_format type must be 'text', 'json_object' or 'json_schema', "
        f"got {rf.get('type')!r}"
    )


def _constraint(req: ChatRequest, forced: str | None) -> str | None:
    shaped = _response_format(req)
    if forced is not None and shaped is not None and constraints.is_lazy(forced):
        return shaped  # the reply's shape was asked for; calls are only parsed
    if forced is not None and shaped is not None:
        raise InvalidRequest(
            "a forced tool_choice and a JSON response_format cannot both shape one reply: "
            "drop one of them"
        )
    return forced or shaped
