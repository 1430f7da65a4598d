"""Drain and move: a worker parks its sessions in the shared Redis and leaves the fleet, and
another worker on the same Redis resumes each one with no prompt token evaluated again beyond
the new message (DESIGN.md §6)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from continuum.server.auth import KeyRing
from tests.redis_server import RedisServer
from tests.server.test_app import SYSTEM, Running, _serve

ADMIN = "admin-0123456789abcdef"
TENANT_KEY = "tenant-0123456789abcdef"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def serve(tmp: Path, redis: RedisServer, **kw: Any) -> Iterator[Running]:
    return _serve(tmp, store=redis.url + "?prefix=fleet", n_ctx=2048, admin_key=ADMIN, **kw)


def say(h: Any, sid: str, text: str) -> dict[str, Any]:
    r = h.post(
        f"/v1/sessions/{sid}/messages",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 8},
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_drained_workers_session_resumes_on_another_with_no_prefill(
    tmp_path: Path, redis: RedisServer
) -> None:
    for a in serve(tmp_path / "a", redis):
        with a.http() as h:
            sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
            say(h, sid, "My name is Priya.")
            say(h, sid, "I have a dog named Biscuit.")
            assert h.post("/admin/drain").status_code == 401  # no key
            bad = h.post("/admin/drain", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_admin_key"
            done = h.post("/admin/drain", headers={"Authorization": f"Bearer {ADMIN}"})
            assert done.status_code == 200 and done.json()["parked"] >= 1, done.text
            health = h.get("/health")
            assert health.status_code == 503 and health.json()["status"] == "draining"
            refused = h.post("/v1/sessions", json={"system": SYSTEM})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
            resident = len(a.state.worker.seq.tokens) if a.state.worker else 0  # type: ignore[union-attr]
        for b in serve(tmp_path / "b", redis):  # a second worker, while the first still runs
            with b.http() as h:
                assert h.get("/health").status_code == 200
                usage = say(h, sid, "What is my name?")["usage"]["continuum"]
                (reset,) = usage["resets"]
                assert reset["reason"] == "evicted" and "restored" in reset["detail"]
                assert usage["tokens_reused"] >= resident > 0
                new_only = usage["prompt_tokens_evaluated"]
                assert new_only < 30  # the new message and its template, nothing before it
                assert len(h.get(f"/v1/sessions/{sid}").json()["turns"]) == 3


def test_admin_routes_are_off_without_a_key_and_no_tenant_key_opens_them(
    tmp_path: Path, redis: RedisServer
) -> None:
    for s in _serve(tmp_path, store=redis.url + "?prefix=off", n_ctx=1024):
        with s.http() as h:
            off = h.post("/admin/drain")
            assert off.status_code == 403 and off.json()["error"]["code"] == "admin_disabled"
            assert h.get("/health").json()["status"] == "ok"
    keys = KeyRing.parse([TENANT_KEY])
    for s in serve(tmp_path / "k", redis, keys=keys):
        with s.http() as h:
            tenant = h.post("/admin/drain", headers={"Authorization": f"Bearer {TENANT_KEY}"})
            assert tenant.status_code == 401  # a tenant's key is not the admin key
            assert not s.state.draining


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_sigterm_parks_every_session_in_redis_as_serve_stops(
    tmp_path: Path, redis: RedisServer
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import httpx

    from continuum.store.redis_client import RedisTarget
    from tests.redis_server import free_port

    port, url = free_port(), redis.url + "?prefix=term"
    exe = Path(sys.executable).parent / "continuum"
    env = {**os.environ, "CONTINUUM_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port), "--store", url, "--n-ctx", "2048"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=120) as h:
            sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
            say(h, sid, "My name is Priya.")
        target = RedisTarget(url)
        assert target.client.zcard(target.key("kv", "lru")) == 0  # resident, not parked yet
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
        names = [
            target.client.hget(m, "key")
            for m in target.client.scan_iter(match=target.key("kv", "meta", "*"))
        ]
        assert f"session:{sid}".encode() in names
    finally:
        if proc.poll() is None:
            proc.kill()
