"""API keys bound to tenants, and the browser guards (DNS rebinding, cross-site requests): the
key ring on its own, then a real server on loopback with two tenants' keys."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from starlette.middleware.base import BaseHTTPMiddleware

from continuum import InvalidRequest
from continuum.server.app import Guard, create_app
from continuum.server.auth import (
    LOOPBACK_HOSTS,
    KeyRing,
    allowed_hosts_for,
    host_name,
    namespace,
    new_key,
    origin_allowed,
)
from tests.server.test_app import _serve

KEY_A, KEY_B = "alpha-key-0123456789abcdef", "beta-key-0123456789abcdef"
TURN = {"messages": [{"role": "user", "content": "Hello."}], "max_tokens": 4, "temperature": 0}


def test_a_key_names_its_tenant_and_only_its_digest_is_held() -> None:
    ring = KeyRing.parse([f"alpha={KEY_A}", f"beta={KEY_B}"])
    assert ring.tenant_of(KEY_A) == "alpha" and ring.tenant_of(KEY_B) == "beta"
    assert ring.tenant_of("alpha") is None and ring.tenant_of("") is None
    assert ring.tenant_of(KEY_A + "x") is None and ring.tenant_of(KEY_A[:-1]) is None
    assert KEY_A not in repr(ring)
    assert ring.credentials[0].digest == hashlib.sha256(KEY_A.encode()).digest()
    assert KeyRing.parse([KEY_A]).tenant_of(KEY_A) == "default"  # a bare key
    assert KeyRing().open and not ring.open and ring.tenants() == ["alpha", "beta"]


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        (["alpha=short"], "at least 16"),
        ([f"al pha={KEY_A}"], "not a valid name"),
        ([f"../x={KEY_A}"], "not a valid name"),
        ([f"alpha={KEY_A}", f"beta={KEY_A}"], "twice"),
    ],
)
def test_bad_keys_are_refused_with_what_to_do(specs: list[str], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        KeyRing.parse(specs)


def test_a_keys_file_holds_digests_and_a_bad_line_is_named(tmp_path: Path) -> None:
    key = new_key()
    assert len(key) > 40 and key != new_key()
    good = tmp_path / "keys.txt"
    digest = hashlib.sha256(key.encode()).hexdigest()
    good.write_text(f"# team keys\nalpha sha256:{digest}  # laptop\n\n")
    assert KeyRing.parse([], [good]).tenant_of(key) == "alpha"
    for text in (f"alpha {digest}\n", "alpha sha256:abc\n", f"alpha sha256:{digest} x\n"):
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(InvalidRequest, match="line 1"):
            KeyRing.parse([], [bad])
    with pytest.raises(InvalidRequest, match="keys add"):
        KeyRing.parse([], [tmp_path / "missing.txt"])


def test_a_header_narrows_within_the_tenant_and_cannot_leave_it() -> None:
    assert namespace("alpha", None) == "alpha" == namespace("alpha", " ")
    assert namespace("alpha", "alpha") == "alpha"
    assert namespace("alpha", "beta") == "alpha/beta"
    for bad in ("beta/../alpha", "a b", "x" * 65):
        with pytest.raises(InvalidRequest, match="X-Continuum-Tenant"):
            namespace("alpha", bad)


def test_host_and_origin_rules() -> None:
    assert host_name("127.0.0.1:8000") == "127.0.0.1" and host_name("[::1]:80") == "::1"
    assert host_name("LocalHost") == "localhost" and host_name("::1") == "::1"
    assert allowed_hosts_for("127.0.0.1") == LOOPBACK_HOSTS
    assert allowed_hosts_for("0.0.0.0") is None
    assert allowed_hosts_for("0.0.0.0", ["api.example.com:443"]) == ("api.example.com",)
    assert origin_allowed(None, "127.0.0.1:8000")
    assert origin_allowed("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert not origin_allowed("http://evil.example", "127.0.0.1:8000")
    assert not origin_allowed("null", "127.0.0.1:8000")


def test_the_constant_time_check_looks_at_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the digest of the presented key is compared with every held one."""
    import hmac

    ring = KeyRing.parse([f"t{i}={KEY_A}{i}" for i in range(200)])
    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    assert ring.tenant_of(f"{KEY_A}0") == "t0" and len(calls) == 200


