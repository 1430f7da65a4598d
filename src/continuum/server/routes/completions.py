"""``POST /v1/completions`` (streaming SSE or not), through the reuse stack. A session hint
(``X-Session-ID``, ``user``) names the conversation to a remote backend's router."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from continuum.ops import TokenOp
from continuum.server.deps import State, check_model, parse_body, session_hint, tenant
from continuum.server.preflight import fits
from continuum.server.schemas import CompletionRequest, result_usage
from continuum.server.sse import respond

router = APIRouter()


@router.post("/v1/completions", response_model=None)
async def completions(request: Request, state: State) -> Response:
    req = await parse_body(state, request, CompletionRequest)
    check_model(state, req.model)
    params = req.params(state.config.request_defaults)
    fits(state, None, None, params.max_tokens, prompt=req.prompt)
    op = TokenOp(
        "completions",
        prompt=req.prompt,
        params=params,
        affinity=session_hint(request, req.user),
    )
    ns = tenant(state, request)
    return await respond(
        state,
        lambda cb: state.ops.run(op, cb, namespace=ns),
        req,
        "text_completion",
        result_usage,
        request=request,
    )
