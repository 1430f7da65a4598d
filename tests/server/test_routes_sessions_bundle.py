"""Moving a session between two servers (separate SQLite stores, 127.0.0.1) as one bundle:
``GET /v1/sessions/{id}/bundle`` on one, ``POST /v1/sessions/import`` on the other. The moved
session answers as the first server would have, evaluating only the new message; bad bundles
get the right 4xx and leave the second server's store unchanged; KV from another llama.cpp
build is dropped and the session rebuilt, visibly; and a tenant moves only its own sessions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from continuum.backends.llama_process import build_id
from continuum.server.auth import DEFAULT_TENANT, KeyRing
from continuum.stateful.residency import snapshot_key
from continuum.store.bundle_format import MEDIA_TYPE, decode_bundle, encode_bundle
from continuum.store.snapshot_format import decode_snapshot, encode_snapshot
from tests.server.test_app import SYSTEM, Running, _serve
from tests.store.test_bundle_format import resign

TURNS = ["My name is Priya.", "I have a dog named Biscuit.", "I live in Lisbon."]
ASK = "What is my name?"
LIMIT = 8 << 20  # --max-body-bytes of the servers here
KEY_A, KEY_B = "alpha-key-0123456789abcdef", "beta-key-0123456789abcdef"
IMPORT = "/v1/sessions/import"


def serve(tmp: Path, **kw: Any) -> Iterator[Running]:
    return _serve(tmp, n_ctx=2048, max_body_bytes=LIMIT, **kw)  # eager glue on, as served


def say(srv: Running, sid: str, text: str, **kw: Any) -> dict[str, Any]:
    """A turn through the OpenAI SDK's raw post (the sessions API is ours, not OpenAI's)."""
    body: dict[str, Any] = srv.client(**kw).post(
        f"/sessions/{sid}/messages",
        body={"messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0},
        cast_to=object,
    )
    return body


def send(h: httpx.Client, body: bytes, **headers: str) -> httpx.Response:
    return h.post(IMPORT, content=body, headers={"content-type": MEDIA_TYPE, **headers})


def other_build(srv: Running, blob: bytes) -> bytes:
    """``blob`` with its KV snapshot's header naming another llama.cpp build."""
    b = decode_bundle(blob)
    assert b.snapshot is not None and srv.state.worker is not None
    ctx = srv.state.worker.seq.backend.context_config()
    snap = decode_snapshot(b.snapshot, model=b.record.model_digest, ctx=ctx)
    foreign = encode_snapshot(
        namespace=snap.namespace,
        model=b.record.model_digest,
        ctx={**ctx, "llama_build": "llama-cpp-python 0.2.0; llama.cpp 7654321"},
        tokens=snap.tokens,
        payload=snap.payload,
        prefix=str(snap.header["prefix_hash"]),
        key=snapshot_key(b.record.id),
    )
    return encode_bundle(type(b)(b.record, b.messages, b.turns, b.resets, foreign, 0.0))


def refusals(blob: bytes) -> list[tuple[str, bytes, dict[str, str], int, str]]:
    """Bad imports: (what, body, headers, status, code)."""
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0x40
    owner = {"tenant": "alpha", "config": {"tenant": "alpha"}}
    return [
        ("truncated", blob[:-100], {}, 400, "bundle_corrupt"),
        ("one byte flipped", bytes(flipped), {}, 400, "bundle_corrupt"),
        ("not a bundle", b"hello " * 20, {}, 400, "bundle_corrupt"),
        (
            "format 7",
            resign(blob, lambda h: h.update(format=7)),
            {},
            400,
            "bundle_version_unsupported",
        ),
        (
            "another model",
            resign(blob, lambda h: h["session"].update(model_digest="sha256:00")),
            {},
            409,
            "bundle_model_mismatch",
        ),
        (
            "another tenant",
            resign(blob, lambda h: h["session"].update(owner)),
            {},
            403,
            "bundle_tenant_mismatch",
        ),
        (
            "a hint's id",
            resign(blob, lambda h: h["session"].update(id="hint-0123")),
            {},
            400,
            "invalid_request",
        ),
        ("sent as JSON", blob, {"content-type": "application/json"}, 415, "unsupported_media_type"),
        (
            "sent as a form's text",
            blob,
            {"content-type": "text/plain"},
            415,
            "unsupported_media_type",
        ),  # a browser may send that cross-origin without asking
        ("over the body limit", b"x" * (LIMIT + 1), {}, 413, "body_too_large"),
    ]


