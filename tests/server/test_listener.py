"""The server's listener: a header section past the limit is a 431 with an error that names it,
however the bytes arrive; everything else is uvicorn's (a bad request line stays a 400)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from continuum.server import listener
from continuum.server.listener import MAX_HEADER_BYTES


def _echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(request.headers.get("x-big", ""))))


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    app = Starlette(routes=[Route("/", _echo)])
    server = uvicorn.Server(listener.config(app, "127.0.0.1", free))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    yield free
    server.should_exit = True
    thread.join(timeout=10)


def exchange(port: int, request: bytes, piece: int = 0) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` (in ``piece``-byte writes, 0: at once) and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        step = piece or len(request)
        pieces = [request[i : i + step] for i in range(0, len(request), step)]
        for p in pieces:
            try:
                c.sendall(p)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed before the rest arrived
            if piece:
                time.sleep(0.001)
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split()[1]), headers, body


def get(big: int) -> bytes:
    return b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: " + b"a" * big + b"\r\n\r\n"


@pytest.mark.parametrize("piece", [0, 4096, 1000])
def test_headers_past_the_limit_are_a_431_naming_it(port: int, piece: int) -> None:
    status, headers, body = exchange(port, get(MAX_HEADER_BYTES + 4096), piece)
    assert status == 431
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["code"] == "headers_too_large"
    assert f"{MAX_HEADER_BYTES // 1024} KiB" in error["message"]


def test_a_431_survives_a_client_that_keeps_sending(port: int) -> None:
    """The rest of the request still arrives after the answer: the server drops it and closes
    once the client is done (a lingering close), so the client reads the 431, never a reset."""
    request = get(MAX_HEADER_BYTES + 4096)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        for i in range(0, len(request), 4096):  # in pieces: the parser measures the header
            c.sendall(request[i : i + 4096])
            time.sleep(0.001)
        time.sleep(0.3)  # the server has answered
        c.sendall(b"x" * 256 * 1024)  # and more comes
        time.sleep(0.3)
        c.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 431 "), data[:80]
    assert b"headers_too_large" in data


@pytest.mark.parametrize("piece", [0, 4096])
def test_headers_over_h11s_default_but_under_the_limit_are_served(port: int, piece: int) -> None:
    size = 40 * 1024  # past h11's own 16 KiB default
    status, _, body = exchange(port, get(size), piece)
    assert (status, body) == (200, str(size).encode())


def test_a_malformed_request_is_still_a_400(port: int) -> None:
    status, headers, _ = exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400
    assert headers["connection"] == "close"


def test_the_listener_serves_on_after_a_431(port: int) -> None:
    assert exchange(port, get(MAX_HEADER_BYTES * 2), 8192)[0] == 431
    assert exchange(port, get(10))[:1] == (200,)
