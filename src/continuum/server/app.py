"""``continuum serve``: an OpenAI-compatible server over stateful sessions and the reuse stack.

Routes (one router per API, under :mod:`continuum.server.routes`):

- ``POST /v1/chat/completions`` (streaming SSE or not) and ``POST /v1/completions``: every
  request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the header
  ``X-Continuum-Session: <id>`` a chat request is instead a turn of that stateful session.
- ``POST /v1/sessions`` (create + wake), ``POST /v1/sessions/{id}/messages`` (send only the new
  messages), ``POST /v1/sessions/{id}/input`` (prefill on arrival), ``GET /v1/sessions/{id}``
  (history + metrics), ``DELETE /v1/sessions/{id}``.
- ``POST /v1/embeddings`` (with ``--semantic``).
- ``GET /v1/models``, ``GET /metrics`` (Prometheus), ``GET /health``.

This module assembles them: the API-key and body-size guard in front of every route, and the
exception handlers that turn errors into OpenAI-shaped bodies (:mod:`continuum.server.errors`).
Tenancy is in :mod:`continuum.server.deps`, the streaming and disconnect semantics in
:mod:`continuum.server.sse`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from continuum.errors import ContinuumError, InvalidRequest
from continuum.server.deps import get_state
from continuum.server.errors import (
    BodyTooLarge,
    bad_key_response,
    error_body,
    error_response,
    too_large_response,
)
from continuum.server.routes import ROUTERS

# cli/ and bench/ import these from here
from continuum.server.state import ServerConfig, ServerState, build_state

__all__ = ["ServerConfig", "ServerState", "build_state", "create_app"]


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="continuum", version="0.1.0")
    app.state.continuum = state
    app.middleware("http")(guard)
    app.add_exception_handler(ContinuumError, on_error)  # type: ignore[arg-type]
    app.add_exception_handler(BodyTooLarge, on_too_large)
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    for router in ROUTERS:
        app.include_router(router)
    return app


async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """The API key (every route but ``/health``), then a declared Content-Length over the
    limit; streamed bodies are measured as they are read."""
    cfg = get_state(request).config
    if cfg.api_key and request.url.path != "/health":
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {cfg.api_key}":
            return bad_key_response()
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
        return too_large_response(cfg.max_body_bytes)
    return await call_next(request)


async def on_error(request: Request, exc: ContinuumError) -> JSONResponse:
    return error_response(exc)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The framework's own errors (no such route, wrong method) in OpenAI's shape."""
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see GET /v1/models and the README"
        code = "not_found"
    elif exc.status_code == 405:
        message = f"{request.url.path} does not take {request.method}"
        code = "method_not_allowed"
    else:
        message, code = str(exc.detail), "http_error"
    etype = "invalid_request_error" if exc.status_code < 500 else "server_error"
    headers = getattr(exc, "headers", None)
    return JSONResponse(error_body(message, etype, code), exc.status_code, headers=headers)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A path or query parameter of the wrong type: a 400, as our own validation answers."""
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in first["loc"])
    return error_response(InvalidRequest(f"{where}: {first['msg']}"))


async def on_too_large(request: Request, exc: Exception) -> JSONResponse:
    return too_large_response(get_state(request).config.max_body_bytes)
