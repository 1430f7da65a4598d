"""`continuum serve` on the real default model, on 127.0.0.1, driven by the official OpenAI SDK
and by raw HTTP: completions, streaming, sessions, tenants, auth, limits and bad input."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from continuum.server import listener
from continuum.server.app import create_app
from continuum.server.auth import KeyRing
from continuum.server.state import ServerConfig, ServerState, build_state
from tests.server.test_listener import exchange, get

SYSTEM = "You are Eva, a concise assistant."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    url: str
    state: ServerState

    def client(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key=kw.pop("api_key", "none"),  # type: ignore[arg-type]
            max_retries=0,
            **kw,
        )  # type: ignore[arg-type]

    def http(self, **kw: object) -> httpx.Client:
        kw.setdefault("timeout", 120)
        return httpx.Client(base_url=self.url, **kw)  # type: ignore[arg-type]


def _serve(tmp: Path, **cfg: object) -> Iterator[Running]:
    settings: dict[str, object] = {
        "n_ctx": 4096,
        "store": tmp / "history.db",
        "snapshot_dir": tmp / "snaps",
        "default_max_tokens": 12,
        "n_slots": 3,
    }
    config = ServerConfig.of(**{**settings, **cfg})
    state = build_state(config)
    port = free_port()
    server = uvicorn.Server(listener.config(create_app(state), "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield Running(f"http://127.0.0.1:{port}", state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        state.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("serve"), max_queue=4)


def chat(srv: Running, content: str, **kw: object):  # type: ignore[no-untyped-def]
    return srv.client().chat.completions.create(
        model=srv.state.model_id,
        max_tokens=12,
        temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        **kw,  # type: ignore[arg-type]
    )


def test_chat_through_the_sdk_shows_cached_tokens(srv: Running) -> None:
    first = chat(srv, "Name a colour.")
    assert isinstance(first.choices[0].message.content, str)
    assert first.usage is not None and first.usage.prompt_tokens > 10
    again = chat(srv, "Name a colour.")
    assert again.choices[0].message.content == first.choices[0].message.content
    u = again.usage
    assert u is not None and u.prompt_tokens_details is not None
    assert u.prompt_tokens_details.cached_tokens == u.prompt_tokens  # served from memo
    assert u.model_extra["continuum"]["hit_tier"] == "memo"  # type: ignore[index]
    other = chat(srv, "Name an animal.")  # shares the system prompt: a prefix hit
    assert other.usage is not None and other.usage.prompt_tokens_details is not None
    assert other.usage.prompt_tokens_details.cached_tokens > 0
    assert other.usage.model_extra["continuum"]["hit_tier"] == "prefix_kv"  # type: ignore[index]


# what every request's usage.continuum holds, whatever served it (Metrics.to_dict())
VOCABULARY = {
    "hit_tier",
    "tiers",
    "prompt_tokens",
    "prompt_tokens_evaluated",
    "tokens_reused",
    "reuse_known",
    "tokens_truncated",
    "completion_tokens",
    "backend_called",
    "lookup_ms",
    "ttft_ms",
    "total_ms",
    "resets",
    "fed_tokens",
    "eager_tokens_used",
    "eager_tokens_discarded",
}
TURN_ONLY = {"session", "turn", "prefill_ms", "context_used", "context_limit", "high_water"}


def test_every_api_reports_usage_in_one_vocabulary(srv: Running) -> None:
    """A stateless chat completion, a completion, a stateless Responses call, a hinted chat
    (a turn of a resident session) and a turn of the sessions API: one metrics vocabulary in
    ``usage.continuum``, the OpenAI-shaped counts taken from it."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a tree."}]
    chat_body = {"model": srv.state.model_id, "max_tokens": 6, "temperature": 0, "messages": msgs}
    with srv.http() as h:
        sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        replies = {
            "chat": h.post("/v1/chat/completions", json=chat_body),
            "hinted chat": h.post(
                "/v1/chat/completions", json=chat_body, headers={"X-Session-ID": "vocab"}
            ),
            "completion": h.post(
                "/v1/completions",
                json={"model": srv.state.model_id, "prompt": "Trees are", "max_tokens": 6},
            ),
            "responses": h.post(
                "/v1/responses",
                json={"model": srv.state.model_id, "input": "Name a bird.", "max_output_tokens": 6},
            ),
            "session turn": h.post(
                f"/v1/sessions/{sid}/messages",
                json={"messages": [{"role": "user", "content": "Name a fish."}], "max_tokens": 6},
            ),
        }
        counters = h.get("/metrics").text
    for api, r in replies.items():
        assert r.status_code == 200, (api, r.text)
        u = r.json()["usage"]
        c = u["continuum"]
        assert c.keys() >= VOCABULARY, (api, VOCABULARY - c.keys())
        assert not {"tokens_sent", "tokens_saved"} & c.keys(), api  # one name for each figure
        in_session = api in ("hinted chat", "session turn")
        assert (c.keys() >= TURN_ONLY) if in_session else not (TURN_ONLY & c.keys()), api
        prompt = u.get("prompt_tokens", u.get("input_tokens"))
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details")
        assert prompt == c["prompt_tokens"] > 0, api
        assert details["cached_tokens"] == c["tokens_reused"], api
        assert c["prompt_tokens_evaluated"] + c["tokens_reused"] == c["prompt_tokens"], api
        assert c["completion_tokens"] == u.get("completion_tokens", u.get("output_tokens")) > 0
        if api == "hinted chat":  # the stateless chat's stored answer serves the turn
            assert c["hit_tier"] == "memo" and not c["backend_called"]
        else:
            assert c["backend_called"] and c["hit_tier"] in ("cold", "prefix_kv"), api
    assert "continuum_prompt_tokens_evaluated_total" in counters
    assert "continuum_tokens_reused_total" in counters


