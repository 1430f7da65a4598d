"""``POST /v1/chat/completions`` (streaming SSE or not).

Every request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the
header ``X-Continuum-Session: <id>`` a request is instead a turn of that stateful session: the
full transcript is verified against the resident prefix and only the suffix is decoded.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from continuum.errors import InvalidRequest
from continuum.ops import TokenOp
from continuum.server.deps import (
    SESSION_HEADER,
    State,
    check_model,
    own_session,
    parse_body,
    tenant,
)
from continuum.server.schemas import ChatRequest, op_usage, turn_usage
from continuum.server.sse import OnText, ToolParsing, respond
from continuum.stateful.params import TurnResult
from continuum.toolcalls import normalize_tools

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request, state: State) -> Response:
    req = await parse_body(state, request, ChatRequest)
    check_model(state, req.model)
    tools, parsing = _tools(req)
    params = req.params(state.config.default_max_tokens)
    ns = tenant(state, request)
    session_id = request.headers.get(SESSION_HEADER)
    if session_id and tools:
        raise InvalidRequest(
            f"tools on a stateful session ({SESSION_HEADER}) are not supported yet: send the "
            "request without the session header"
        )
    if session_id:
        sid = session_id

        def turn(on_text: OnText | None) -> TurnResult:
            return own_session(state, sid, ns).turn(req.messages, params, on_text=on_text)

        return await respond(state, turn, req, "chat.completion", lambda r: turn_usage(r, sid))
    op = TokenOp("chat.completions", messages=tuple(req.messages), params=params, tools=tools)
    return await respond(
        state,
        lambda cb: state.ops.run(op, cb, namespace=ns),
        req,
        "chat.completion",
        op_usage,
        parsing,
    )


def _tools(req: ChatRequest) -> tuple[tuple[dict[str, Any], ...] | None, ToolParsing | None]:
    """The request's tools (canonical order) and how its reply is parsed for calls.
    ``tool_choice`` ``none`` keeps the tools in the prompt and never parses a call; ``auto``
    (the default) parses leniently. A forced choice is refused until it can be enforced."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice needs tools")
        return None, None
    tools = normalize_tools(req.tools)
    if choice == "none":
        return tools, None
    if choice not in (None, "auto"):
        raise InvalidRequest(
            f"tool_choice {choice!r} is not supported yet (a forced call needs a grammar): "
            "use 'auto' or 'none'"
        )
    names = frozenset(t["function"]["name"] for t in tools)
    return tools, ToolParsing(names, parallel=req.parallel_tool_calls is not False)
