"""Two tenants on one server (gemma3-270m, the semantic tier and the memory graph on): tenant
beta tries every route on tenant alpha's ids, with every ``X-Continuum-Tenant`` value it might
try, then sends alpha's requests byte for byte. No tier may serve beta from alpha's data, each
tier still serves beta from its own, and a restart (the history log, the memory graph on disk)
keeps them apart."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from continuum.server.auth import KeyRing, namespace
from continuum.server.responses import input_messages
from continuum.stateful.compaction import INSTRUCTION
from tests.server.test_app import Running, _serve

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

Json = dict[str, Any]
KEY_A, KEY_B = "alpha-key-0123456789abcdef", "beta-key-0123456789abcdef"
SYS, SYS_B = "You are Eva, a concise assistant.", "Bo here: a terse helper."
INSTR = "Answer in one word."
USER_S = {"role": "user", "content": "My name is Priya."}
SAME_A, SAME_B = "Explain what Kubernetes is.", "Can you tell me what Kubernetes is?"
P_C = "The capital of France is a city on the river Seine, and its name is"
P_G = "Photosynthesis is the process by which green plants turn sunlight into"  # alpha's only
SAMPLE: Json = {"max_tokens": 4, "temperature": 0}
RESULT_TIERS = ("memo", "semantic", "memory_graph")
MIN_SUFFIX = 8  # a KV-tier hit leaves at least this many prompt tokens to decode
TRIES = (None, "alpha", "", "default", "beta", "ci")  # X-Continuum-Tenant values beta sends
BAD = ("../alpha", "alpha/ci")  # refused (400) before any id is looked at
CODES = ("session_not_found", "response_not_found", "previous_response_not_found")
CHAT, RESP = "/v1/chat/completions", "/v1/responses"


def chat_body(text: str, system: str = SYS, **kw: Any) -> Json:
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return {"model": "continuum", "messages": msgs, **SAMPLE, **kw}


def resp_body(given: Any, **kw: Any) -> Json:
    return {"model": "continuum", "input": given, "max_output_tokens": 4, "temperature": 0, **kw}


HINTED = (  # alpha's hinted conversations: (name, route, body, headers)
    ("x-session-id", CHAT, chat_body("Plan a picnic."), {"X-Session-ID": "conv-a"}),
    ("user", CHAT, chat_body("Suggest a cat name.", user="user-a"), {}),
    ("cache-key", RESP, resp_body("Describe a beach.", prompt_cache_key="codex-a"), {}),
)


def call(srv: Running, key: str | None, method: str, path: str, **kw: Any) -> httpx.Response:
    tenant, extra = kw.pop("tenant", None), kw.pop("headers", {})
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if tenant is not None:
        headers["X-Continuum-Tenant"] = tenant
    return httpx.request(method, srv.url + path, headers={**headers, **extra}, timeout=120, **kw)


def ok(r: httpx.Response) -> Json:
    assert r.status_code in (200, 201), r.text
    body: Json = r.json()
    return body


def out_text(response: Json) -> str:
    return str(response["output"][0]["content"][0]["text"])


def cached(u: Json) -> int:
    return int((u.get("prompt_tokens_details") or u["input_tokens_details"])["cached_tokens"])


def prompt_of(u: Json) -> int:
    return int(u["prompt_tokens"] if "prompt_tokens" in u else u["input_tokens"])


def tiers(u: Json) -> dict[str, Json]:
    return {t["tier"]: t for t in u["continuum"]["tiers"]}


@dataclass
class World:
    tmp: Path
    srv: Running
    close: Callable[[], None]
    sids: dict[str, str] = field(default_factory=dict)  # alpha's sessions (name -> id)
    rids: dict[str, str] = field(default_factory=dict)  # alpha's responses and compaction
    replay: list[tuple[str, Json]] = field(default_factory=list)  # alpha's stateless requests
    facts: dict[str, Any] = field(default_factory=dict)  # what alpha's requests reported
    beta: dict[str, list[Any]] = field(default_factory=dict)  # beta's own ids and requests
    priors: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)  # ns -> prompts

    def a(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return call(self.srv, KEY_A, method, path, **kw)

    def b(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return call(self.srv, KEY_B, method, path, **kw)

    def alpha_state(self) -> dict[str, Any]:
        """Alpha's sessions (history, turns) and stored responses, as alpha reads them."""
        got: dict[str, Any] = {}
        for name, sid in self.sids.items():
            s = ok(self.a("GET", f"/v1/sessions/{sid}", tenant="ci" if name == "ci" else None))
            got[sid] = (s["history"], s["turns"])
        for name, rid in self.rids.items():
            if name != "cmp":  # a compaction is not a stored response
                got[rid] = ok(self.a("GET", f"{RESP}/{rid}", tenant="ci" if name == "ci" else None))
        return got


