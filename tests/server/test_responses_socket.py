"""``/v1/responses`` over a WebSocket (the Responses API's WebSocket mode), through the openai
SDK's own client (``client.responses.connect()``) and a bare ``websockets`` client for what
the SDK would never send, against a real server on the default model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from continuum.server.auth import KeyRing
from tests.server.test_app import Running, _serve

MODEL = "qwen2.5-coder-0.5b"
CREATE = "response.create"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("socket"), model=MODEL, default_max_tokens=16)


def ws_url(srv: Running) -> str:
    return srv.url.replace("http://", "ws://") + "/v1/responses"


def until_done(conn: Any) -> list[Any]:
    """The SDK connection's events up to the turn's terminal one."""
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL:
            return events
    raise AssertionError(f"the connection closed after {[e.type for e in events]}")


def turn(ws: Any, body: dict[str, Any] | str) -> list[dict[str, Any]]:
    """One message on a bare connection, and the events up to its terminal one."""
    ws.send(body if isinstance(body, str) else json.dumps(body))
    events = []
    while True:
        events.append(json.loads(ws.recv(timeout=120)))
        if events[-1]["type"] in TERMINAL:
            return events


def test_a_store_false_chain_continues_on_its_connection_only(qwen: Running) -> None:
    client = qwen.client()
    common = {"model": qwen.state.model_id, "temperature": 0, "max_output_tokens": 8}
    with client.responses.connect() as conn:
        conn.response.create(input="My name is Ada. Reply with OK.", store=False, **common)
        first_events = until_done(conn)
        first = first_events[-1].response
        assert first.status in ("completed", "incomplete") and first.output_text
        kinds = [e.type for e in first_events]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in kinds
        seqs = [e.sequence_number for e in first_events]
        assert seqs == list(range(len(seqs)))
        conn.response.create(
            input="What is my name?", store=False, previous_response_id=first.id, **common
        )
        second = until_done(conn)[-1].response
    assert second.previous_response_id == first.id
    # only the new input is decoded: the first prompt and its reply are held
    u1, u2 = first.usage, second.usage
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens + u1.output_tokens - 1
    assert u2.input_tokens - u2.input_tokens_details.cached_tokens < 30
    # store: false means the server's store never saw it: not over HTTP, not on a new socket
    r = qwen.http().get(f"/v1/responses/{first.id}")
    assert r.status_code == 404
    with connect(ws_url(qwen)) as ws:
        (err,) = turn(
            ws,
            {
                "type": "response.create",
                **common,
                "previous_response_id": first.id,
                "input": "Again?",
            },
        )
    assert err["type"] == "error" and err["status"] == 404
    assert err["error"]["code"] == "previous_response_not_found"


def test_a_stored_response_is_continued_from_another_connection(qwen: Running) -> None:
    common = {"type": "response.create", "model": qwen.state.model_id, "max_output_tokens": 4}
    with connect(ws_url(qwen)) as ws:
        first = turn(ws, {**common, "input": "Say hi."})[-1]["response"]
    assert qwen.http().get(f"/v1/responses/{first['id']}").status_code == 200
    with connect(ws_url(qwen)) as ws:
        done = turn(ws, {**common, "input": "Again.", "previous_response_id": first["id"]})
    assert done[-1]["type"] in ("response.completed", "response.incomplete")
    assert done[-1]["response"]["usage"]["input_tokens_details"]["cached_tokens"] > 0


BAD = [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ({"type": "response.cancel"}, "response.create"),
    ({"type": "response.create", "input": "hi", "stream": True}, "stream"),
    ({"type": "response.create", "input": "hi", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"type": "response.create", "model": "no-such-model", "input": "hi"}, "no-such-model"),
    ({"type": "response.create", "input": "hi", "tools": [{"type": "telepathy"}]}, "telepathy"),
    (
        {
            "type": "response.create",
            "input": [{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}],
        },
        "call_nobody",
    ),
    ({"type": "response.create", "input": [{"role": "developer", "content": "x"}] * 50}, "system"),
]


def test_bad_messages_are_error_events_and_the_connection_carries_on(qwen: Running) -> None:
    model = qwen.state.model_id
    with connect(ws_url(qwen)) as ws:
        for body, names in BAD:
            if isinstance(body, dict) and "model" not in body and body["type"] == CREATE:
                body = {**body, "model": model}
            events = turn(ws, body)
            assert len(events) == 1, (body, events)  # before any work: no response.created
            (err,) = events
            assert err["type"] == "error" and 400 <= err["status"] < 500, err
            assert names in err["error"]["message"], (names, err)
        # the connection still serves
        ok = turn(ws, {"type": CREATE, "model": model, "input": "Hi", "max_output_tokens": 2})
    assert ok[-1]["type"] in ("response.completed", "response.incomplete")


def test_a_failed_continuation_drops_the_response_it_continued(qwen: Running) -> None:
    common = {"type": CREATE, "model": qwen.state.model_id, "store": False, "max_output_tokens": 4}
    with connect(ws_url(qwen)) as ws:
        first = turn(ws, {**common, "input": "Remember: ember."})[-1]["response"]
        stray = {"type": "function_call_output", "call_id": "call_stray", "output": "x"}
        (failed,) = turn(ws, {**common, "previous_response_id": first["id"], "input": [stray]})
        assert failed["type"] == "error" and failed["status"] == 400
        (gone,) = turn(ws, {**common, "previous_response_id": first["id"], "input": "stale?"})
    assert gone["error"]["code"] == "previous_response_not_found"


def test_a_call_and_its_output_on_one_connection(qwen: Running) -> None:
    common = {
        "type": CREATE,
        "model": qwen.state.model_id,
        "store": False,
        "temperature": 0,
        "tools": [WEATHER],
    }
    with connect(ws_url(qwen)) as ws:
        events = turn(
            ws,
            {
                **common,
                "input": "Weather in Lisbon?",
                "tool_choice": "required",
                "max_output_tokens": 40,
            },
        )
        done = events[-1]["response"]
        (call,) = [o for o in done["output"] if o["type"] == "function_call"]
        assert "response.function_call_arguments.done" in [e["type"] for e in events]
        out = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        after = turn(
            ws,
            {**common, "previous_response_id": done["id"], "input": [out], "max_output_tokens": 8},
        )[-1]
    assert after["type"] in ("response.completed", "response.incomplete"), after
    assert (
        after["response"]["usage"]["input_tokens_details"]["cached_tokens"]
        >= (done["usage"]["input_tokens"])
    )


def test_the_handshake_is_guarded_like_every_route(tmp_path: Path) -> None:
    key = "k" * 40
    for running in _serve(tmp_path, model=MODEL, keys=KeyRing.parse([key])):
        url = ws_url(running)
        with pytest.raises(InvalidStatus) as e:
            connect(url).close()
        assert e.value.response.status_code == 401
        assert b"invalid_api_key" in e.value.response.body
        with pytest.raises(InvalidStatus) as e:
            connect(url, additional_headers={"Authorization": "Bearer wrong"}).close()
        assert e.value.response.status_code == 401
        bearer = {"Authorization": f"Bearer {key}"}
        with pytest.raises(InvalidStatus) as e:  # a page on another site may not open one
            connect(url, additional_headers=bearer, origin="https://evil.example").close()
        assert e.value.response.status_code == 403
        with connect(url, additional_headers=bearer) as ws:
            done = turn(
                ws,
                {
                    "type": CREATE,
                    "model": running.state.model_id,
                    "input": "Hi",
                    "max_output_tokens": 2,
                },
            )
        assert done[-1]["type"] in ("response.completed", "response.incomplete")
        with running.client(api_key=key).responses.connect() as conn:  # the SDK sends its key
            conn.response.create(model=running.state.model_id, input="Hi", max_output_tokens=2)
            assert until_done(conn)[-1].type in ("response.completed", "response.incomplete")
