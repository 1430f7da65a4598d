"""``continuum serve``: an OpenAI-compatible server over stateful sessions and the reuse stack.

Routes (one router per API, under :mod:`continuum.server.routes`):

- ``POST /v1/chat/completions`` (streaming SSE or not) and ``POST /v1/completions``: every
  request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the header
  ``X-Continuum-Session: <id>`` a chat request is instead a turn of that stateful session.
- ``POST /v1/sessions`` (create + wake), ``POST /v1/sessions/{id}/messages`` (send only the new
  messages), ``POST /v1/sessions/{id}/input`` (prefill on arrival), ``GET /v1/sessions/{id}``
  (history + metrics), ``DELETE /v1/sessions/{id}``, ``GET /v1/sessions/{id}/bundle`` and
  ``POST /v1/sessions/import`` (move a session to another worker as one bundle).
- ``POST /v1/embeddings`` (with ``--semantic``).
- ``GET /v1/models``, ``GET /metrics`` (Prometheus), ``GET /health``.

This module assembles them: the API-key and body-size guard in front of every route, and the
exception handlers that turn errors into OpenAI-shaped bodies (:mod:`continuum.server.errors`).
Tenancy is in :mod:`continuum.server.deps`, the streaming and disconnect semantics in
:mod:`continuum.server.sse`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from continuum.errors import ContinuumError, InvalidRequest
from continuum.server.auth import DEFAULT_TENANT, host_name, origin_allowed
from continuum.server.deps import get_state
from continuum.server.errors import (
    BodyTooLarge,
    bad_key_response,
    error_body,
    error_response,
    refused,
    too_large_response,
)
from continuum.server.routes import ROUTERS
from continuum.server.routes.admin import is_admin
from continuum.server.routes.sessions import BUNDLE_TYPES, IMPORT_PATH

# cli/ and bench/ import these from here
from continuum.server.state import ServerConfig, ServerState, build_state

__all__ = ["ServerConfig", "ServerState", "build_state", "create_app"]


def create_app(state: ServerState) -> FastAPI:
    # no 307 to a slash-less twin: an unknown path is a JSON 404 like any other
    app = FastAPI(title="continuum", version="0.1.0", redirect_slashes=False)
    app.state.continuum = state
    app.add_middleware(Guard)
    app.add_exception_handler(ContinuumError, on_error)  # type: ignore[arg-type]
    app.add_exception_handler(BodyTooLarge, on_too_large)
    app.add_exception_handler(StarletteHTTPException, on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, on_unexpected)
    for router in ROUTERS:
        app.include_router(router)
    return app


class Guard:
    """Before any route: :func:`refusal`. A plain ASGI middleware, not Starlette's
    ``BaseHTTPMiddleware``, which relays every streamed chunk through a memory stream and a
    task of its own: a few milliseconds per token on a CPU whose cores are decoding."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(Request(scope, receive))
            if refused is not None:
                await refused(scope, receive, send)
                return
        elif scope["type"] == "websocket":  # the same guards at the handshake
            ws = WebSocket(scope, receive, send)
            refused = refusal(ws)
            if refused is not None:
                if "websocket.http.response" in scope.get("extensions", {}):
                    await ws.send_denial_response(refused)  # the JSON error, as over HTTP
                else:
                    await ws.close(code=1008, reason="refused: see the server's HTTP error")
                return
        await self.app(scope, receive, send)


def refusal(request: HTTPConnection) -> Response | None:
    """The browser guards (``Host``, ``Origin``: a WebSocket handshake too, which browsers
    send cross-site), the API key, which names the caller's tenant (every route but
    ``/health``; kept in ``request.state.tenant``), a declared Content-Length over the limit
    (streamed bodies are measured as they are read), and a JSON content type on JSON routes (a
    bundle's on the import route): the response refusing the request, or None to let it
    through."""
    cfg: ServerConfig = request.app.state.continuum.config
    host = request.headers.get("host", "")
    if cfg.allowed_hosts is not None and host_name(host) not in cfg.allowed_hosts:
        return refused(400, f"Host {host[:100]!r} is not this server's", "host_not_allowed")
    if not origin_allowed(request.headers.get("origin"), host):
        return refused(403, "cross-origin requests are refused", "origin_not_allowed")
    request.state.tenant = DEFAULT_TENANT
    if not cfg.keys.open and request.url.path != "/health" and not is_admin(request):
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        found = cfg.keys.tenant_of(presented.strip())
        if scheme.lower() != "bearer" or found is None:
            return bad_key_response()
        request.state.tenant = found
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
        return too_large_response(cfg.max_body_bytes)
    json_route = not request.url.path.endswith("/input") and not is_admin(request)  # no body
    method = request.scope.get("method", "")
    if method in ("POST", "PUT", "PATCH") and json_route:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if request.url.path == IMPORT_PATH:  # a session bundle: bytes, not JSON
            if kind not in BUNDLE_TYPES:
                return refused(
                    415,
                    f"send the bundle's bytes unchanged with Content-Type: {BUNDLE_TYPES[0]}",
                    "unsupported_media_type",
                )
        elif kind != "application/json":
            return refused(
                415,
                "send the body as JSON with Content-Type: application/json",
                "unsupported_media_type",
            )
    return None


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


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug, not the caller's fault: logged whole, answered as an OpenAI-shaped 500 that names
    nothing of the server."""
    return error_response(exc)


async def on_too_large(request: Request, exc: Exception) -> JSONResponse:
    return too_large_response(get_state(request).config.max_body_bytes)