def _start(tmp: Path) -> Iterator[Running]:
    ring = KeyRing.parse([f"alpha={KEY_A}", f"beta={KEY_B}"])
    # one decode thread: on a shared machine spinning workers cost more than they give
    yield from _serve(tmp, keys=ring, semantic=True, graph=tmp / "graph.db", threads=1)


def tokens_of(w: World, path: str, body: Json) -> tuple[int, ...]:
    """The prompt tokens a request's op runs on (what the KV tiers and the backend see)."""
    messages: list[Any] | None = body.get("messages")
    prompt: str | None = body.get("prompt")
    if path.startswith(RESP):
        head = (
            [{"role": "system", "content": body["instructions"]}] if "instructions" in body else []
        )
        tail = [{"role": "user", "content": INSTRUCTION}] if path.endswith("compact") else []
        messages = [*head, *input_messages(body["input"]), *tail]
    backend = w.srv.state.engine.backend
    return tuple(w.srv.state.executor.call(lambda: backend.prompt_tokens(messages, prompt)))


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def bound(w: World, ns: str, path: str, body: Json) -> tuple[int, int]:
    """The most cached tokens a request of ``ns`` can show from that namespace's own earlier
    requests: the longest prefix it shares with one of their prompts (all of it when it
    extends a whole earlier prompt, whose reply the prefix tier also keeps); and its prompt's
    length. It then counts as one of them."""
    toks, best = tokens_of(w, path, body), 0
    for p in w.priors.setdefault(ns, []):
        n = lcp(p, toks)
        best = max(best, len(toks) if n == len(p) else n)
    w.priors[ns].append(toks)
    return best, len(toks)


def assert_decoded(u: Json, limit: int, n_prompt: int) -> None:
    """A first try in its namespace: decoded, no result tier hit, and cached tokens only from
    what that namespace built itself (``limit``), which is less than a reuse of the identical
    prompt (alpha's) would show."""
    c, said = u["continuum"], tiers(u)
    assert prompt_of(u) == n_prompt  # the bound was taken over the tokens the op ran on
    assert c["hit_tier"] not in RESULT_TIERS, c
    assert said["memo"]["outcome"] == "miss", said
    assert all(said[t]["outcome"] != "hit" for t in RESULT_TIERS if t in said), said
    assert "surfaced" not in said["memory_graph"], said  # nothing of another tenant surfaced
    assert cached(u) <= limit < prompt_of(u) - MIN_SUFFIX, (cached(u), limit, prompt_of(u))
    assert (c["hit_tier"] == "cold") == (cached(u) == 0), c
    assert c["prompt_tokens_evaluated"] == prompt_of(u) - cached(u)


def assert_turn_decoded(u: Json, wake: int, alphas: Json) -> None:
    """A session's first turn: decoded, its cached tokens only its own wake (``wake``: 0 when
    the turn paid for it) and the template glue it decoded itself while idle."""
    c = u["continuum"]
    assert c["hit_tier"] not in RESULT_TIERS and c["turn"] == alphas["continuum"]["turn"], c
    assert all(t["outcome"] != "hit" for t in c["tiers"] if t["tier"] in RESULT_TIERS), c
    assert cached(u) <= wake + c["eager_tokens_used"], (cached(u), c)
    assert c.get("wake_tokens", 0) == alphas["continuum"].get("wake_tokens", 0)  # in full
    assert c["prompt_tokens_evaluated"] + cached(u) == prompt_of(u)


