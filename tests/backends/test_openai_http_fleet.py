"""openai_http in front of a fleet, on the wire: the tenant's cache salt, the conversation's
affinity key, llm-d's session token echoed to its own conversation only, and savings that are
the server's count or unknown, never a guess.

The upstream is a real HTTP server on 127.0.0.1 that records every request it gets and answers
OpenAI-shaped SSE, with the usage and response headers a test scripts (a recorder, standing in
for vLLM, SGLang or a router: what is pinned here is what goes out on the wire).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from continuum import (
    BackendConfigError,
    BackendRegistry,
    GenerationParams,
    InvalidRequest,
    ReusePolicy,
    Session,
    TokenOp,
    UpstreamRouting,
)
from continuum.backends.base import RequestRoute
from continuum.backends.openai_http import OpenAIHTTPBackend, Upstream
from continuum.server.auth import KeyRing
from tests.server.test_app import Running, _serve, free_port

PARAMS = GenerationParams(max_tokens=4)
HI = [{"role": "user", "content": "hi"}]
KEY_A, KEY_B = "alpha-key-0123456789abcdef", "beta-key-0123456789abcdefgh"
UNSET = object()


class Recorder:
    """An OpenAI-compatible upstream that records what it receives. ``details`` is the usage's
    ``prompt_tokens_details`` (UNSET: the field is absent, as from vLLM without
    --enable-prompt-tokens-details); ``token_header`` / ``token_cookie`` make every answer carry
    a fresh llm-d-style session token (``tok-1``, ``tok-2``, ...)."""

    def __init__(
        self,
        details: object = UNSET,
        *,
        token_header: bool = False,
        token_cookie: bool = False,
    ) -> None:
        self.details = details
        self.token_header = token_header
        self.token_cookie = token_cookie
        self.seen: list[dict[str, Any]] = []
        self._tokens = itertools.count(1)

        async def generate(request: Request) -> Response:
            body = json.loads(await request.body())
            self.seen.append({"headers": dict(request.headers), "body": body})
            headers = {}
            token = f"tok-{next(self._tokens)}"
            if self.token_header:
                headers["x-session-token"] = token
            if self.token_cookie:
                headers["set-cookie"] = f"llm-d-session={token}; Path=/; HttpOnly"
            chat = request.url.path.endswith("/chat/completions")
            return StreamingResponse(
                self._events(chat), media_type="text/event-stream", headers=headers
            )

        async def missing(request: Request) -> Response:
            return JSONResponse({"error": {"message": "no such route"}}, 404)

        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", generate, methods=["POST"]),
                Route("/v1/completions", generate, methods=["POST"]),
                Route("/{path:path}", missing, methods=["GET", "POST"]),
            ]
        )

    def _events(self, chat: bool) -> Iterator[str]:
        piece = {"delta": {"content": "ok"}} if chat else {"text": "ok"}
        yield "data: " + json.dumps({"choices": [{"index": 0, **piece}]}) + "\n\n"
        done = {"delta": {}} if chat else {"text": ""}
        yield "data: " + json.dumps({"choices": [{"index": 0, **done, "finish_reason": "stop"}]})
        yield "\n\n"
        usage: dict[str, Any] = {"prompt_tokens": 12, "completion_tokens": 1}
        if self.details is not UNSET:
            usage["prompt_tokens_details"] = self.details
        yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"

    def __enter__(self) -> str:
        port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def header(self, i: int, name: str) -> str | None:
        value = self.seen[i]["headers"].get(name.lower())
        return str(value) if value is not None else None


def backend(url: str, **routing: Any) -> OpenAIHTTPBackend:
    return OpenAIHTTPBackend(
        Upstream(url, model="m"), tokenizer="text", routing=UpstreamRouting(**routing)
    )


def send(b: OpenAIHTTPBackend, tenant: str = "", session: str | None = None) -> Any:
    return b.generate([], PARAMS, messages=HI, route=RequestRoute(tenant, session))


# -- the tenant's salt -----------------------------------------------------------------------
def test_the_salt_is_a_stable_digest_of_the_tenant_and_the_secret() -> None:
    plain = UpstreamRouting(salt_field="cache_salt")
    # pinned literally: a salt that changed between processes or versions would empty every
    # tenant's cache on the fleet at once
    assert plain.salt("tenant-a") == "b2v1:b7f8e5cfd2c9ea4a1ccf449d0347735e"
    assert plain.salt("") == "b2v1:667c58ffd7ccc12fc42f06d8e691bf83"
    secret = UpstreamRouting(salt_field="cache_salt", salt_secret="s3cret")
    assert secret.salt("tenant-a") == "b2v1:1f72de12d924374900677abab443a237"
    names = ["tenant-a", "tenant-b", "", "tenant-a/sub", "Tenant-A"]
    assert len({plain.salt(n) for n in names} | {secret.salt(n) for n in names}) == 10


@pytest.mark.parametrize(
    ("field", "sent"),
    [
        ("cache_salt", {"cache_salt"}),
        ("extra_key", {"extra_key"}),
        ("both", {"cache_salt", "extra_key"}),
        ("none", set()),
    ],
)
def test_the_salt_goes_in_the_fields_the_upstream_reads(field: str, sent: set[str]) -> None:
    rec = Recorder()
    with rec as url:
        b = backend(url, salt_field=field)
        send(b, "tenant-a")
        b.close()
    body = rec.seen[0]["body"]
    salt = UpstreamRouting().salt("tenant-a")
    assert {k for k in ("cache_salt", "extra_key") if k in body} == sent
    assert all(body[k] == salt for k in sent)


def test_two_tenants_through_the_engine_get_two_salts_and_one_tenant_one() -> None:
    """The namespace an op runs under reaches the wire as that tenant's salt."""
    rec = Recorder()
    routing = UpstreamRouting(salt_field="cache_salt")
    with rec as url:
        s = Session(
            "tenant-a",
            BackendRegistry(),
            backend="openai_http",
            base_url=url,
            model="m",
            tokenizer="text",
            routing=routing,
        )
        try:
            ask = TokenOp("answer", messages=tuple(HI), params=PARAMS)
            s.run(ask)
            s.run(ask, namespace="tenant-b")  # another tenant: no memo hit, its own salt
            s.run(TokenOp("answer", prompt="other", params=PARAMS))
        finally:
            s.close()
    salts = [r["body"]["cache_salt"] for r in rec.seen]
    assert salts == [routing.salt("tenant-a"), routing.salt("tenant-b"), routing.salt("tenant-a")]
    assert salts[0] != salts[1]