def test_keys_name_tenants_on_the_server(tmp_path: Path) -> None:
    ring = KeyRing.parse([f"alpha={KEY_A}", f"beta={KEY_B}"])
    for srv in _serve(tmp_path, keys=ring):
        a = srv.http(headers={"Authorization": f"Bearer {KEY_A}"})
        b = srv.http(headers={"Authorization": f"Bearer {KEY_B}"})
        with a, b:
            sid = a.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
            assert a.post(f"/v1/sessions/{sid}/messages", json=TURN).status_code == 200
            assert srv.state.sessions().store.session_tenant(sid) == "alpha"
            # streamed: the guard's tenant reaches the route, and a refusal is a plain 401
            streamed = {**TURN, "stream": True}
            with a.stream("POST", f"/v1/sessions/{sid}/messages", json=streamed) as r:
                events = [line for line in r.iter_lines() if line.startswith("data:")]
            assert r.status_code == 200 and events[-1] == "data: [DONE]" and len(events) > 2
            r = b.post(f"/v1/sessions/{sid}/messages", json=streamed)
            assert r.status_code == 404  # beta does not see alpha's session
            with srv.http() as nokey:
                r = nokey.post(f"/v1/sessions/{sid}/messages", json=streamed)
            assert r.status_code == 401 and r.headers["content-type"] == "application/json"
            # beta's key with a header naming alpha is still beta (narrowed: beta/alpha)
            for tenant in ("alpha", "beta", None):
                headers = {"X-Continuum-Tenant": tenant} if tenant else {}
                assert b.get(f"/v1/sessions/{sid}", headers=headers).status_code == 404
            # alpha narrowed to a sub-namespace does not see its parent's session either
            sub = {"X-Continuum-Tenant": "ci"}
            assert a.get(f"/v1/sessions/{sid}", headers=sub).status_code == 404
            assert a.get(f"/v1/sessions/{sid}").status_code == 200
            r = a.get("/v1/models", headers={"X-Continuum-Tenant": "../beta"})
            assert r.status_code == 200  # the header only matters where a namespace is used
            r = a.get(f"/v1/sessions/{sid}", headers={"X-Continuum-Tenant": "../beta"})
            assert r.status_code == 400 and "X-Continuum-Tenant" in r.json()["error"]["message"]


def test_browser_guards_and_no_paths_in_answers(tmp_path: Path) -> None:
    for srv in _serve(tmp_path):
        with srv.http() as h:
            r = h.get("/v1/models", headers={"Host": "evil.example:8000"})  # DNS rebinding
            assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
            r = h.post(
                "/v1/chat/completions",
                json={"model": "continuum", **TURN},
                headers={"Origin": "http://evil.example"},
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
            for kind in ("text/plain", "application/x-www-form-urlencoded", None):
                headers = {"content-type": kind} if kind else {}
                r = h.post(
                    "/v1/chat/completions", content=b'{"model": "continuum"}', headers=headers
                )
                assert r.status_code == 415, kind
                assert r.json()["error"]["code"] == "unsupported_media_type"
            r = h.post(
                "/v1/chat/completions",
                json={"model": "continuum", **TURN},
                headers={"Origin": srv.url},  # the server's own origin
            )
            assert r.status_code == 200
            listed = h.get("/v1/models").text + h.get("/health").text
            model_path = str(srv.state.engine.backend.model.path)  # type: ignore[attr-defined]
            assert model_path not in listed and str(Path(model_path).parent) not in listed


def test_the_guard_is_plain_asgi(tmp_path: Path) -> None:
    """Starlette's ``BaseHTTPMiddleware`` relays every streamed chunk through a memory stream
    and a task of its own (measured: a third more event-loop CPU per streamed token); the
    guard is a plain ASGI middleware, and the only one."""
    for srv in _serve(tmp_path):
        layers = [m.cls for m in create_app(srv.state).user_middleware]
        assert layers == [Guard] and BaseHTTPMiddleware not in layers
