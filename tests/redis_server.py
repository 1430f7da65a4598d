"""A real ``redis-server`` (Debian's package) on a free loopback port, for the tests.

Started with ``deploy/redis.conf`` (AOF, ``appendfsync always``, no eviction) in its own
directory; ``kill()`` is SIGKILL (a crash), ``start()`` again replays the AOF. A machine without
``redis-server`` fails the test that needs it, with the command that installs it: the fleet is
tested against the real server or not at all.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

CONF = Path(__file__).resolve().parents[1] / "deploy" / "redis.conf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: apt-get install -y redis-server")
        self.binary = binary
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, str(CONF), "--port", str(self.port), "--dir", str(self.directory)]
        args += ["--daemonize", "no", "--logfile", str(self.directory / "redis.log")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"redis-server exited with {self.proc.returncode}:\n{log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        pytest.fail("redis-server did not answer PING within 20 s")

    def kill(self) -> None:
        """SIGKILL: what a crash does (no shutdown, no final fsync)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