def _alpha_sessions(w: World) -> None:
    made = ok(w.a("POST", "/v1/sessions", json={"system": SYS}))
    sid = made["id"]
    w.facts["wake"] = made["wake_tokens"]
    turn = ok(w.a("POST", f"/v1/sessions/{sid}/messages", json={"messages": [USER_S], **SAMPLE}))
    w.facts["turn1"] = turn["usage"]
    chunks = iter([b"And I live ", b"in Lisbon."])  # chunked: prefill on arrival
    ok(w.a("POST", f"/v1/sessions/{sid}/input", params=SAMPLE, content=chunks))
    history = ok(w.a("GET", f"/v1/sessions/{sid}"))["history"]
    more = {**chat_body("x"), "messages": [*history, {"role": "user", "content": "Thanks."}]}
    full = ok(w.a("POST", CHAT, json=more, headers={"X-Continuum-Session": sid}))
    assert full["usage"]["continuum"]["session"] == sid
    ok(w.a("POST", "/v1/sessions", json={"system": SYS, "session_id": "a-chosen"}))
    ci = ok(w.a("POST", "/v1/sessions", json={"system": SYS}, tenant="ci"))["id"]
    ok(w.a("POST", f"/v1/sessions/{ci}/messages", json={"messages": [USER_S]}, tenant="ci"))
    w.sids.update(main=sid, chosen="a-chosen", ci=ci)
    for name, path, body, headers in HINTED:
        r = ok(w.a("POST", path, json=body, headers=headers))
        w.sids[name], w.facts[name] = r["usage"]["continuum"]["session"], r["usage"]
        if path == RESP:
            w.rids[name] = r["id"]


def _alpha_stateless(w: World) -> None:
    seeds = [
        ("/v1/completions", {"model": "continuum", "prompt": P_C, **SAMPLE}),
        (CHAT, chat_body("Name three colours of the rainbow.")),
        (CHAT, chat_body("Give me one fruit that is yellow.")),
    ]
    for i, (path, body) in enumerate(seeds):
        first = ok(w.a("POST", path, json=body))["usage"]
        again = ok(w.a("POST", path, json=body))["usage"]
        assert again["continuum"]["hit_tier"] == "memo" and cached(again) == prompt_of(again)
        if i == 2:  # it shares the system prompt with the one before: alpha's prefix KV
            assert first["continuum"]["hit_tier"] == "prefix_kv" and cached(first) > 0
    ok(w.a("POST", CHAT, json=chat_body(SAME_A)))
    near = ok(w.a("POST", CHAT, json=chat_body(SAME_B)))["usage"]
    assert near["continuum"]["hit_tier"] == "semantic"
    w.replay += [*seeds, (CHAT, chat_body(SAME_B))]
    ok(w.a("POST", "/v1/completions", json={"model": "continuum", "prompt": P_G, **SAMPLE}))
    emb = {"model": "continuum", "input": ["a private note"]}
    w.facts["embedding"] = ok(w.a("POST", "/v1/embeddings", json=emb))["data"]


def _alpha_responses(w: World) -> None:
    r1_body = resp_body("Remember the word: teal.", instructions=INSTR)
    r1 = ok(w.a("POST", RESP, json=r1_body))
    r2 = ok(w.a("POST", RESP, json=resp_body("What word?", previous_response_id=r1["id"])))
    r3 = ok(w.a("POST", RESP, json=resp_body("Spell it.", previous_response_id=r2["id"])))
    assert cached(r3["usage"]) > 0  # the chain is alpha's prefix KV
    compact = {"model": "continuum", "previous_response_id": r2["id"]}
    cmp = ok(w.a("POST", "/v1/responses/compact", json=compact))
    r4_body = resp_body([*cmp["output"], {"role": "user", "content": "Go on."}])
    r4 = ok(w.a("POST", RESP, json=r4_body))
    rci = ok(w.a("POST", RESP, json=resp_body("Say hi."), tenant="ci"))
    w.rids.update(r1=r1["id"], r2=r2["id"], r3=r3["id"], r4=r4["id"], cmp=cmp["id"], ci=rci["id"])
    chain = [  # r2's conversation as items: what alpha's compaction summarised
        {"role": "user", "content": "Remember the word: teal."},
        {"role": "assistant", "content": out_text(r1)},
        {"role": "user", "content": "What word?"},
        {"role": "assistant", "content": out_text(r2)},
    ]
    w.replay += [
        (RESP, r1_body),
        (RESP, r4_body),  # the compaction item alpha received, sent by beta
        ("/v1/responses/compact", {"model": "continuum", "input": chain}),
    ]