def test_never_still_salts_and_routes_its_op() -> None:
    """``ReusePolicy.never()`` turns reuse off, not isolation: the tenant's salt and the
    conversation's key still go out (the upstream's cache is shared, continuum's is not used)."""
    rec = Recorder()
    routing = UpstreamRouting(salt_field="cache_salt")
    with rec as url:
        s = Session(
            "tenant-a",
            BackendRegistry(),
            backend="openai_http",
            base_url=url,
            model="m",
            tokenizer="text",
            routing=routing,
        )
        s.policy = ReusePolicy.never()
        try:
            s.run(TokenOp("answer", messages=tuple(HI), params=PARAMS, affinity="conv-9"))
            s.run(TokenOp("answer", messages=tuple(HI), params=PARAMS, affinity="conv-9"))
        finally:
            s.close()
    assert len(rec.seen) == 2  # never(): no memo hit
    assert all(r["body"]["cache_salt"] == routing.salt("tenant-a") for r in rec.seen)
    key = routing.affinity(RequestRoute("tenant-a", "conv-9"))
    assert [rec.header(i, "X-Session-ID") for i in (0, 1)] == [key, key]


def test_without_a_route_the_empty_namespace_has_a_salt_of_its_own() -> None:
    rec = Recorder()
    with rec as url:
        b = backend(url, salt_field="cache_salt")
        b.generate([], PARAMS, messages=HI)  # called directly: no engine, no tenant
        b.close()
    assert rec.seen[0]["body"]["cache_salt"] == UpstreamRouting().salt("")
    assert rec.seen[0]["body"]["cache_salt"] != UpstreamRouting().salt("default")
    assert "x-session-id" not in rec.seen[0]["headers"]  # and no conversation to route


