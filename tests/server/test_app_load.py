"""Load: 64 agents at once over HTTP against one server (fast model, loopback), each its own
session with a secret of its own. Every reply must be the one its conversation gets alone
(a sample of the conversations replayed one at a time in another tenant afterwards), every turn
must be in its own history and no other, and a full queue answers 429 with Retry-After —
clients that honour it all finish; nothing hangs."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest

from tests.server.test_app import Running, _serve

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

AGENTS = 64
TURNS = 2
REFERENCES = 16  # agents replayed alone: each reply must equal its concurrent one
DEADLINE_S = 600  # a bound on the whole run, so a hang fails instead of stalling CI


@dataclass
class Agent:
    i: int
    secret: str = ""
    sid: str = ""
    replies: list[str] = field(default_factory=list)
    refused: int = 0  # 429s it was answered, each with Retry-After

    def __post_init__(self) -> None:
        rng = random.Random(self.i)
        self.secret = f"{rng.choice(['amber', 'birch', 'cedar', 'delta'])}-{rng.randrange(10**6)}"

    @property
    def system(self) -> str:
        return f"You are agent {self.i}. Your secret code is {self.secret}."

    def message(self, turn: int) -> str:
        if turn == 0:
            return f"Agent {self.i}, my code is {self.secret}. Say it back."
        return "What was the code I gave you?"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("load"), max_queue=16, n_ctx=2048)


def _post(c: httpx.Client, agent: Agent, path: str, body: dict[str, object]) -> httpx.Response:
    """POST, honouring 429's Retry-After (plus jitter, as a well-behaved client does)."""
    give_up = time.monotonic() + DEADLINE_S
    while True:
        r = c.post(path, json=body)
        if r.status_code != 429:
            return r
        assert r.json()["error"]["code"] in ("queue_full", "session_quota_exceeded")
        agent.refused += 1
        wait = float(r.headers["retry-after"])  # present on every 429 of a full queue
        assert time.monotonic() < give_up, "a client never got through"
        time.sleep(wait + random.random() * 0.5)


def _converse(srv: Running, agent: Agent, tenant: str, start: threading.Barrier | None) -> None:
    with srv.http(headers={"X-Continuum-Tenant": tenant}, timeout=DEADLINE_S) as c:
        if start is not None:
            start.wait(timeout=60)  # every agent starts at once
        r = _post(c, agent, "/v1/sessions", {"system": agent.system})
        assert r.status_code == 201, r.text
        agent.sid = r.json()["id"]
        for turn in range(TURNS):
            body = {
                "messages": [{"role": "user", "content": agent.message(turn)}],
                "max_tokens": 6,
                "temperature": 0,
            }
            r = _post(c, agent, f"/v1/sessions/{agent.sid}/messages", body)
            assert r.status_code == 200, r.text
            agent.replies.append(r.json()["choices"][0]["message"]["content"])


def test_sixty_four_agents_at_once_get_their_own_replies(srv: Running) -> None:
    agents = [Agent(i) for i in range(AGENTS)]
    start = threading.Barrier(AGENTS)
    with ThreadPoolExecutor(AGENTS) as pool:
        futures = [pool.submit(_converse, srv, a, "load", start) for a in agents]
        for f in futures:
            f.result(timeout=DEADLINE_S)  # an exception or a hang fails here
    refused = sum(a.refused for a in agents)
    assert refused > 0, "64 agents against a queue of 16 must meet a full queue"
    sample = random.Random(7).sample(agents, REFERENCES)
    for a in sample:  # the same conversations one at a time, in a tenant of their own
        alone = Agent(a.i)
        _converse(srv, alone, "alone", None)
        assert a.replies == alone.replies, f"agent {a.i}'s replies differ from it alone"
    with srv.http(headers={"X-Continuum-Tenant": "load"}) as c:
        for a in agents:
            got = c.get(f"/v1/sessions/{a.sid}").json()
            history = got["history"]
            assert len(got["turns"]) == TURNS  # no turn lost, none doubled
            assert history[0] == {"role": "system", "content": a.system}
            users = [m["content"] for m in history if m["role"] == "user"]
            assert users == [a.message(t) for t in range(TURNS)]
            assert [m["content"] for m in history if m["role"] == "assistant"] == a.replies
            others = [b.secret for b in agents if b is not a]
            assert not any(s in m["content"] for m in history for s in others)
    print(f"\n{AGENTS} agents x {TURNS} turns: {refused} 429s (Retry-After honoured), 0 crossed")