@pytest.mark.slow
def test_a_session_moves_between_servers_and_answers_as_it_would_have(tmp_path: Path) -> None:
    for a in serve(tmp_path / "a"):
        for b in serve(tmp_path / "b"):
            with a.http() as ha, b.http() as hb:
                sid = ha.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
                for text in TURNS:
                    say(a, sid, text)
                # the next turn's opening template tokens are decoded while idle: let that
                # finish, so A's next turn and B's decode the same batches (a batch of < 8
                # tokens gives other logits than the same tokens inside a larger one)
                assert a.state.worker is not None and a.state.worker.settle()
                got = ha.get(f"/v1/sessions/{sid}/bundle")
                assert got.status_code == 200, got.text
                assert got.headers["content-type"] == MEDIA_TYPE
                blob = got.content
                exported = decode_bundle(blob)
                assert exported.snapshot is not None and exported.record.turns == 3
                kv = decode_snapshot(
                    exported.snapshot,
                    model=exported.record.model_digest,
                    ctx=a.state.worker.seq.backend.context_config(),  # type: ignore[union-attr]
                )
                assert kv.header["ctx"]["llama_build"] == build_id()
                at_export = ha.get(f"/v1/sessions/{sid}").json()
                on_a = say(a, sid, ASK)

                for what, body, headers, status, code in refusals(blob):
                    r = send(hb, body, **headers)
                    assert (r.status_code, r.json()["error"]["code"]) == (status, code), what
                    assert hb.get(f"/v1/sessions/{sid}").status_code == 404, what
                chunked = hb.post(  # no Content-Length: measured as it is read
                    IMPORT,
                    content=iter([b"x" * (1 << 20)] * 9),
                    headers={"content-type": MEDIA_TYPE},
                )
                assert chunked.status_code == 413
                assert b.state.worker.store.count_sessions(DEFAULT_TENANT) == 0  # type: ignore[union-attr]

                imported = send(hb, blob)
                assert imported.status_code == 201, imported.text
                body = imported.json()
                assert body["kv"] == {"outcome": "restored", "detail": ""}
                assert {k: body[k] for k in at_export} == at_export  # as GET answers on A
                again = send(hb, blob)
                assert (again.status_code, again.json()["error"]["code"]) == (409, "session_exists")

                on_b = say(b, sid, ASK)
                text = on_b["choices"][0]["message"]["content"]
                assert text == on_a["choices"][0]["message"]["content"]  # greedy: the same reply
                ua, ub = on_a["usage"]["continuum"], on_b["usage"]["continuum"]
                (reset,) = ub["resets"]
                # the whole history restored from A's KV, nothing of it decoded again
                # (tokens_rebuilt 0); of what A had resident only the template tokens that open
                # the next message (decoded while idle) are left out: B's turn decodes them with
                # the new message
                restored = int(reset["detail"].split("restored ")[1].split()[0])
                opening = len(kv.tokens) - restored
                assert reset["reason"] == "evicted" and reset["tokens_rebuilt"] == 0
                assert 0 <= opening <= 4 and ua["tokens_reused"] == len(kv.tokens)
                assert ub["tokens_reused"] == restored
                assert ub["prompt_tokens_evaluated"] == ua["prompt_tokens_evaluated"] + opening
                assert ub["prompt_tokens_evaluated"] < 30

                # the same session with KV from another llama.cpp build: imported, KV dropped
                assert hb.delete(f"/v1/sessions/{sid}").status_code == 200
                dropped = send(hb, other_build(a, blob))
                assert dropped.status_code == 201, dropped.text
                outcome = dropped.json()["kv"]
                assert outcome["outcome"] == "dropped" and "7654321" in outcome["detail"]
                rebuilt = say(b, sid, ASK)["usage"]["continuum"]
                (reset,) = rebuilt["resets"]
                assert (
                    reset["reason"] == "restore_failed"
                    and "another llama.cpp build" in (reset["detail"])
                )
                # everything decoded again (but the next turn's opening template tokens)
                assert reset["tokens_rebuilt"] >= len(kv.tokens) - 4


def test_a_tenant_moves_only_its_own_sessions(tmp_path: Path) -> None:
    keys = KeyRing.parse([f"alpha={KEY_A}", f"beta={KEY_B}"])
    for srv in serve(tmp_path, keys=keys):
        alpha = srv.http(headers={"Authorization": f"Bearer {KEY_A}"})
        beta = srv.http(headers={"Authorization": f"Bearer {KEY_B}"})
        with alpha, beta:
            sid = alpha.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
            say(srv, sid, TURNS[0], api_key=KEY_A)
            theirs = beta.get(f"/v1/sessions/{sid}/bundle")
            assert (theirs.status_code, theirs.json()["error"]["code"]) == (
                404,
                "session_not_found",
            )
            assert srv.http().get(f"/v1/sessions/{sid}/bundle").status_code == 401  # no key
            got = alpha.get(f"/v1/sessions/{sid}/bundle", params={"kv": "false"})
            assert got.status_code == 200 and decode_bundle(got.content).snapshot is None
            assert decode_bundle(got.content).record.tenant == "alpha"
            assert alpha.delete(f"/v1/sessions/{sid}").status_code == 200

            refused = send(beta, got.content)  # alpha's bundle is never re-owned by beta
            assert (refused.status_code, refused.json()["error"]["code"]) == (
                403,
                "bundle_tenant_mismatch",
            )
            store = srv.state.worker.store  # type: ignore[union-attr]
            assert store.count_sessions("beta") == 0 and store.count_sessions("alpha") == 0
            narrowed = send(alpha, got.content, **{"x-continuum-tenant": "ci"})
            assert narrowed.status_code == 403  # alpha/ci is not alpha either

            back = send(alpha, got.content)
            assert back.status_code == 201 and back.json()["kv"]["outcome"] == "none"
            assert store.session_tenant(sid) == "alpha"
            assert beta.get(f"/v1/sessions/{sid}").status_code == 404
            assert beta.get(f"/v1/sessions/{sid}/bundle").status_code == 404
            r = say(srv, sid, TURNS[1], api_key=KEY_A)["usage"]["continuum"]
            assert [x["reason"] for x in r["resets"]] == ["evicted"]  # rebuilt from history