def _beta_own(w: World) -> None:
    """Beta's own data, for alpha (narrowed to "beta") to look for."""
    sid = ok(w.b("POST", "/v1/sessions", json={"system": SYS_B}))["id"]
    ok(w.b("POST", f"/v1/sessions/{sid}/messages", json={"messages": [USER_S], **SAMPLE}))
    rid = ok(w.b("POST", RESP, json=resp_body("Count to two.")))["id"]
    asked = chat_body("Tell me a secret.", system=SYS_B)
    ok(w.b("POST", CHAT, json=asked))
    w.beta.update(sessions=[sid], responses=[rid], replay=[(CHAT, asked)])
    window = chat_body(USER_S["content"], system=SYS_B)
    for path, body in (
        (CHAT, window),
        (RESP, resp_body("Count to two.")),
        (CHAT, asked),
    ):
        bound(w, "beta", path, body)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("tenants")
    running = _start(tmp)
    w = World(tmp, next(running), lambda: next(running, None))
    _alpha_sessions(w)
    _alpha_stateless(w)
    _alpha_responses(w)
    _beta_own(w)
    w.facts["alpha"] = w.alpha_state()
    yield w
    w.close()


def session_attempts(sid: str) -> list[tuple[str, str, Json]]:
    turn = {"messages": [{"role": "user", "content": "Hello."}], **SAMPLE}
    chat = {"json": chat_body("Hello."), "headers": {"X-Continuum-Session": sid}}
    return [
        ("GET", f"/v1/sessions/{sid}", {}),
        ("POST", f"/v1/sessions/{sid}/messages", {"json": turn}),
        ("POST", f"/v1/sessions/{sid}/input", {"content": b"Hello.", "params": SAMPLE}),
        ("DELETE", f"/v1/sessions/{sid}", {}),
        ("POST", CHAT, chat),
    ]


def response_attempts(rid: str) -> list[tuple[str, str, Json]]:
    cont = resp_body("Hello.", previous_response_id=rid)
    compact = {"model": "continuum", "previous_response_id": rid, "input": "Hello."}
    return [
        ("GET", f"/v1/responses/{rid}", {}),
        ("DELETE", f"/v1/responses/{rid}", {}),
        ("POST", RESP, {"json": cont}),
        ("POST", RESP, {"json": {**cont, "stream": True}}),
        ("POST", RESP, {"json": {**cont, "prompt_cache_key": "codex-a"}}),
        ("POST", "/v1/responses/compact", {"json": compact}),
    ]


def assert_refused(r: httpx.Response, status: int, codes: tuple[str, ...]) -> Json:
    """An OpenAI-shaped error of ``status`` with one of ``codes``."""
    assert r.status_code == status, (r.request.method, r.request.url, r.text)
    body: Json = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] in codes
    return body


def _probe(w: World, ids: list[str], attempts: Callable[[str], list[tuple[str, str, Json]]]) -> int:
    """Beta, with every tenant header, on each of alpha's ``ids``: a 404 exactly as for an id
    that never existed (the same code and message), or a 400 for a header it may not send."""
    tried = 0
    for real in ids:
        fake = "f" * len(real)
        for tenant in (*TRIES, *BAD):
            for (method, path, kw), (_, fpath, fkw) in zip(
                attempts(real), attempts(fake), strict=True
            ):
                r = w.b(method, path, tenant=tenant, **kw)
                tried += 1
                if tenant in BAD:
                    error = assert_refused(r, 400, ("invalid_request",))["error"]
                    assert "X-Continuum-Tenant" in error["message"]
                    continue
                got = assert_refused(r, 404, CODES)["error"]
                if tenant is None:  # no oracle: an id of alpha's answers as a missing one does
                    never = assert_refused(w.b(method, fpath, **fkw), 404, CODES)["error"]
                    assert got["code"] == never["code"]
                    assert got["message"].replace(real, fake) == never["message"]
    return tried


def test_beta_is_refused_on_every_route_with_alphas_ids(world: World) -> None:
    sids, rids = list(world.sids.values()), list(world.rids.values())
    tried = _probe(world, sids, session_attempts) + _probe(world, rids, response_attempts)
    assert tried == (len(sids) * 5 + len(rids) * 6) * (len(TRIES) + len(BAD))
    for sid in sids:  # streamed turns: a 404 before any event, as for a missing id
        for method, path, kw in session_attempts(sid)[1:5:3]:
            body = {**kw["json"], "stream": True}
            for tenant in TRIES:
                r = world.b(method, path, tenant=tenant, json=body, headers=kw.get("headers", {}))
                assert_refused(r, 404, ("session_not_found",))
    for sid in ("a-chosen", world.sids["main"]):  # ids are global: taken is taken, for anyone
        r = world.b("POST", "/v1/sessions", json={"system": "Mine.", "session_id": sid})
        assert_refused(r, 409, ("session_exists",))
    assert world.alpha_state() == world.facts["alpha"]  # nothing of alpha's changed or went


