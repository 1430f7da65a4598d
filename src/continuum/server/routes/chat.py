"""``POST /v1/chat/completions`` (streaming SSE or not).

Every request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the
header ``X-Continuum-Session: <id>`` a request is instead a turn of that stateful session: the
full transcript is verified against the resident prefix and only the suffix is decoded.
"""

from __future__ import annotations

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
from continuum.server.sse import OnText, respond
from continuum.stateful.params import TurnResult

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request, state: State) -> Response:
    req = await parse_body(state, request, ChatRequest)
    check_model(state, req.model)
    if req.tools:
        raise InvalidRequest(
            "tools are not supported yet: send the tool schema in the system message"
        )
    params = req.params(state.config.default_max_tokens)
    ns = tenant(state, request)
    session_id = request.headers.get(SESSION_HEADER)
    if session_id:
        sid = session_id

        def turn(on_text: OnText | None) -> TurnResult:
            return own_session(state, sid, ns).turn(req.messages, params, on_text=on_text)

        return await respond(state, turn, req, "chat.completion", lambda r: turn_usage(r, sid))
    op = TokenOp("chat.completions", messages=tuple(req.messages), params=params)
    return await respond(
        state, lambda cb: state.ops.run(op, cb, namespace=ns), req, "chat.completion", op_usage
    )
