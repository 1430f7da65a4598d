"""``continuum serve --store redis://…``: sessions and stored responses in a real Redis; Redis
unreachable is a 503 with a JSON body that says what to do, and nothing is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from continuum.store.redis_client import RedisTarget
from tests.redis_server import RedisServer
from tests.server.test_app import SYSTEM, Running, _serve


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def srv(tmp_path: Path, redis: RedisServer) -> Iterator[Running]:
    yield from _serve(tmp_path, store=redis.url + "?prefix=serve", n_ctx=2048)


def say(h: object, sid: str, text: str) -> object:
    return h.post(  # type: ignore[attr-defined]
        f"/v1/sessions/{sid}/messages",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 6},
    )


def test_sessions_live_in_redis_and_an_outage_is_a_503_that_loses_nothing(
    srv: Running, redis: RedisServer
) -> None:
    with srv.http() as h:
        sid = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        assert say(h, sid, "My name is Priya.").status_code == 200  # type: ignore[attr-defined]
        redis.kill()
        down = say(h, sid, "I live in Lisbon.")
        assert down.status_code == 503, down.text  # type: ignore[attr-defined]
        error = down.json()["error"]  # type: ignore[attr-defined]
        assert error["code"] == "store_unavailable" and "start Redis" in error["message"]
        assert "127.0.0.1" not in error["message"]  # the store's address stays on the server
        made = h.post("/v1/sessions", json={"system": SYSTEM})
        assert made.status_code == 503 and made.json()["error"]["code"] == "store_unavailable"
        redis.start()  # AOF replayed: the committed turn is there
        again = say(h, sid, "I live in Lisbon.")
        assert again.status_code == 200, again.text  # type: ignore[attr-defined]
        turns = h.get(f"/v1/sessions/{sid}").json()["turns"]
        assert len(turns) == 2  # the failed turn wrote nothing; the retry is turn 2


def test_stored_responses_chain_through_redis(srv: Running, redis: RedisServer) -> None:
    c = srv.client()
    first = c.responses.create(
        model=srv.state.model_id, input="My name is Priya.", max_output_tokens=6, store=True
    )
    second = c.responses.create(
        model=srv.state.model_id,
        input="What is my name?",
        max_output_tokens=6,
        previous_response_id=first.id,
    )
    assert second.output_text and second.usage is not None
    assert c.responses.retrieve(first.id).id == first.id
    target = RedisTarget(redis.url + "?prefix=serve")
    stored = list(target.client.scan_iter(match=target.key("response", "*")))
    assert len(stored) == 2  # both responses, in Redis
