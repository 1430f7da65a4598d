"""Prefetch on return over HTTP: a request that names its session in a header (an agent's
``X-Session-ID``) has that session's parked KV brought back into a free lane while its body is
read; a header naming no open session, or another tenant's, changes nothing. Real model."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from continuum.server.deps import hint_session_id
from tests.server.test_app import SYSTEM, Running, _serve


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("prefetch"), parallel=2)


def _ask(http: httpx.Client, srv: Running, agent: str, text: str) -> dict:
    body = {
        "model": srv.state.model_id,
        "messages": [
            {"role": "system", "content": f"{SYSTEM} You are agent {agent}."},
            {"role": "user", "content": text},
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    r = http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": agent})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_returning_agents_session_is_back_in_a_lane_before_its_turn(srv: Running) -> None:
    worker = srv.state.worker
    assert worker is not None
    with srv.http() as http:
        for agent in ("a1", "a2", "a3"):  # three agents, two lanes: one is parked
            _ask(http, srv, agent, "Run the tests.")
        held = {lane.session.id for lane in worker.lanes if lane.session is not None}
        (parked,) = [sid for sid in worker.sessions() if sid not in held]
        other = next(iter(held))
        assert http.delete(f"/v1/sessions/{other}").status_code == 200  # a lane frees
        before = dict(worker.residency.prefetched)
        agent = next(a for a in ("a1", "a2", "a3") if hint_session_id("default", a) == parked)
        r = _ask(http, srv, agent, "Run the tests.")
    assert worker.residency.prefetched["lane"] == before["lane"] + 1
    assert r["usage"]["continuum"]["resets"] == []


def test_a_header_naming_no_open_session_changes_nothing(srv: Running) -> None:
    worker = srv.state.worker
    assert worker is not None
    before = dict(worker.residency.prefetched)
    with srv.http() as http:
        r = http.post(
            "/v1/chat/completions",
            json={"model": srv.state.model_id, "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Continuum-Session": "no-such-session"},
        )
    assert r.status_code == 404  # the turn says so; the prefetch said nothing
    assert worker.residency.prefetched == before