# -- the conversation's affinity key ---------------------------------------------------------
@pytest.mark.parametrize("header", ["X-Session-ID", "x-user-id", "X-SMG-Routing-Key", "X-Mine"])
def test_the_affinity_header_is_configurable_and_carries_the_session_key(header: str) -> None:
    rec = Recorder()
    routing = UpstreamRouting(affinity_header=header)
    with rec as url:
        b = backend(url, affinity_header=header)
        send(b, "tenant-a", "chat-1")
        send(b, "tenant-a", "chat-1")
        send(b, "tenant-a", "chat-2")
        send(b, "tenant-b", "chat-1")  # the same name in another tenant: another conversation
        send(b, "tenant-a", None)
        b.close()
    got = [rec.header(i, header) for i in range(5)]
    assert got[0] == routing.affinity(RequestRoute("tenant-a", "chat-1"))
    assert got[0] == got[1] and len({got[0], got[2], got[3]}) == 3
    assert got[4] is None
    assert all("chat-" not in str(v) and "tenant" not in str(v) for v in got)  # digests only
    others = {"x-session-id", "x-user-id", "x-smg-routing-key", "x-mine"} - {header.lower()}
    assert not any(name in r["headers"] for r in rec.seen for name in others)


def test_no_affinity_header_when_told_none() -> None:
    rec = Recorder()
    with rec as url:
        b = backend(url, affinity_header=None)
        send(b, "tenant-a", "chat-1")
        b.close()
    assert "x-session-id" not in rec.seen[0]["headers"]
    assert "prompt_cache_key" not in rec.seen[0]["body"]


def test_prompt_cache_key_mode_sends_the_affinity_key_in_the_body() -> None:
    rec = Recorder()
    routing = UpstreamRouting(prompt_cache_key=True)
    with rec as url:
        b = backend(url, prompt_cache_key=True)
        send(b, "tenant-a", "chat-1")
        send(b, "tenant-a", None)
        b.close()
        off = backend(url)
        send(off, "tenant-a", "chat-1")
        off.close()
    key = routing.affinity(RequestRoute("tenant-a", "chat-1"))
    assert rec.seen[0]["body"]["prompt_cache_key"] == key
    assert rec.header(0, "X-Session-ID") == key
    assert "prompt_cache_key" not in rec.seen[1]["body"]  # no conversation: no key
    assert "prompt_cache_key" not in rec.seen[2]["body"]  # the mode is off


# -- llm-d's session token -------------------------------------------------------------------
def test_the_session_token_goes_back_to_its_own_session_only() -> None:
    rec = Recorder(token_header=True)
    with rec as url:
        b = backend(url)
        send(b, "tenant-a", "chat-a")  # answered with tok-1
        send(b, "tenant-a", "chat-b")  # tok-2
        send(b, "tenant-a", "chat-a")  # echoes tok-1; answered with tok-3
        send(b, "tenant-a", None)  # no session: nothing echoed, nothing kept (tok-4)
        send(b, "tenant-b", "chat-a")  # another tenant's chat-a: not tenant-a's token
        send(b, "tenant-a", "chat-b")  # echoes tok-2
        send(b, "tenant-a", "chat-a")  # echoes the newest: tok-3
        b.close()
    got = [rec.header(i, "x-session-token") for i in range(7)]
    assert got == [None, None, "tok-1", None, None, "tok-2", "tok-3"]