def _beta_sessions(w: World, tenant: str | None, ns: str) -> None:
    made = ok(w.b("POST", "/v1/sessions", json={"system": SYS}, tenant=tenant))
    assert made["wake_tokens"] == w.facts["wake"]
    sid = made["id"]
    first = {"messages": [USER_S], **SAMPLE}
    turn = ok(w.b("POST", f"/v1/sessions/{sid}/messages", json=first, tenant=tenant))
    assert_turn_decoded(turn["usage"], made["wake_tokens"], w.facts["turn1"])
    bound(w, ns, CHAT, chat_body(USER_S["content"]))
    for name, path, body, headers in HINTED:  # alpha's hint values: beta's own sessions
        u = ok(w.b("POST", path, json=body, headers=headers, tenant=tenant))["usage"]
        assert u["continuum"]["session"] not in w.sids.values()
        assert_turn_decoded(u, 0, w.facts[name])
        bound(w, ns, path, body)
        again = ok(w.b("POST", path, json=body, headers=headers, tenant=tenant))["usage"]
        assert again["continuum"]["hit_tier"] == "memo"  # its own turn, answered from memo
        assert again["continuum"]["session"] == u["continuum"]["session"]
    other = ok(w.b("POST", "/v1/sessions", json={"system": SYS}, tenant=tenant))["id"]
    second = ok(w.b("POST", f"/v1/sessions/{other}/messages", json=first, tenant=tenant))
    assert second["usage"]["continuum"]["hit_tier"] == "memo"  # beta's first turn, not alpha's


def test_alphas_requests_sent_by_beta_are_decoded_then_served_from_its_own(world: World) -> None:
    for tenant in (None, "alpha"):  # each a namespace of beta's (beta, beta/alpha), empty at first
        ns = namespace("beta", tenant)
        for path, body in world.replay:
            u = ok(world.b("POST", path, json=body, tenant=tenant))["usage"]
            assert_decoded(u, *bound(world, ns, path, body))
        near = chat_body(SAME_A)  # alpha's semantic hit; for beta, a paraphrase of its own
        u = ok(world.b("POST", CHAT, json=near, tenant=tenant))["usage"]
        assert u["continuum"]["hit_tier"] == "semantic"
        bound(world, ns, CHAT, near)
        _beta_sessions(world, tenant, ns)
        emb = {"model": "continuum", "input": ["a private note"]}  # no state: the same vector
        assert (
            ok(world.b("POST", "/v1/embeddings", json=emb, tenant=tenant))["data"]
            == (world.facts["embedding"])
        )
    for tenant in (None, ""):  # "" names beta itself: its own memo answers
        for path, body in world.replay:
            u = ok(world.b("POST", path, json=body, tenant=tenant))["usage"]
            assert u["continuum"]["hit_tier"] == "memo" and cached(u) == prompt_of(u), u
    assert world.alpha_state() == world.facts["alpha"]


def test_alpha_narrowed_to_beta_sees_nothing_of_betas(world: World) -> None:
    for sid in world.beta["sessions"]:
        for method, path, kw in session_attempts(sid):
            assert_refused(world.a(method, path, tenant="beta", **kw), 404, CODES)
    for rid in world.beta["responses"]:
        for method, path, kw in response_attempts(rid):
            assert_refused(world.a(method, path, tenant="beta", **kw), 404, CODES)
    for path, body in world.beta["replay"]:
        u = ok(world.a("POST", path, json=body, tenant="beta"))["usage"]
        assert_decoded(u, *bound(world, "alpha/beta", path, body))
        u = ok(world.b("POST", path, json=body))["usage"]
        assert u["continuum"]["hit_tier"] == "memo"  # beta's own answer is still there
    for sid in world.beta["sessions"]:
        assert len(ok(world.b("GET", f"/v1/sessions/{sid}"))["turns"]) == 1