def test_streaming_through_the_sdk(srv: Running) -> None:
    stream = chat(srv, "Tell me about rivers.", stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for event in stream:
        if event.choices:
            text += event.choices[0].delta.content or ""
            finish = event.choices[0].finish_reason or finish
        if event.usage is not None:
            usage = event.usage
    assert text and finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens > 0
    plain = chat(srv, "Tell me about rivers.")
    assert plain.choices[0].message.content == text  # the same reply (now from memo)


def test_context_overflow_is_openais_error_with_the_token_counts(srv: Running) -> None:
    """Agent frameworks compact a conversation on this error: the code is OpenAI's, and the
    message opens as OpenAI's does and says how many tokens were asked for."""
    c = srv.client()
    huge = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=srv.state.model_id, messages=huge, max_tokens=4)  # type: ignore[arg-type]
    assert e.value.code == "context_length_exceeded"
    message = e.value.body["message"]  # type: ignore[index]
    assert message.startswith("This model's maximum context length is 4096 tokens")
    assert int(message.split(" needs ")[1].split()[0]) > 4096
    sid = c.post("/sessions", body={"system": SYSTEM}, cast_to=object)["id"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as s:
        c.post(f"/sessions/{sid}/messages", body={"messages": huge}, cast_to=object)
    assert s.value.code == "context_length_exceeded"
    r = c.post(  # the session lost nothing and goes on
        f"/sessions/{sid}/messages",
        body={"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2},
        cast_to=object,
    )
    assert r["usage"]["continuum"]["turn"] == 1  # type: ignore[index]


def test_completions_and_models(srv: Running) -> None:
    c = srv.client()
    (model,) = c.models.list().data
    assert model.id == srv.state.model_id
    r = c.completions.create(
        model=model.id, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert isinstance(r.choices[0].text, str) and r.usage is not None
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    assert "gpt-9" in str(e.value)


def test_sessions_create_append_get_delete_through_the_sdk(srv: Running) -> None:
    c = srv.client()
    created = c.post("/sessions", body={"system": SYSTEM}, cast_to=object)
    sid = created["id"]  # type: ignore[index]
    assert created["wake_tokens"] > 5  # type: ignore[index]
    r1 = c.post(
        f"/sessions/{sid}/messages",
        cast_to=object,
        body={"messages": [{"role": "user", "content": "My name is Priya."}], "temperature": 0},
    )
    u1 = r1["usage"]  # type: ignore[index]
    assert u1["prompt_tokens_details"]["cached_tokens"] == created["wake_tokens"]  # type: ignore[index]
    r2 = c.post(
        f"/sessions/{sid}/messages",
        cast_to=object,
        body={"messages": [{"role": "user", "content": "What is my name?"}], "temperature": 0},
    )
    u2 = r2["usage"]  # type: ignore[index]
    # what was resident after turn 1, plus the eager glue decoded while the client was idle
    eager = u2["continuum"]["eager_tokens_used"]
    assert u2["prompt_tokens_details"]["cached_tokens"] == u1["continuum"]["context_used"] + eager
    assert u2["continuum"]["wire_chars"] < 100  # only the delta crossed the wire
    # a client that re-sends the whole transcript with the session header: verified, not redone
    history = c.get(f"/sessions/{sid}", cast_to=object)["history"]  # type: ignore[index]
    full = c.chat.completions.create(
        model=srv.state.model_id,
        temperature=0,
        max_tokens=8,
        messages=[*history, {"role": "user", "content": "Thanks!"}],
        extra_headers={"X-Continuum-Session": sid},
    )
    extra = full.usage.model_extra["continuum"]  # type: ignore[union-attr,index]
    assert extra["tokens_reused"] == u2["continuum"]["context_used"] + extra["eager_tokens_used"]
    assert extra["prompt_tokens_evaluated"] < 20
    got = c.get(f"/sessions/{sid}", cast_to=object)
    assert [m["content"] for m in got["history"]][-2] == "Thanks!"  # type: ignore[index]
    assert len(got["turns"]) == 3  # type: ignore[index]
    assert c.delete(f"/sessions/{sid}", cast_to=object)["deleted"] is True  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        c.get(f"/sessions/{sid}", cast_to=object)


def test_session_streaming_and_a_disconnect_commit_nothing(srv: Running) -> None:
    with srv.http() as h:
        sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        h.post(
            f"/v1/sessions/{sid}/messages",
            json={"messages": [{"role": "user", "content": "Hello."}], "temperature": 0},
        )
        before = h.get(f"/v1/sessions/{sid}").json()
        with h.stream(
            "POST",
            f"/v1/sessions/{sid}/messages",
            json={
                "messages": [{"role": "user", "content": "Write a very long poem."}],
                "stream": True,
                "max_tokens": 200,
                "temperature": 0,
            },
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if '"content"' in line and '"content": ""' not in line:
                    break  # one real piece of the reply arrived: hang up now
        deadline = time.time() + 60
        while (srv.state.executor.running or srv.state.executor.depth) and time.time() < deadline:
            time.sleep(0.05)
        after = h.get(f"/v1/sessions/{sid}").json()
        assert after["history"] == before["history"]  # nothing of the abandoned turn
        assert len(after["turns"]) == len(before["turns"])
        r = h.post(
            f"/v1/sessions/{sid}/messages",
            json={
                "messages": [{"role": "user", "content": "Short answer please."}],
                "stream": True,
            },
        )
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        assert len(h.get(f"/v1/sessions/{sid}").json()["turns"]) == len(before["turns"]) + 1


@pytest.mark.slow
def test_a_non_streamed_turn_whose_client_hangs_up_stops_decoding(srv: Running) -> None:
    worker = srv.state.sessions()
    long = {"role": "user", "content": "Count from 1 to 5000, one number per line."}
    with srv.http() as h:
        sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        control = h.post(
            f"/v1/sessions/{sid}/messages",
            json={"messages": [long], "max_tokens": 200, "temperature": 0},
        ).json()
        assert control["usage"]["completion_tokens"] == 200  # this prompt runs to the limit
        before = h.get(f"/v1/sessions/{sid}").json()
        resident = len(worker.seq.tokens)
    with srv.http(timeout=1.0) as h, pytest.raises(httpx.ReadTimeout):
        h.post(
            f"/v1/sessions/{sid}/messages",
            json={"messages": [long], "max_tokens": 2000, "temperature": 0},
        )  # hangs up after a second of a reply that would take half a minute or more
    deadline = time.time() + 120
    while (srv.state.executor.running or srv.state.executor.depth) and time.time() < deadline:
        time.sleep(0.05)
    assert len(worker.seq.tokens) - resident < 1000  # it stopped, far short of 2,000 tokens
    with srv.http() as h:
        after = h.get(f"/v1/sessions/{sid}").json()
    assert after["history"] == before["history"] and after["turns"] == before["turns"]


@pytest.mark.parametrize(
    ("path", "payload", "status", "code"),
    [
        ("/v1/chat/completions", b"{not json", 400, "invalid_request"),
        ("/v1/chat/completions", b"[1, 2]", 400, "invalid_request"),
        ("/v1/chat/completions", {"model": "x"}, 400, "invalid_request"),
        (
            "/v1/chat/completions",
            {"model": "continuum", "messages": [], "max_tokens": "5"},
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {"model": "continuum", "messages": [{"role": "robot", "content": "hi"}]},
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {"model": "continuum", "messages": [{"role": "user", "content": 5}]},
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            {"model": "continuum", "n": 2, "messages": [{"role": "user", "content": "x"}]},
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "continuum",
                "temperature": -1,
                "messages": [{"role": "user", "content": "x"}],
            },
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {"model": "continuum", "messages": [{"role": "user", "content": "word " * 5000}]},
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/sessions/no-such-session/messages",
            {"messages": [{"role": "user", "content": "x"}]},
            404,
            "session_not_found",
        ),
        ("/v1/sessions", {"system": 42}, 400, "invalid_request"),
        ("/v1/sessions", {"compaction": "forget"}, 400, "invalid_request"),
        (
            "/v1/completions",
            {"model": "continuum", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "continuum",
                "messages": [{"role": "user", "content": "x"}],
                "stop": ["y" * 257],
            },
            400,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            {"model": "continuum", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            400,
            "invalid_request",
        ),
        ("/v1/responses", b"{not json", 400, "invalid_request"),
        ("/v1/responses", {"model": "continuum"}, 400, "invalid_request"),
        ("/v1/responses", {"model": "continuum", "input": 42}, 400, "invalid_request"),
        (
            "/v1/responses",
            {"model": "continuum", "input": "x", "store": "yes"},
            400,
            "invalid_request",
        ),
        ("/v1/responses", {"model": "nope", "input": "x"}, 404, "model_not_found"),
        (
            "/v1/responses",
            {"model": "continuum", "input": "x", "max_output_tokens": 0},
            400,
            "invalid_request",
        ),
        (
            "/v1/responses",
            {"model": "continuum", "input": "word " * 5000},
            400,
            "context_length_exceeded",
        ),
    ],
)
def test_bad_input_gets_an_openai_shaped_error_and_the_server_stays_up(
    srv: Running, path: str, payload: object, status: int, code: str
) -> None:
    with srv.http() as h:
        content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        r = h.post(path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["code"] == code and err["message"] and err["type"]
        assert h.get("/health").json()["status"] == "ok"


def test_framework_errors_and_unknown_fields_of_our_own_apis_are_openai_shaped(
    srv: Running,
) -> None:
    with srv.http() as h:
        for method, path, status, code in (
            ("GET", "/v1/no-such-route", 404, "not_found"),
            ("DELETE", "/v1/models", 405, "method_not_allowed"),
            ("POST", "/v1/sessions/x/input?max_tokens=many", 400, "invalid_request"),
            ("POST", "/v1/sessions/x/input?rle=user", 400, "invalid_request"),
        ):
            r = h.request(method, path, content=b"hi")
            assert r.status_code == status, (path, r.text)
            err = r.json()["error"]
            assert err["code"] == code and err["message"] and err["type"], r.text
        before = len(srv.state.sessions().sessions())
        r = h.post("/v1/sessions", json={"system": "Be brief.", "sytem": "typo"})
        assert r.status_code == 400 and "unknown field 'sytem'" in r.json()["error"]["message"]
        assert len(srv.state.sessions().sessions()) == before  # nothing was created
        sid = h.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
        r = h.post(f"/v1/sessions/{sid}/messages", json={"mesages": []})
        assert r.status_code == 400 and "mesages" in r.json()["error"]["message"]
        assert h.get("/health").json()["status"] == "ok"


def test_oversize_bodies_are_refused(srv: Running) -> None:
    with srv.http() as h:
        for path, field in (("/v1/completions", b"prompt"), ("/v1/responses", b"input")):
            big = b'{"model": "continuum", "' + field + b'": "' + b"x" * (5 << 20) + b'"}'
            r = h.post(path, content=big, headers={"content-type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

            def chunks(
                head: bytes = b'{"model": "continuum", "' + field + b'": "',
            ) -> Iterator[bytes]:
                yield head  # chunked: no Content-Length for the middleware to check
                for _ in range(6):
                    yield b"x" * (1 << 20)
                yield b'"}'

            r = h.post(path, content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        assert h.get("/health").json()["status"] == "ok"


def test_a_full_queue_answers_429_with_retry_after(srv: Running) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    n = srv.state.executor.threads  # --parallel lanes + 1 job threads

    def block() -> None:
        started.release()
        release.wait(60)

    blockers = []
    for _ in range(n):  # occupy every job thread, one at a time (the queue holds 4)
        blockers.append(srv.state.executor.submit(block))
        assert started.acquire(timeout=60)
    try:
        waiting = [srv.state.executor.submit(lambda: None) for _ in range(4)]  # fill the queue
        with srv.http() as h:
            r = h.post(
                "/v1/completions", json={"model": "continuum", "prompt": "hi", "max_tokens": 2}
            )
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
    finally:
        release.set()
    for w in [*blockers, *waiting]:
        w.result(timeout=60)


def test_tenants_do_not_share_sessions_or_caches(srv: Running) -> None:
    with (
        srv.http(headers={"X-Continuum-Tenant": "alpha"}) as a,
        srv.http(headers={"X-Continuum-Tenant": "beta"}) as b,
    ):
        sid = a.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        assert b.get(f"/v1/sessions/{sid}").status_code == 404
        assert b.delete(f"/v1/sessions/{sid}").status_code == 404
        body = {
            "model": "continuum",
            "prompt": "Tenants are separate.",
            "max_tokens": 4,
            "temperature": 0,
        }
        a.post("/v1/completions", json=body)
        assert (
            a.post("/v1/completions", json=body).json()["usage"]["continuum"]["hit_tier"] == "memo"
        )
        assert (
            b.post("/v1/completions", json=body).json()["usage"]["continuum"]["hit_tier"] == "cold"
        )


def test_sixteen_concurrent_sessions_keep_their_own_histories(srv: Running) -> None:
    names = "amber birch cedar dune ember fjord grove heath iris jade kelp loch moss nova opal pine"
    words = [f"secret-{i}-{w}" for i, w in enumerate(names.split())]
    with srv.http() as h:
        ids = [
            h.post("/v1/sessions", json={"system": f"The secret word is {w}."}).json()["id"]
            for w in words
        ]

    def talk(i: int) -> int:
        with srv.http() as c:
            for attempt in range(200):
                r = c.post(
                    f"/v1/sessions/{ids[i]}/messages",
                    json={
                        "messages": [{"role": "user", "content": f"Remember {words[i]}."}],
                        "max_tokens": 4,
                        "temperature": 0,
                    },
                )
                if r.status_code != 429:
                    return r.status_code
                time.sleep(float(r.headers["retry-after"]) / 10 + attempt * 0.01)
        return 429

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(talk, range(16)))
    assert statuses == [200] * 16
    with srv.http() as h:
        for i, sid in enumerate(ids):
            hist = h.get(f"/v1/sessions/{sid}").json()["history"]
            assert hist[0] == {"role": "system", "content": f"The secret word is {words[i]}."}
            assert hist[1] == {"role": "user", "content": f"Remember {words[i]}."}
            assert len(hist) == 3


ROUTES = {
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/sessions"),
    ("POST", "/v1/sessions/{session_id}/messages"),
    ("POST", "/v1/sessions/{session_id}/input"),
    ("GET", "/v1/sessions/{session_id}"),
    ("DELETE", "/v1/sessions/{session_id}"),
    ("GET", "/v1/sessions/{session_id}/bundle"),
    ("POST", "/v1/sessions/import"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/responses/compact"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/admin/drain"),
}


def test_the_app_serves_exactly_the_expected_routes(srv: Running) -> None:
    """Every router is included, and nothing else is routed (read from the served schema, which
    lists each route and method; a router left out of ``create_app`` fails here)."""
    with srv.http() as h:
        paths = h.get("/openapi.json").json()["paths"]
    served = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    assert served == ROUTES


def test_metrics_and_health(srv: Running) -> None:
    with srv.http() as h:
        text = h.get("/metrics").text
        assert "continuum_hits_total" in text and "continuum_ttft_seconds_bucket" in text
        assert "continuum_resident_sessions" in text
        assert borrowed(text, "lane") >= 0 and borrowed(text, "snapshot") >= 0
        assert h.get("/health").json()["model"] == srv.state.model_id


def borrowed(text: str, source: str) -> float:
    """The ``continuum_tokens_borrowed`` gauge of ``source`` in a /metrics page."""
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(f'continuum_tokens_borrowed{{source="{source}"}}')
    )
    return float(line.split()[-1])


@pytest.mark.slow  # a server of its own
def test_on_one_lane_a_new_session_borrows_a_parked_siblings_prompt_and_metrics_count_it(
    tmp_path: Path,
) -> None:
    system = SYSTEM + " " + " ".join(f"Rule {i}: answer in one line." for i in range(40))
    for running in _serve(tmp_path, parallel=1):
        with running.http() as h:
            first = h.post("/v1/sessions", json={"system": system}).json()["id"]
            h.post(
                f"/v1/sessions/{first}/messages",
                json={"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4},
            ).raise_for_status()
            assert borrowed(h.get("/metrics").text, "snapshot") == 0
            h.post("/v1/sessions", json={"system": system}).raise_for_status()  # parks the first
            text = h.get("/metrics").text
            assert borrowed(text, "snapshot") > 300 and borrowed(text, "lane") == 0


def test_an_api_key_guards_every_route_but_health(tmp_path: Path) -> None:
    key = "s3cret-0123456789abcdef"
    for running in _serve(tmp_path, keys=KeyRing.parse([key])):
        with running.http() as h:
            assert h.get("/health").status_code == 200
            r = h.get("/v1/models")
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert h.get("/metrics").status_code == 401
            assert h.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert h.get("/v1/models", headers={"Authorization": key}).status_code == 401
        models = running.client(api_key=key).models.list().data
        assert models[0].id == running.state.model_id
        with pytest.raises(openai.AuthenticationError):
            running.client(api_key="wrong").models.list()


def test_the_serve_command_starts_on_loopback_on_the_default_model_and_refuses_a_missing_one(
    tmp_path: Path,
) -> None:
    """The one server test on the default model (Qwen2.5-Coder-0.5B-Instruct): the suite's
    CONTINUUM_MODEL is removed, as on a user's machine."""
    import os
    import shutil
    import subprocess
    import sys

    exe = shutil.which("continuum") or str(Path(sys.executable).parent / "continuum")
    bad = subprocess.run(
        [exe, "serve", "--model", str(tmp_path / "none.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "none.gguf" in bad.stderr and "Traceback" not in bad.stderr
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CONTINUUM_MODEL"}
    proc = subprocess.Popen(
        [exe, "serve", "--port", str(port), "--n-ctx", "1024", "--store", str(tmp_path / "h.db")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        url = f"http://127.0.0.1:{port}/v1"
        (model,) = httpx.get(f"{url}/models", timeout=10).json()["data"]
        assert model["id"].startswith("qwen2.5-coder-0.5b-instruct")
        reply = httpx.post(
            f"{url}/chat/completions",
            json={
                "model": model["id"],
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 4,
            },
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_header_section_past_the_limit_is_a_431(srv: Running) -> None:
    port = int(srv.url.rsplit(":", 1)[1])
    status, _, body = exchange(port, get(listener.MAX_HEADER_BYTES), piece=4096)
    assert status == 431
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert chat(srv, "Name a colour.").choices[0].message.content is not None  # serving on