def test_the_llm_d_cookie_is_kept_per_session_not_in_a_shared_jar() -> None:
    rec = Recorder(token_cookie=True)
    with rec as url:
        b = backend(url)
        send(b, "tenant-a", "chat-a")  # Set-Cookie: llm-d-session=tok-1
        send(b, "tenant-a", "chat-b")  # a client-wide jar would send tok-1 here
        send(b, "tenant-a", None)
        send(b, "tenant-a", "chat-a")
        b.close()
    cookies = [rec.header(i, "cookie") for i in range(4)]
    assert cookies == [None, None, None, "llm-d-session=tok-1"]


def test_the_token_map_is_bounded_least_recently_used_first_out() -> None:
    rec = Recorder(token_header=True)
    with rec as url:
        b = backend(url, max_sessions=2)
        for chat in ("a", "b", "c"):  # tok-1..3; a's is pushed out by c's
            send(b, "t", chat)
        assert len(b.session_tokens) == 2
        send(b, "t", "a")  # forgotten: sent without a token (answered tok-4, kept again)
        send(b, "t", "c")
        b.close()
    assert [rec.header(i, "x-session-token") for i in (3, 4)] == [None, "tok-3"]


# -- savings: the server's count, or unknown -------------------------------------------------
@pytest.mark.parametrize(
    "details",
    [
        UNSET,
        None,
        {},
        {"cached_tokens": None},
        {"cached_tokens": "8"},
        {"cached_tokens": True},
        {"cached_tokens": -1},
        {"cached_tokens": 13},
        {"cached_tokens": 8.0},
    ],
    ids=[
        "absent",
        "null",
        "empty",
        "null-count",
        "string",
        "bool",
        "negative",
        "over-prompt",
        "float",
    ],
)
def test_cached_tokens_not_reported_is_unknown_never_a_saving(details: object) -> None:
    rec = Recorder(details)
    with rec as url:
        b = backend(url)
        gen = send(b, "tenant-a")
        b.close()
    assert not gen.reused_known
    assert gen.reused == 0 and gen.evaluated == gen.prompt_tokens == 12


@pytest.mark.parametrize("cached", [0, 8, 12])
def test_a_reported_count_is_the_saving_zero_included(cached: int) -> None:
    rec = Recorder({"cached_tokens": cached})
    with rec as url:
        b = backend(url)
        gen = send(b, "tenant-a")
        b.close()
    assert gen.reused_known and gen.reused == cached and gen.evaluated == 12 - cached


def test_unknown_savings_reach_the_op_metrics_as_unknown() -> None:
    rec = Recorder()
    with rec as url:
        s = Session(
            "t", BackendRegistry(), backend="openai_http", base_url=url, model="m", tokenizer="text"
        )
        try:
            r = s.run(TokenOp("answer", messages=tuple(HI), params=PARAMS))
        finally:
            s.close()
    assert r.metrics.hit_tier == "cold" and not r.metrics.reuse_known
    assert r.metrics.to_dict()["tokens_reused"] == "unknown"


