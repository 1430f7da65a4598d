"""The openai_http backend against real servers on 127.0.0.1: `continuum serve`,
llama-cpp-python's own server, and a small scripted endpoint for retries and Azure URLs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from continuum import (
    BackendError,
    BackendRegistry,
    GenerationParams,
    ModelFile,
    Session,
    TokenOp,
    UpstreamRouting,
)
from continuum.backends.base import RequestRoute
from continuum.backends.llama_process import llama_cpp_server_argv
from continuum.backends.openai_http import OpenAIHTTPBackend, Upstream
from tests.server.test_app import SYSTEM, Running, _serve, free_port

PARAMS = GenerationParams(max_tokens=8)


class Recording(httpx.BaseTransport):
    """A real HTTP transport that keeps the JSON body of every completion request it sends
    (given to the backend as ``transport=``): what went on the wire, seen from outside."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.bodies: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("completions"):  # not the tokenizer probes
            self.bodies.append(json.loads(request.read()))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def ask(question: str) -> TokenOp:
    return TokenOp(
        "answer",
        messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": question}),
        params=PARAMS,
    )


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("remote"), max_queue=8)


def test_against_continuum_serve_the_full_request_goes_out_and_savings_are_the_servers(
    remote: Running,
) -> None:
    wire = Recording()
    s = Session(
        "client",
        BackendRegistry(),
        backend="openai_http",
        base_url=remote.url + "/v1",
        model=remote.state.model_id,
        transport=wire,  # a backend option, passed through the engine and the registry
    )
    try:
        b = s.backend
        assert isinstance(b, OpenAIHTTPBackend)
        assert b.model_identity.endswith("tok=text")  # continuum serve has no /tokenize
        first = s.run(ask("Name a river."))
        assert first.metrics.hit_tier == "cold" and first.text
        second = s.run(ask("Name a mountain."))
        # the server's own prefix KV served the shared system prompt, and said so
        assert second.metrics.reuse_known
        assert second.metrics.tokens_reused > 0
        assert (
            second.metrics.prompt_tokens_evaluated
            == second.metrics.prompt_tokens - second.metrics.tokens_reused
        )
        assert len(wire.bodies) == 2
        assert wire.bodies[-1]["messages"] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Name a mountain."},
        ]
        requests = b.requests
        third = s.run(ask("Name a mountain."))  # the client's memo: no request at all
        assert third.metrics.hit_tier == "memo" and b.requests == requests
        assert len(wire.bodies) == 2
        assert third.text == second.text
    finally:
        s.close()


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_against_llama_cpp_pythons_server(gemma: ModelFile, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            *llama_cpp_server_argv(),  # without weight repacking, which crashes on AMX CPUs
            "--model",
            str(gemma.path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "server.log").open("w"),
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        wire = Recording()
        b = OpenAIHTTPBackend(
            Upstream(f"http://127.0.0.1:{port}/v1", model=str(gemma.path)),
            routing=UpstreamRouting(salt_field="cache_salt"),
            transport=wire,
        )
        try:
            assert b.tokenizer_mode == "server"  # its /extras/tokenize
            tokens = b.prompt_tokens(None, "The capital of France is")
            assert tokens[0] == 2 and len(tokens) > 3  # Gemma's BOS, then the text
            pieces: list[str] = []
            gen = b.generate(
                tokens,
                GenerationParams(max_tokens=6),
                prompt="The capital of France is",
                on_text=pieces.append,
            )
            assert gen.text and "".join(pieces) == gen.text
            assert not gen.reused_known  # this server reports no cached_tokens: unknown, not 0
            chat = b.generate([], PARAMS, messages=[{"role": "user", "content": "Hi!"}])
            assert isinstance(chat.text, str) and chat.finish_reason in ("stop", "length")
            # an unknown field to this server, which ignores it; no tenant: the empty one's
            assert wire.bodies[-1]["cache_salt"] == UpstreamRouting().salt("")
        finally:
            b.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class Scripted:
    """A real HTTP endpoint whose failures are scripted: it answers the first requests with the
    listed statuses, then streams a reply. It records what it received."""

    def __init__(self, statuses: list[int], retry_after: str = "1") -> None:
        self.statuses = list(statuses)
        self.retry_after = retry_after
        self.seen: list[dict[str, Any]] = []

        async def handle(request: Request) -> Response:
            body = json.loads(await request.body())
            self.seen.append(
                {
                    "t": time.monotonic(),
                    "path": request.url.path,
                    "query": str(request.url.query),
                    "headers": dict(request.headers),
                    "body": body,
                }
            )
            if self.statuses:
                status = self.statuses.pop(0)
                return JSONResponse(
                    {"error": {"message": "scripted"}},
                    status,
                    headers={"Retry-After": self.retry_after},
                )

            def events() -> Iterator[str]:
                for piece in ("Hello", " there"):
                    yield (
                        "data: "
                        + json.dumps(
                            {
                                "choices": [
                                    {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                                ]
                            }
                        )
                        + "\n\n"
                    )
                yield (
                    "data: "
                    + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                    + "\n\n"
                )
                yield (
                    "data: "
                    + json.dumps(
                        {
                            "choices": [],
                            "usage": {
                                "prompt_tokens": 12,
                                "completion_tokens": 2,
                                "prompt_tokens_details": {"cached_tokens": 8},
                            },
                        }
                    )
                    + "\n\n"
                )
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        self.app = Starlette(routes=[Route("/{path:path}", handle, methods=["POST"])])

    def __enter__(self) -> str:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_retries_honour_retry_after_then_succeed() -> None:
    scripted = Scripted([429, 503], retry_after="1")
    with scripted as url:
        b = OpenAIHTTPBackend(Upstream(url + "/v1", model="m", backoff_s=0.05), tokenizer="text")
        route = RequestRoute("tenant", "session-42")
        gen = b.generate([], PARAMS, messages=[{"role": "user", "content": "hi"}], route=route)
        b.close()
    assert gen.text == "Hello there" and gen.finish_reason == "stop"
    assert gen.reused == 8 and gen.reused_known and gen.evaluated == 4
    assert b.requests == 3 and len(scripted.seen) == 3
    assert scripted.seen[1]["t"] - scripted.seen[0]["t"] >= 0.9  # waited for Retry-After: 1
    key = b.routing.affinity(route)  # every retry carries the conversation's key
    assert key is not None and all(s["headers"]["x-session-id"] == key for s in scripted.seen)
    assert scripted.seen[-1]["body"]["messages"] == [{"role": "user", "content": "hi"}]


def test_retries_run_out_with_a_typed_error() -> None:
    with Scripted([500, 500, 500], retry_after="0") as url:
        b = OpenAIHTTPBackend(
            Upstream(url + "/v1", model="m", max_retries=2, backoff_s=0.01), tokenizer="text"
        )
        with pytest.raises(BackendError) as e:
            b.generate([], PARAMS, messages=[{"role": "user", "content": "hi"}])
        b.close()
    assert "500" in str(e.value) and b.requests == 3


def test_a_client_error_is_not_retried() -> None:
    with Scripted([400]) as url:
        b = OpenAIHTTPBackend(Upstream(url + "/v1", model="m"), tokenizer="text")
        with pytest.raises(BackendError, match="400"):
            b.generate([], PARAMS, prompt="hi")
        b.close()
    assert b.requests == 1


def test_azure_deployment_urls_and_api_key_header() -> None:
    scripted = Scripted([])
    with scripted as url:
        azure = Upstream(
            url + "/openai/deployments/gpt-4o-mini",
            model="gpt-4o-mini",
            api_key="k3y",
            azure_api_version="2024-10-21",
        )
        b = OpenAIHTTPBackend(azure, tokenizer="text")
        gen = b.generate([], PARAMS, messages=[{"role": "user", "content": "hi"}])
        b.close()
    (seen,) = scripted.seen
    assert seen["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"
    assert seen["query"] == "api-version=2024-10-21"
    assert seen["headers"]["api-key"] == "k3y" and "authorization" not in seen["headers"]
    assert gen.text == "Hello there"


def test_unreachable_servers_and_bad_configuration() -> None:
    port = free_port()  # nothing listens here
    unreachable = Upstream(f"http://127.0.0.1:{port}/v1", model="m")
    b = OpenAIHTTPBackend(
        dataclasses.replace(unreachable, max_retries=1, backoff_s=0.01), tokenizer="text"
    )
    with pytest.raises(BackendError, match="after 2 attempts"):
        b.generate([], PARAMS, prompt="hi")
    b.close()
    from continuum import InvalidRequest

    with pytest.raises(InvalidRequest):
        OpenAIHTTPBackend(Upstream("ftp://example", model="m"))
    with pytest.raises(InvalidRequest):
        OpenAIHTTPBackend(unreachable, tokenizer="local")
    with pytest.raises(BackendError):
        OpenAIHTTPBackend(unreachable, tokenizer="server")


def test_serve_with_a_remote_backend_puts_the_tiers_in_front(
    remote: Running, tmp_path: Path
) -> None:
    """`continuum serve --backend openai_http --upstream URL`: stateless routes go to the
    upstream with the reuse stack in front; sessions are refused with a 400 naming why."""
    for front in _serve(
        tmp_path,
        backend="openai_http",
        upstream=remote.url + "/v1",
        upstream_model=remote.state.model_id,
    ):
        assert front.state.worker is None
        client = front.client()
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a tree."}]
        first = client.chat.completions.create(
            model=front.state.model_id,
            messages=msgs,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        again = client.chat.completions.create(
            model=front.state.model_id,
            messages=msgs,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
        assert again.choices[0].message.content == first.choices[0].message.content
        usage = again.model_dump()["usage"]
        assert usage["continuum"]["hit_tier"] == "memo"
        with front.http() as h:
            r = h.post("/v1/sessions", json={"system": "hi"})
        assert r.status_code == 400 and "llamacpp" in r.json()["error"]["message"]
