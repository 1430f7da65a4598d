"""Agent clients' request shapes on a real server (Gemma 3 270M, the fastest model: these
tests are about what the server accepts and refuses, not about the answers).

- A request shaped as Codex sends it (function, namespace and hosted tools, two developer
  messages, ``reasoning``, ``include``, ``store: false``, ``prompt_cache_key``,
  ``client_metadata``, a ``session-id`` header) is served; the hosted tool is left out visibly.
- Every error the request alone decides — tools, roles, parameters, context length — is a 4xx
  JSON error before any work, streamed or not, on every route: no ``200`` that fails later, no
  session created, nothing stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from continuum.bench.codex_input import envelope
from tests.server.test_app import Running, _serve

N_CTX = 4096
SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a shell.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Spawn a sub-agent.",
            "strict": False,
            "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
        }
    ],
}


def developer(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": text}],
    }


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def codex_body(key: str, **over: Any) -> dict[str, Any]:
    """Codex's request (``bench.codex_input.envelope``: the fields it sends), at a small scale."""
    body = {
        **envelope(key, "turn-1"),
        "input": [
            developer("You are a coding agent. Use exec_command to read files."),
            developer("<skills_instructions>No skills.</skills_instructions>"),
            user("<environment_context><cwd>/tmp/repo</cwd></environment_context>"),
            user("Say hi."),
        ],
        "tools": [SHELL, AGENTS, {"type": "web_search", "external_web_access": False}],
        "max_output_tokens": 8,
    }
    return {**body, **over}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("agents"), n_ctx=N_CTX, default_max_tokens=8)


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


def test_a_codex_shaped_request_is_served_and_the_hosted_tool_left_out_visibly(
    srv: Running,
) -> None:
    headers = {"session-id": "codex-a", "thread-id": "codex-a", "x-client-request-id": "r1"}
    with srv.http() as http:
        r = http.post("/v1/responses", json=codex_body("codex-a"), headers=headers)
    assert r.status_code == 200, r.text
    got = events(r.text)
    done = got[-1]
    assert done["type"] in ("response.completed", "response.incomplete")
    response = done["response"]
    assert response["continuum"] == {"left_out": ["web_search"]}
    usage = response["usage"]["continuum"]
    assert usage["session"].startswith("hint-")  # the session-id header named a session
    assert not any(e["type"] == "error" for e in got)


def test_a_streamed_codex_request_with_a_reasoning_item_names_what_was_left_out(
    srv: Running,
) -> None:
    body = codex_body("codex-b", stream=False)
    body["input"] = [
        *body["input"],
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        user("Again."),
    ]
    with srv.http() as http:
        r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["continuum"] == {"left_out": ["web_search", "reasoning"]}


def test_hosted_tools_refused_when_the_server_says_so(tmp_path: Any) -> None:
    for running in _serve(tmp_path, n_ctx=N_CTX, hosted_tools="refuse"):
        with running.http() as http:
            r = http.post("/v1/responses", json=codex_body("codex-c"))
        assert r.status_code == 400
        assert "--hosted-tools refuse" in r.json()["error"]["message"]
        assert running.state.sessions().sessions() == []


def many_developers(n: int) -> list[dict[str, Any]]:
    return [developer(f"Rule {i}.") for i in range(n)] + [user("Hi.")]


BIG = "word " * 30_000  # ~30k tokens: far past the 4096-token context


# (route, body, status, what the message names); every body is streamed
BAD: list[tuple[str, dict[str, Any], int, str]] = [
    ("/v1/responses", {"tools": [{"type": "teleport"}]}, 400, "'teleport' are not supported"),
    (
        "/v1/responses",
        {"tools": [{"type": "namespace", "name": "ns", "tools": []}]},
        400,
        "namespace 'ns' has no tools",
    ),
    (
        "/v1/responses",
        {"tools": [SHELL, {**AGENTS, "name": "exec_command"}]},
        400,
        "has the name of the function tool",
    ),
    ("/v1/responses", {"input": many_developers(50)}, 400, "50 system/developer messages"),
    ("/v1/responses", {"input": [developer(BIG), user("Hi.")]}, 400, "maximum context length"),
    ("/v1/responses", {"max_output_tokens": N_CTX}, 400, "maximum context length"),
    (
        "/v1/responses",
        {"input": [{"type": "message", "role": "robot", "content": "x"}]},
        400,
        "role must be one of",
    ),
    ("/v1/responses", {"temperature": -1}, 400, "temperature"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": BIG}, {"role": "user", "content": "Hi."}]},
        400,
        "maximum context length",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "system", "content": "x"}] * 17
            + [{"role": "user", "content": "Hi"}]
        },
        400,
        "17 system/developer messages",
    ),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"max_tokens": N_CTX * 2}, 400, "maximum context length"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, 400, "tools[0]"),
    ("/v1/completions", {"prompt": BIG}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": N_CTX}, 400, "maximum context length"),
]


def _body(route: str, over: dict[str, Any], key: str) -> dict[str, Any]:
    if route == "/v1/responses":
        return codex_body(key, **over)
    base: dict[str, Any] = {"model": "continuum", "stream": True, "max_tokens": 8}
    if route == "/v1/chat/completions":
        base |= {"messages": [{"role": "user", "content": "Hi."}], "prompt_cache_key": key}
    else:
        base["prompt"] = "Hi"
    return {**base, **over}


@pytest.mark.parametrize(("route", "over", "status", "message"), BAD)
def test_an_error_the_request_decides_is_a_4xx_before_any_work_even_streamed(
    srv: Running, route: str, over: dict[str, Any], status: int, message: str
) -> None:
    before = srv.state.sessions().sessions()
    stored = srv.state.responses._items.copy()
    key = f"bad-{uuid.uuid4().hex}"
    with srv.http() as http, http.stream("POST", route, json=_body(route, over, key)) as r:
        r.read()
        assert r.status_code == status, r.text[:500]
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
    assert message in error["message"]
    assert "event:" not in r.text
    assert srv.state.sessions().sessions() == before  # no session was created for it
    assert srv.state.responses._items == stored
