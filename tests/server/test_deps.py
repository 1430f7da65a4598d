"""Who may touch a session, decided before anything is opened (on the fast model, over HTTP):
another tenant's session is refused from its store row, never activated or rebuilt; a
client-chosen id that is taken is a 409 that leaves the worker as it was."""

from __future__ import annotations

from pathlib import Path

from tests.server.test_app import _serve

TURN = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4}


def test_another_tenants_session_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    for srv in _serve(tmp_path):
        with srv.http(headers={"X-Continuum-Tenant": "alpha"}) as a:
            sid = a.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
            assert a.post(f"/v1/sessions/{sid}/messages", json=TURN).status_code == 200
    for srv in _serve(tmp_path):  # a new process: the session is only in the history store
        worker = srv.state.sessions()
        with srv.http(headers={"X-Continuum-Tenant": "beta"}) as b:
            assert b.get(f"/v1/sessions/{sid}").status_code == 404
            assert b.post(f"/v1/sessions/{sid}/messages", json=TURN).status_code == 404
            chat = {"model": srv.state.model_id, **TURN}
            r = b.post("/v1/chat/completions", json=chat, headers={"X-Continuum-Session": sid})
            assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
        assert sid not in worker.sessions() and worker.seq.tokens == []
        with srv.http(headers={"X-Continuum-Tenant": "alpha"}) as a:  # its owner still can
            assert a.get(f"/v1/sessions/{sid}").status_code == 200
        assert sid in worker.sessions()


def test_a_taken_session_id_is_a_409_that_changes_nothing(tmp_path: Path) -> None:
    for srv in _serve(tmp_path):
        worker = srv.state.sessions()
        with (
            srv.http(headers={"X-Continuum-Tenant": "alpha"}) as a,
            srv.http(headers={"X-Continuum-Tenant": "beta"}) as b,
        ):
            made = a.post("/v1/sessions", json={"system": "Be brief.", "session_id": "mine"})
            assert made.status_code == 201
            assert a.post("/v1/sessions/mine/messages", json=TURN).status_code == 200
            resident, active = list(worker.seq.tokens), worker.residency.active
            for client in (a, b):  # its owner, or another tenant: the same answer
                r = client.post("/v1/sessions", json={"system": "Other.", "session_id": "mine"})
                assert r.status_code == 409 and r.json()["error"]["code"] == "session_exists"
                assert str(tmp_path) not in r.text  # no store path in the answer
            # the sequence is the first session's still (its eager glue may have grown it)
            assert worker.seq.tokens[: len(resident)] == resident
            assert worker.residency.active is active
            assert worker.sessions() == ["mine"]
            history = a.get("/v1/sessions/mine").json()
            assert [m["role"] for m in history["history"]] == ["system", "user", "assistant"]
            assert a.post("/v1/sessions/mine/messages", json=TURN).status_code == 200
