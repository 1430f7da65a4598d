"""The ``X-Continuum-Pause`` header: a client's word for how long its tool will run before the
conversation's next request. It prices parking the session (``continuum.stateful.park_price``);
a bad value is a 400 naming the header, before any work. On the real model, two lanes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server.test_app import SYSTEM, Running, _serve


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("pause"), parallel=2)


def _chat(srv: Running, headers: dict[str, str], key: str | None = "agent-p") -> int:
    body = {
        "model": srv.state.model_id,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Run the tests."},
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    if key is not None:
        body["prompt_cache_key"] = key
    with srv.http() as http:
        r = http.post("/v1/chat/completions", json=body, headers=headers)
    if r.status_code == 400:
        assert "X-Continuum-Pause" in r.json()["error"]["message"]
    return r.status_code


def test_a_hinted_turn_carries_the_clients_pause_to_its_session(srv: Running) -> None:
    worker = srv.state.worker
    assert worker is not None
    assert _chat(srv, {"X-Continuum-Pause": "30"}) == 200
    (session,) = [lane.session for lane in worker.lanes if lane.session is not None]
    assert session.pauses.hint_s == 30.0 and session.pauses.ended is not None
    assert session.pauses.remaining_s(session.pauses.ended + 1.0) == pytest.approx(29.0)
    assert _chat(srv, {}) == 200  # the next turn: its pause is learned, not hinted
    assert session.pauses.hint_s is None and len(session.pauses.pauses) == 1
    assert _chat(srv, {"X-Continuum-Pause": "0.5"}, key=None) == 200  # stateless: accepted


@pytest.mark.parametrize("bad", ["-1", "soon", "nan", "1e12", ""])
def test_a_bad_pause_is_a_400_naming_the_header_before_any_work(srv: Running, bad: str) -> None:
    worker = srv.state.worker
    assert worker is not None
    before = sorted(worker.sessions())
    assert _chat(srv, {"X-Continuum-Pause": bad}, key=f"agent-bad-{bad}") == 400
    body = {"model": srv.state.model_id, "input": "hi", "prompt_cache_key": "agent-r"}
    with srv.http() as http:
        r = http.post("/v1/responses", json=body, headers={"X-Continuum-Pause": bad})
    assert r.status_code == 400 and "X-Continuum-Pause" in r.json()["error"]["message"]
    assert sorted(worker.sessions()) == before  # no session was made for it
