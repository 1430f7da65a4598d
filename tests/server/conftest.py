"""Fixtures shared by the server tests: a guard that keeps agent frameworks on loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@pytest.fixture(scope="module")
def blocked() -> Iterator[list[str]]:
    """Refuse (and record) every connection and name lookup that is not loopback."""
    attempts: list[str] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def _check(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            attempts.append(f"connect {address!r}")
            raise OSError(f"network disabled in this test module: connect to {address!r}")

    def connect(sock: socket.socket, address: Any) -> None:
        _check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        _check(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name is not None and name not in LOOPBACK:
            attempts.append(f"getaddrinfo {name!r}")
            raise socket.gaierror(f"network disabled in this test module: lookup of {name!r}")
        return real_getaddrinfo(host, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", connect)
        mp.setattr(socket.socket, "connect_ex", connect_ex)
        mp.setattr(socket, "getaddrinfo", getaddrinfo)
        yield attempts


@pytest.fixture
def stays_offline(blocked: list[str]) -> Iterator[None]:
    """Fails the test that tried to reach anything but loopback (agent SDKs export traces,
    tokenizers fetch files: nothing may leave the machine)."""
    before = len(blocked)
    yield
    assert blocked[before:] == [], "something tried to reach the network"
