"""``/v1/responses`` over a WebSocket: the Responses API's WebSocket mode.

The client opens one connection (its API key checked at the handshake, as every route's) and
sends ``{"type": "response.create", ...}`` messages: a ``/v1/responses`` body with a ``type``
and no ``stream``. Each runs as that request does over HTTP (:func:`~continuum.server.routes.
responses.prepare`), one at a time, and its streaming events come back one JSON message each,
ending with ``response.completed`` (or ``incomplete``/``failed``). A ``store: false`` response
is kept by the connection (:class:`~continuum.server.responses.Local`), so the next request
continues it with ``previous_response_id`` and only its new input; the prefix KV tier holds
that chain's KV, so only the new input is decoded.

An error that the request decides is one message, ``{"type": "error", "status": ..., "error":
{"code", "message", "param"}}``, before any work; the connection stays open for the next
request. A failed continuation drops the response it continued from the connection.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from continuum.errors import InvalidRequest
from continuum.server.deps import parse_object
from continuum.server.errors import BodyTooLarge, error_response, too_large_response
from continuum.server.responses import Local
from continuum.server.routes.responses import Events, prepare
from continuum.server.schemas import ResponsesRequest
from continuum.server.sse import stream_events
from continuum.server.state import ServerState

router = APIRouter()

CREATE = "response.create"


@router.websocket("/v1/responses")
async def responses_socket(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.continuum
    await ws.accept()
    local = Local()
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("bytes") or (message.get("text") or "").encode("utf-8")
            await _turn(state, ws, raw, local)


async def _turn(state: ServerState, ws: WebSocket, raw: bytes, local: Local) -> None:
    """One ``response.create``: its events, or one error message; a failed continuation drops
    the response it continued."""
    previous: str | None = None
    try:
        if len(raw) > state.config.max_body_bytes:
            raise BodyTooLarge
        req = parse_object(raw, ResponsesRequest, _request_fields)
        previous = req.previous_response_id
        turn = prepare(state, req, ws, local)
        events = Events(turn.reply, socket=True)
        stream = stream_events(state, turn.job, events, turn.parsing)
    except Exception as e:
        if previous is not None:
            local.drop(previous)
        await ws.send_text(json.dumps(socket_error(state, e)))
        return
    async with contextlib.aclosing(stream):  # a client gone mid-reply stops the job
        async for event in stream:
            await ws.send_text(event)
    if events.failed and previous is not None:
        local.drop(previous)


def _request_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A ``response.create`` event's fields as a ``/v1/responses`` body: always streamed, so
    ``stream`` is not the client's to send."""
    kind = data.get("type")
    if kind != CREATE:
        raise InvalidRequest(
            f"type must be {CREATE!r}: the only event a client sends, got {kind!r}"
        )
    for field in ("stream", "stream_options"):
        if field in data:
            raise InvalidRequest(
                f"{field} is not sent over a WebSocket (every response streams): remove it"
            )
    fields = {k: v for k, v in data.items() if k != "type"}
    return {**fields, "stream": True}


def socket_error(state: ServerState, error: Exception) -> dict[str, Any]:
    """An error as the WebSocket mode sends it: the HTTP status it would have, and the body."""
    if isinstance(error, BodyTooLarge):
        response = too_large_response(state.config.max_body_bytes)
    else:
        response = error_response(error)
    body = json.loads(bytes(response.body))
    return {"type": "error", "status": response.status_code, **body}
