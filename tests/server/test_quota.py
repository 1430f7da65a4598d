"""Per-tenant session limits on a real server (fast model, loopback): the stored limit
refuses with a 429 that says what to do; the open limit and the idle rule close sessions
(history kept, reopened from the log on their next request); one tenant's load never closes
another tenant's sessions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from continuum.server.quota import SessionLimits
from tests.server.test_app import Running, _serve


@contextmanager
def tenants(srv: Running) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    """Clients of two tenants, alpha and beta."""
    with (
        srv.http(headers={"X-Continuum-Tenant": "alpha"}) as a,
        srv.http(headers={"X-Continuum-Tenant": "beta"}) as b,
    ):
        yield a, b


TURN = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4, "temperature": 0}


def test_a_tenant_past_its_stored_limit_is_refused_until_it_deletes(tmp_path: Path) -> None:
    for srv in _serve(tmp_path, sessions=SessionLimits(max_stored=2)):
        with tenants(srv) as (a, b):
            ids = [a.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
            before = srv.state.sessions().sessions()
            r = a.post("/v1/sessions", json={"system": "One too many."})
            assert r.status_code == 429 and r.json()["error"]["code"] == "session_quota_exceeded"
            assert "DELETE /v1/sessions" in r.json()["error"]["message"]
            assert srv.state.sessions().sessions() == before  # nothing was created
            hinted = {"model": "continuum", **TURN}
            r = a.post("/v1/chat/completions", json=hinted, headers={"X-Session-ID": "new"})
            assert r.status_code == 429  # a hinted session counts too
            assert b.post("/v1/sessions", json={}).status_code == 201  # another tenant can
            assert a.delete(f"/v1/sessions/{ids[0]}").status_code == 200
            assert a.post("/v1/sessions", json={}).status_code == 201


def test_opening_past_the_open_limit_closes_the_least_recently_used(tmp_path: Path) -> None:
    for srv in _serve(tmp_path, sessions=SessionLimits(max_open=2)):
        worker = srv.state.sessions()
        with tenants(srv) as (a, b):
            theirs = b.post("/v1/sessions", json={}).json()["id"]
            s1, s2 = (a.post("/v1/sessions", json={}).json()["id"] for _ in range(2))
            assert a.post(f"/v1/sessions/{s1}/messages", json=TURN).status_code == 200
            s3 = a.post("/v1/sessions", json={}).json()["id"]  # s2 is alpha's least recent
            assert set(worker.sessions()) == {theirs, s1, s3}
            r = a.post(f"/v1/sessions/{s2}/messages", json=TURN)  # reopened from the log
            assert r.status_code == 200
            resets = r.json()["usage"]["continuum"]["resets"]
            assert [x["reason"] for x in resets] == ["evicted"]
            assert set(worker.sessions()) == {theirs, s2, s3}
            history = a.get(f"/v1/sessions/{s1}").json()["history"]  # closed, not lost
            assert [m["role"] for m in history] == ["user", "assistant"]
        assert srv.state.quota.closed == 3


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_idle_sessions_are_closed_with_their_history_kept(tmp_path: Path) -> None:
    for srv in _serve(tmp_path, sessions=SessionLimits(idle_close_s=1.0)):
        worker = srv.state.sessions()
        with tenants(srv) as (a, b):
            idle = a.post("/v1/sessions", json={}).json()["id"]
            r = a.post(f"/v1/sessions/{idle}/messages", json=TURN)
            assert r.status_code == 200, r.text
            time.sleep(1.5)
            busy = b.post("/v1/sessions", json={}).json()["id"]  # a sweep runs on each use
            assert worker.sessions() == [busy]
            assert len(a.get(f"/v1/sessions/{idle}").json()["turns"]) == 1
            assert idle in worker.sessions()


def test_the_session_in_use_is_never_the_one_the_sweep_closes() -> None:
    """A request that arrives after the idle limit is served by its session, not refused
    because the sweep it triggers closed that very session."""
    from continuum.server.quota import SessionQuota

    now = [0.0]
    quota = SessionQuota(SessionLimits(idle_close_s=1.0), clock=lambda: now[0])

    class Open:
        def __init__(self, sid: str) -> None:
            self.id, self.closed = sid, False

        def close(self) -> None:
            self.closed = True

    mine, other = Open("mine"), Open("other")
    quota.use("alpha", mine)  # type: ignore[arg-type]
    quota.use("beta", other)  # type: ignore[arg-type]
    now[0] = 5.0
    quota.use("alpha", mine)  # type: ignore[arg-type]
    assert not mine.closed and other.closed and quota.closed == 1
