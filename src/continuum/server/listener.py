"""How the server listens: uvicorn's settings in one place, and its HTTP/1.1 protocol with one
answer fixed.

uvicorn's h11 protocol answers a request whose header section outgrows the parser's buffer with
a bare ``400 Invalid HTTP request received.`` and closes; where the bytes arrive in several
reads the client sees a reset or that 400, and either way it cannot tell what to change.
:class:`Protocol` answers it as RFC 6585 says, ``431 Request Header Fields Too Large``, with an
OpenAI-style error body that names the limit. h11 measures only a header section that arrives
in pieces; one that arrives in a single read is parsed whole, so :class:`HeaderLimit` measures
what reached the app the same way. Every other parse error keeps uvicorn's 400.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from continuum.server.runtime import CLOSE_GRACE_S

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp, Receive, Scope, Send

# the most bytes of a request line and headers together (h11's own default is 16 KiB)
MAX_HEADER_BYTES = 64 * 1024
# after a 431, how long the rest of the request may still arrive (and be dropped) before the
# connection closes: closing with unread input resets it, and the client could lose the answer
LINGER_S = 2.0


def header_bytes(scope: Scope) -> int:
    """The size of a request's line and headers as sent (names, values and separators)."""
    target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope["query_string"]) + 1
    line = target + len(scope["method"]) + 11
    return line + sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + 2


def header_error() -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The 431 answer's headers and body (an OpenAI-style error naming the limit)."""
    message = (
        f"the request's header section is over {MAX_HEADER_BYTES // 1024} KiB: "
        "send fewer or shorter headers (put large values in the body)"
    )
    error = {"message": message, "type": "invalid_request_error", "code": "headers_too_large"}
    body = json.dumps({"error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


class Protocol(H11Protocol):
    """uvicorn's h11 protocol; a header section past :data:`MAX_HEADER_BYTES` gets a 431,
    then a lingering close: the server stops writing, drops what the client still sends, and
    closes when it stops or after :data:`LINGER_S` (a close with the rest of the request
    unread would reset the connection, and the reset can reach the client before it has read
    the answer)."""

    draining = False

    def data_received(self, data: bytes) -> None:
        if not self.draining:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        pending, _ = self.conn.trailing_data
        if len(pending) <= MAX_HEADER_BYTES:
            super().send_400_response(msg)
            return
        headers, body = header_error()
        response = h11.Response(
            status_code=431, headers=headers, reason=b"Request Header Fields Too Large"
        )
        for event in (response, h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.draining = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


class HeaderLimit:
    """ASGI middleware: a request whose header section is past :data:`MAX_HEADER_BYTES` gets
    the 431 :class:`Protocol` sends, whichever way its bytes arrived."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or header_bytes(scope) <= MAX_HEADER_BYTES:
            await self.app(scope, receive, send)
            return
        headers, body = header_error()
        await send({"type": "http.response.start", "status": 431, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def config(app: ASGIApp, host: str, port: int) -> uvicorn.Config:
    """The uvicorn settings every continuum server runs with (``serve``, benchmarks, tests)."""
    import uvicorn

    return uvicorn.Config(
        HeaderLimit(app),
        host=host,
        port=port,
        log_level="warning",
        http=Protocol,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=int(CLOSE_GRACE_S),  # then open requests are cancelled
    )


__all__ = [
    "MAX_HEADER_BYTES",
    "HeaderLimit",
    "Protocol",
    "config",
    "header_bytes",
    "header_error",
]