def test_beta_cannot_claim_the_session_an_alpha_hint_will_name(world: World) -> None:
    """A hint's session id is derived from the tenant and the hint (deps.hinted_session), in
    the one id space client-chosen ids share: such ids are the server's own, so beta cannot
    create the one alpha's hinted requests will use (that turned them into 409s)."""
    sid = "hint-" + hashlib.sha256(b"alpha\0conv-claimed").hexdigest()[:32]
    r = world.b("POST", "/v1/sessions", json={"system": SYS_B, "session_id": sid})
    assert_refused(r, 400, ("invalid_request",))
    r = world.a(
        "POST", CHAT, json=chat_body("Plan a picnic."), headers={"X-Session-ID": "conv-claimed"}
    )
    assert r.status_code == 200, r.text


def test_without_a_key_every_route_but_health_is_a_401(world: World) -> None:
    sid, rid = world.sids["main"], world.rids["r1"]
    routes = [
        *session_attempts(sid),
        *response_attempts(rid),
        ("GET", "/v1/models", {}),
        ("GET", "/metrics", {}),
        ("POST", "/v1/completions", {"json": {"model": "continuum", "prompt": "Hi", **SAMPLE}}),
        ("POST", "/v1/embeddings", {"json": {"model": "continuum", "input": "hi"}}),
        ("POST", "/v1/sessions", {"json": {"system": SYS}}),
        ("GET", "/v1/nowhere", {}),
    ]
    wrong = (None, "Bearer", f"Basic {KEY_A}", f"Bearer {KEY_A[:-1]}", f"Bearer {KEY_A} x")
    for auth in wrong:
        for method, path, kw in routes:
            headers = {**kw.get("headers", {}), "X-Continuum-Tenant": "alpha"}
            if auth is not None:
                headers["Authorization"] = auth
            rest = {k: v for k, v in kw.items() if k != "headers"}
            r = call(world.srv, None, method, path, headers=headers, **rest)
            assert_refused(r, 401, ("invalid_api_key",))
    health = call(world.srv, None, "GET", "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert world.alpha_state() == world.facts["alpha"]


def test_metrics_name_no_session_response_prompt_or_key(world: World) -> None:
    got = [world.a("GET", "/metrics"), world.b("GET", "/metrics")]
    assert [r.status_code for r in got] == [200, 200]
    text = "".join(r.text for r in got)
    assert 'continuum_hits_total{tier="memo"}' in text  # it does report what was served
    prompts = [str(m["content"]) for _, b in world.replay for m in b.get("messages", [])]
    secret = [
        *world.sids.values(),
        *world.rids.values(),
        *world.beta["sessions"],
        *world.beta["responses"],
        "conv-a",
        "codex-a",
        "user-a",
        SYS,
        SYS_B,
        INSTR,
        P_G,
        P_C,
        "Remember the word",
        KEY_A,
        KEY_B,
        "alpha",
        "beta",
        *prompts,
    ]
    assert [s for s in secret if s in text] == []


def test_after_a_restart_the_log_and_the_memory_graph_stay_partitioned(world: World) -> None:
    before = world.alpha_state()
    world.close()  # the same store, snapshots and memory graph, in a new process
    for srv in _start(world.tmp):
        world.srv = srv
        for tenant in (None, "alpha"):
            for sid in world.sids.values():
                for method, path, kw in session_attempts(sid)[:2]:
                    assert_refused(world.b(method, path, tenant=tenant, **kw), 404, CODES)
            for rid in world.rids.values():
                for method, path, kw in response_attempts(rid)[::2]:
                    assert_refused(world.b(method, path, tenant=tenant, **kw), 404, CODES)
        assert not set(world.sids.values()) & set(srv.state.sessions().sessions())  # not opened
        assert world.alpha_state() == before  # histories, turns; responses from the log
        g = {"model": "continuum", "prompt": P_G, **SAMPLE}
        u = ok(world.b("POST", "/v1/completions", json=g))["usage"]
        assert_decoded(u, *bound(world, "beta", "/v1/completions", g))
        u = ok(world.a("POST", "/v1/completions", json=g))["usage"]
        assert u["continuum"]["hit_tier"] == "memory_graph"  # alpha's own, from before
        path, body = world.replay[0]  # beta sent it before the restart
        u = ok(world.b("POST", path, json=body))["usage"]
        assert u["continuum"]["hit_tier"] == "memory_graph"
        para = {
            "model": "continuum",
            "prompt": "In green plants, the process that turns light into energy is called",
            **SAMPLE,
        }
        u = ok(world.a("POST", "/v1/completions", json=para))["usage"]
        assert tiers(u)["memory_graph"].get("surfaced", 0) >= 1  # alpha's past, to alpha