# -- bad configuration -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"salt_field": "vllm"}, "use one of cache_salt, extra_key, both, none"),
        ({"salt_field": ""}, "use one of"),
        ({"salt_secret": ""}, "non-empty secret"),
        ({"affinity_header": ""}, "name the header the router hashes on"),
        ({"affinity_header": "X Session"}, "a header name is"),
        ({"affinity_header": "x-session-id\r\nx-evil"}, "a header name is"),
        ({"affinity_header": 7}, "name the header"),
        ({"affinity_header": "Authorization"}, "sets that header itself"),
        ({"affinity_header": "X-Session-Token"}, "sets that header itself"),
        ({"prompt_cache_key": "yes"}, "True/False"),
        ({"max_sessions": 0}, "int >= 1"),
        ({"max_sessions": True}, "int >= 1"),
    ],
)
def test_bad_routing_options_are_typed_errors_that_say_what_to_do(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(BackendConfigError, match=says) as e:
        UpstreamRouting(**options)
    (option,) = options
    assert e.value.option == option and e.value.value == options[option]
    assert isinstance(e.value, InvalidRequest)  # a ValueError, as a constructor's bad input is


def test_the_backend_refuses_a_bad_routing_before_it_sends_anything() -> None:
    rec = Recorder()
    with rec as url:
        upstream = Upstream(url, model="m")
        with pytest.raises(BackendConfigError, match="unknown field"):
            OpenAIHTTPBackend(upstream, tokenizer="text", routing={"salt": "cache_salt"})
        with pytest.raises(BackendConfigError, match="use one of"):
            OpenAIHTTPBackend(upstream, tokenizer="text", routing={"salt_field": "x"})
        with pytest.raises(BackendConfigError, match="pass an UpstreamRouting"):
            OpenAIHTTPBackend(upstream, tokenizer="text", routing="cache_salt")  # type: ignore[arg-type]
        b = OpenAIHTTPBackend(upstream, tokenizer="text", routing={"salt_field": "both"})
        assert b.routing == UpstreamRouting(salt_field="both")
        b.close()
    assert rec.seen == []


@pytest.mark.parametrize("affinity", ["", 7, b"chat"])
def test_a_token_op_refuses_a_malformed_affinity(affinity: object) -> None:
    with pytest.raises(InvalidRequest, match="affinity must be a non-empty string"):
        TokenOp("answer", prompt="hi", affinity=affinity)  # type: ignore[arg-type]


# -- through `continuum serve --backend openai_http` -----------------------------------------
@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Recorder, Running]]:
    rec = Recorder({"cached_tokens": 4}, token_header=True)
    with rec as url:
        for front in _serve(
            tmp_path_factory.mktemp("front"),
            backend="openai_http",
            upstream=url,
            upstream_model="m",
            upstream_salt_field="both",
            upstream_salt_secret="fleet-secret",
            keys=KeyRing.parse([f"alpha={KEY_A}", f"beta={KEY_B}"]),
        ):
            yield rec, front


def post(front: Running, path: str, key: str, body: dict[str, Any], **headers: str) -> Any:
    with front.http() as h:
        r = h.post(path, json=body, headers={"Authorization": f"Bearer {key}", **headers})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_front_salts_by_credentials_and_overwrites_the_clients_salt(
    fleet: tuple[Recorder, Running],
) -> None:
    rec, front = fleet
    routing = front.state.engine.backend.routing  # type: ignore[attr-defined]
    body = {
        "model": "m",
        "messages": HI,
        "max_tokens": 4,
        "temperature": 0,
        "cache_salt": "client-chosen",
        "extra_key": "client-chosen",
    }
    start = len(rec.seen)
    post(front, "/v1/chat/completions", KEY_A, body)
    post(front, "/v1/chat/completions", KEY_B, body)
    # a header cannot make a caller another tenant; it can only narrow its own
    post(front, "/v1/chat/completions", KEY_A, body, **{"X-Continuum-Tenant": "beta"})
    sent = [r["body"] for r in rec.seen[start:]]
    expected = [routing.salt("alpha"), routing.salt("beta"), routing.salt("alpha/beta")]
    assert [b["cache_salt"] for b in sent] == expected
    assert [b["extra_key"] for b in sent] == expected
    assert len(set(expected)) == 3 and "client-chosen" not in json.dumps(sent)


def test_the_fronts_session_hints_become_the_affinity_key(fleet: tuple[Recorder, Running]) -> None:
    """On a backend without resident sessions a hint is no 400: it names the conversation to
    the router, and the router's token comes back on that conversation's next request."""
    rec, front = fleet
    routing = front.state.engine.backend.routing  # type: ignore[attr-defined]
    start = len(rec.seen)
    chat = {"model": "m", "max_tokens": 4, "temperature": 0}
    turn1 = [{"role": "user", "content": "tell me more"}]
    turn2 = [*turn1, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    got = post(
        front,
        "/v1/chat/completions",
        KEY_A,
        {**chat, "messages": turn1},
        **{"X-Session-ID": "conv-7"},
    )
    post(
        front,
        "/v1/chat/completions",
        KEY_A,
        {**chat, "messages": turn2, "prompt_cache_key": "conv-7"},
    )
    post(front, "/v1/completions", KEY_B, {**chat, "prompt": "once", "user": "conv-7"})
    headers = [r["headers"] for r in rec.seen[start:]]
    key_a = routing.affinity(RequestRoute("alpha", "conv-7"))
    assert [h.get("x-session-id") for h in headers] == [
        key_a,
        key_a,
        routing.affinity(RequestRoute("beta", "conv-7")),
    ]
    assert "x-session-token" not in headers[0]  # conv-7's first request: nothing to echo
    assert headers[1].get("x-session-token") is not None  # echoed on conv-7's next turn
    assert "x-session-token" not in headers[2]  # beta's conv-7 is another conversation
    assert got["usage"]["continuum"]["tokens_reused"] == 4  # the upstream's own count


def test_a_responses_chain_keeps_one_affinity_key(fleet: tuple[Recorder, Running]) -> None:
    rec, front = fleet
    start = len(rec.seen)
    first = post(
        front, "/v1/responses", KEY_A, {"model": "m", "input": "a chain", "max_output_tokens": 4}
    )
    second = post(
        front,
        "/v1/responses",
        KEY_A,
        {
            "model": "m",
            "input": "more",
            "previous_response_id": first["id"],
            "max_output_tokens": 4,
        },
    )
    post(front, "/v1/responses", KEY_A, {"model": "m", "input": "new", "max_output_tokens": 4})
    keys = [r["headers"].get("x-session-id") for r in rec.seen[start:]]
    assert second["id"] != first["id"]
    assert keys[0] == keys[1] and keys[2] not in (None, keys[0])


def test_unreported_savings_reach_clients_as_null_details_never_as_zero(tmp_path: Path) -> None:
    """An upstream that reports no cached tokens: the OpenAI-shaped usage says nothing (null
    details, as vLLM sends without --enable-prompt-tokens-details), not "0 reused"; the
    official SDK, LangChain and the Agents SDK all read it."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from langchain_openai import ChatOpenAI
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK's default exporter posts to api.openai.com
    with Recorder() as url:  # prompt_tokens_details absent upstream
        for front in _serve(tmp_path, backend="openai_http", upstream=url, upstream_model="m"):
            client = front.client()
            chat = client.chat.completions.create(model="m", messages=HI, max_tokens=4)
            assert chat.usage is not None and chat.usage.prompt_tokens == 12
            assert chat.usage.prompt_tokens_details is None
            resp = client.responses.create(model="m", input="hi", max_output_tokens=4)
            assert resp.usage is not None and resp.usage.input_tokens == 12
            assert resp.usage.input_tokens_details is None
            body = {"model": "m", "messages": HI, "max_tokens": 4}
            with front.http() as h:
                raw = h.post("/v1/chat/completions", json=body).json()
            assert raw["usage"]["prompt_tokens_details"] is None
            assert raw["usage"]["continuum"]["tokens_reused"] == "unknown"
            llm = ChatOpenAI(base_url=front.url + "/v1", api_key="none", model="m", max_tokens=4)
            meta = llm.invoke("hi").usage_metadata
            assert meta is not None and "cache_read" not in meta.get("input_token_details", {})
            aclient = AsyncOpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0)
            agent = Agent(
                name="a",
                instructions="answer",
                model=OpenAIResponsesModel(model="m", openai_client=aclient),
            )
            run = asyncio.run(Runner.run(agent, "hi"))
            assert run.final_output == "ok"
            assert run.context_wrapper.usage.input_tokens == 12


def test_the_front_refuses_a_malformed_routing_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(BackendConfigError, match="salt_field"):
        next(
            _serve(
                tmp_path,
                backend="openai_http",
                upstream="http://127.0.0.1:9/v1",
                upstream_salt_field="vllm",
            )
        )
