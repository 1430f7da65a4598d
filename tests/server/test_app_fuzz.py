"""Fuzz the HTTP edge of ``continuum serve``: a generated corpus of malformed requests over every
route (bad JSON, wrong types, odd numbers, unknown fields, bad UTF-8, oversize bodies, odd
headers, traversal-looking ids, wrong methods, bad query strings). Every answer is a 4xx in
OpenAI's error shape that names nothing on the server; never a 5xx, a reset or a timeout; and
``/health`` answers after every request.

The corpus is certainly invalid, so the model never runs for it: a request that might pass
every other check carries a *poison* the route checks after all of them (a bad
``X-Continuum-Tenant``; on ``/v1/responses``, whose tenant is read early, ``max_output_tokens:
0``). A few well-formed but odd requests (:func:`test_odd_but_valid_requests_are_served`) may run
it, for at most two tokens. One server serves it all, with an API key (so every route but
``/health`` checks it) and a 64 KB body limit. The last test prints the corpus size and its
statuses (``-s``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum.server.auth import KeyRing
from continuum.server.schemas import (
    ChatRequest,
    CompactRequest,
    CompletionRequest,
    EmbeddingsRequest,
    InputParams,
    ResponsesRequest,
    SessionCreate,
    SessionMessages,
)
from tests.server.test_app import ROUTES, Running, _serve

KEY = "fuzz-0123456789abcdef-key"
AUTH = ("authorization", f"Bearer {KEY}")
LIMIT = 64 << 10  # the server's max_body_bytes
BAD_TENANT = ("x-continuum-tenant", "../etc")
Headers = tuple[tuple[str, str | bytes], ...]
RAW = "\x00raw:"  # a string value sent as the JSON text after it (1e309, NaN, 2**70 ...)
SEEN: list[tuple[str, str, int]] = []  # (route, kind, status) of every request sent

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
SESSIONS, MESSAGES = "/v1/sessions", "/v1/sessions/{session_id}/messages"
INPUT, SESSION = "/v1/sessions/{session_id}/input", "/v1/sessions/{session_id}"
RESPONSES, COMPACT = "/v1/responses", "/v1/responses/compact"
RESPONSE = "/v1/responses/{response_id}"
MSG = [{"role": "user", "content": "hi"}]
SCHEMAS: dict[str, Any] = {
    CHAT: ChatRequest, COMPLETIONS: CompletionRequest, EMBEDDINGS: EmbeddingsRequest,
    SESSIONS: SessionCreate, MESSAGES: SessionMessages, RESPONSES: ResponsesRequest,
    COMPACT: CompactRequest,
}  # fmt: skip
BASES: dict[str, dict[str, Any]] = {  # well-formed bodies, before the poison
    CHAT: {"model": "continuum", "messages": MSG, "max_tokens": 1},
    COMPLETIONS: {"model": "continuum", "prompt": "hi", "max_tokens": 1},
    EMBEDDINGS: {"model": "continuum", "input": "hi"},
    SESSIONS: {"system": "hi"},
    MESSAGES: {"messages": MSG, "max_tokens": 1},
    RESPONSES: {"model": "continuum", "input": "hi", "max_output_tokens": 1, "store": False},
    COMPACT: {"model": "continuum", "input": "hi"},
}
TENANT_ROUTES = (CHAT, COMPLETIONS, SESSIONS, MESSAGES, INPUT, SESSION, RESPONSES, COMPACT,
                 RESPONSE)  # fmt: skip
NUMBERS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
           "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "min_p",
           "repetition_penalty", "repeat_penalty", "best_of"]  # fmt: skip
NUMERIC = [(r, f) for r in (CHAT, COMPLETIONS, MESSAGES) for f in NUMBERS] + [
    (RESPONSES, f) for f in ("max_output_tokens", "temperature", "top_p", "top_logprobs")
]
ODD = ["1e309", "-1e309", "NaN", "Infinity", "-Infinity", "1e-400", "-0", "-0.0", "0.5", "-1",
       "0", str(2**70), str(-(2**70)), "1" * 40, "1E400", "3.0"]  # fmt: skip
TRICKY_IDS = [  # sent as written: some percent-encoded, some raw
    "../../etc/passwd", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "..%2F..%2Fetc%2Fpasswd",
    "%252e%252e%252fetc", "..%5c..%5cwindows%5cwin.ini", "....%2F%2F....%2F%2Fetc", "%00",
    "a%00b", "%ED%A0%80", "%FF%FE", "%C0%AE%C0%AE%2F", "%0D%0ASet-Cookie:%20x=1", "%3F%23",
    "x" * 4000, "%E2%80%AE%E2%80%8Bid", "%F0%9F%92%A9", "~root", "%24%7Bjndi:ldap:x%7D",
    "%27%20OR%201=1--", "%3Cscript%3E", "con", "nul.txt", "hint-0", "resp_..%2f..",
]  # fmt: skip
BAD_UTF8 = [b"\xff", b"\xc3", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xfe\xff"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
odd_numbers = st.sampled_from([RAW + x for x in ODD]) | st.integers(-(2**80), 2**80) | st.floats()
FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@dataclass(frozen=True)
class Probe:
    """One request of the corpus: ``route`` (as ROUTES names it) and ``kind`` are for the tally;
    ``ok``: statuses outside 4xx this request may get (documented exceptions only)."""

    kind: str
    route: str
    method: str
    path: str
    body: bytes | None = None
    headers: Headers = ()
    auth: bool = True  # send the valid key
    json_type: bool = True  # send Content-Type: application/json with a body
    chunk: int = 0  # > 0: send the body chunked, in pieces of this size
    ok: frozenset[int] = frozenset()


@dataclass
class Fuzz:
    run: Running
    client: httpx.Client
    session: str  # a real session of the key's tenant, which the corpus must leave untouched
    secrets: tuple[str, ...]  # what no answer may name: paths on the server


@pytest.fixture(scope="module")
def fz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    tmp = tmp_path_factory.mktemp("fuzz")
    config = {
        "keys": KeyRing.parse([KEY]),
        "max_body_bytes": LIMIT,
        "default_max_tokens": 2,
        "n_ctx": 2048,
        "max_queue": 8,
    }
    for run in _serve(tmp, **config):
        model = getattr(run.state.engine.backend, "model", None)
        where = [str(tmp), str(Path.home()) + "/", "site-packages", "Traceback", ".cache/"]
        if model is not None and hasattr(model, "path"):
            where += [str(model.path), str(model.path.parent)]
        limits = httpx.Limits(max_keepalive_connections=0)  # a fresh connection per request
        with httpx.Client(base_url=run.url, timeout=60, limits=limits) as client:
            r = client.post(SESSIONS, json={"system": "Be brief."}, headers=[AUTH])
            assert r.status_code == 201, r.text
            yield Fuzz(run, client, r.json()["id"], tuple(where))


def encode(body: object) -> bytes:
    """JSON, with each ``RAW`` string replaced by the JSON text it carries."""
    return re.sub(r'"\\u0000raw:([^"]*)"', r"\1", json.dumps(body)).encode()


def concrete(route: str, fz: Fuzz) -> str:
    return route.replace("{session_id}", fz.session).replace("{response_id}", "resp_fuzz")


def poison(
    route: str, body: dict[str, Any], field: str | None = None
) -> tuple[dict[str, Any], Headers]:
    """``body`` and headers that make it refused after everything else ``route`` checks;
    ``field`` is the one being fuzzed, which the poison leaves alone."""
    if route == RESPONSES:  # its tenant is read early: poison the decode parameters instead
        name, bad = (
            ("temperature", -1) if field == "max_output_tokens" else ("max_output_tokens", 0)
        )
        return {**body, name: bad}, ()
    return body, (() if route == EMBEDDINGS else (BAD_TENANT,))  # no embedder here: a 400


def body_probe(kind: str, route: str, body: dict[str, Any], field: str | None = None) -> Probe:
    full, headers = poison(route, body, field)
    ok = frozenset({501}) if route == EMBEDDINGS else frozenset()  # 501 missing_extra
    return Probe(kind, route, "POST", route, encode(full), headers, ok=ok)


def mutated(route: str, field: str, value: object, kind: str) -> Probe:
    return body_probe(kind, route, {**BASES[route], field: value}, field)


def send(fz: Fuzz, p: Probe) -> httpx.Response:
    headers: list[tuple[str, str | bytes]] = [AUTH] if p.auth else []
    if p.json_type and p.body is not None:
        headers.append(("content-type", "application/json"))
    headers += p.headers
    content: bytes | Iterator[bytes] | None = p.body
    if p.chunk and p.body is not None:
        body, n = p.body, p.chunk
        content = iter([body[i : i + n] for i in range(0, len(body), n)])
    raw = [(k.encode(), v if isinstance(v, bytes) else v.encode()) for k, v in headers]
    return fz.client.request(p.method, concrete(p.path, fz), content=content, headers=raw)


def fire(fz: Fuzz, p: Probe) -> None:
    """Send ``p`` and check its answer; then the server must still answer ``/health``."""
    r = send(fz, p)  # an httpx error (a reset, a timeout) fails the test
    SEEN.append((p.route, p.kind, r.status_code))
    where = f"{p.method} {p.path[:120]} {(p.body or b'')[:160]!r} {p.headers!r:.200}"
    assert 400 <= r.status_code < 500 or r.status_code in p.ok, f"{where}: {r.status_code} {r.text}"
    if p.method != "HEAD" and r.status_code >= 400:
        assert r.headers["content-type"].startswith("application/json"), (where, r.headers)
        body = r.json()
        assert isinstance(body, dict) and set(body) == {"error"}, (where, body)
        err = body["error"]
        assert isinstance(err["message"], str) and err["message"], (where, err)
        assert isinstance(err["type"], str) and err["type"], (where, err)
        assert isinstance(err["code"], str) and err["code"], (where, err)
        assert "param" in err and (err["param"] is None or isinstance(err["param"], str)), err
        if r.status_code == 501:
            assert p.route == EMBEDDINGS and err["code"] == "missing_extra", (where, err)
        for secret in fz.secrets:
            assert secret not in r.text, (where, secret, r.text)
    health = fz.client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", (where, health.text)


# -- bodies -----------------------------------------------------------------------------------
@pytest.mark.parametrize("route", list(SCHEMAS))
def test_every_field_refuses_objects_strings_and_nulls(fz: Fuzz, route: str) -> None:
    """Every field of every request schema, set to an object, a string and a null."""
    for field in sorted(SCHEMAS[route].model_fields):
        for value in ({"$": [1, None]}, "5", None):
            fire(fz, mutated(route, field, value, "wrong-type"))


@settings(FUZZ, max_examples=60)
@given(case=st.sampled_from(NUMERIC), value=odd_numbers)
def test_huge_negative_and_non_finite_numbers(
    fz: Fuzz, case: tuple[str, str], value: object
) -> None:
    route, field = case
    fire(fz, mutated(route, field, value, "odd-number"))


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
@settings(FUZZ, max_examples=40)
@given(route=st.sampled_from(list(SCHEMAS)), data=st.data())
def test_any_json_value_in_any_field(fz: Fuzz, route: str, data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(SCHEMAS[route].model_fields)))
    fire(fz, mutated(route, field, data.draw(json_values), "random-value"))


@settings(FUZZ, max_examples=30)
@given(
    route=st.sampled_from(list(SCHEMAS)),
    extra=st.dictionaries(st.text(min_size=1, max_size=10), json_values, min_size=1, max_size=4),
)
def test_unknown_fields(fz: Fuzz, route: str, extra: dict[str, Any]) -> None:
    known = set(SCHEMAS[route].model_fields)
    unknown = {k: v for k, v in extra.items() if k not in known}
    fire(fz, body_probe("unknown-field", route, {**BASES[route], **unknown}))


def broken(body: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    """Bodies that are not a JSON object, or not valid UTF-8, made from a poisoned ``body``."""
    fixed = [
        b"",
        b"NaN",
        b"Infinity",
        b"null",
        b'"x"',
        b"[]",
        b"{",
        b"}",
        b'{"a":1,}',
        b"{'model': 'continuum'}",
        b"\xef\xbb\xbf{",
        body.decode().encode("utf-16")[:-3],
        b"[" * 200 + b"]" * 200,
        b'{"model": 1, "model": "continuum"}' + b" " * 5,
    ]
    return st.one_of(
        st.integers(0, len(body) - 1).map(lambda n: ("truncated-json", body[:n])),
        st.binary(max_size=48).map(lambda b: ("random-bytes", b)),
        json_values.filter(lambda v: not isinstance(v, dict)).map(
            lambda v: ("not-object", encode(v))
        ),
        st.tuples(st.integers(0, len(body)), st.sampled_from(BAD_UTF8)).map(
            lambda t: ("bad-utf8", body[: t[0]] + t[1] + body[t[0] :])
        ),
        st.sampled_from(fixed).map(lambda b: ("bad-json", b)),
    )


@settings(FUZZ, max_examples=80)
@given(route=st.sampled_from(list(SCHEMAS)), data=st.data())
def test_broken_json_bodies(fz: Fuzz, route: str, data: st.DataObject) -> None:
    probe = body_probe("", route, BASES[route])
    kind, body = data.draw(broken(probe.body or b""))
    fire(fz, replace(probe, kind=kind, body=body))


def test_oversize_bodies_declared_and_chunked(fz: Fuzz) -> None:
    """Over ``max_body_bytes`` with a Content-Length (the guard) and chunked (read as it
    arrives); the ``/input`` body is text on the real session, which keeps nothing of it."""
    before = fz.client.get(concrete(SESSION, fz), headers=[AUTH]).json()
    for route in SCHEMAS:
        pad = "x" * (LIMIT + 1024)
        probe = body_probe("", route, {**BASES[route], "pad": pad})
        for chunk in (0, 8192):
            kind = f"oversize-{'chunked' if chunk else 'declared'}"
            fire(fz, replace(probe, kind=kind, chunk=chunk))
        exact = b"[" + b" " * (LIMIT - 2) + b"}"  # at the limit exactly: read, and not JSON
        fire(fz, replace(probe, kind="at-limit", body=exact))
    text = ("y " * (LIMIT // 2 + 2048)).encode()
    for chunk in (0, 8192, 60000):
        kind = f"oversize-{'chunked' if chunk else 'declared'}"
        fire(
            fz,
            Probe(kind, INPUT, "POST", INPUT + "?max_tokens=1", text, json_type=False, chunk=chunk),
        )
    assert fz.client.get(concrete(SESSION, fz), headers=[AUTH]).json() == before


# -- the raw-text route ----------------------------------------------------------------------
def test_input_refuses_bad_utf8_and_bad_query_strings_and_commits_nothing(fz: Fuzz) -> None:
    before = fz.client.get(concrete(SESSION, fz), headers=[AUTH]).json()
    for bad in [*BAD_UTF8, b"\xed\xa0\x80", b"caf\xc3", b"ok so far " * 20 + b"\xff tail"]:
        for chunk in (0, 7):
            fire(
                fz,
                Probe(
                    "bad-utf8",
                    INPUT,
                    "POST",
                    INPUT + "?max_tokens=1",
                    bad,
                    json_type=False,
                    chunk=chunk,
                ),
            )
    queries = [
        "max_tokens=0",
        "max_tokens=-1",
        "max_tokens=abc",
        "max_tokens=1e309",
        "max_tokens=1.5",
        "temperature=-1",
        "temperature=nan",
        "top_p=0",
        "top_p=2",
        "top_k=-1",
        "stream=maybe",
        "n=2",
        "logprobs=true",
        "best_of=3",
        "seed=x",
        "role=robot",
        "role=assistant",
        "rle=user",
        "max_tokens=1&max_tokens=x",
        "stop=" + "s" * 300,
        "stream_options=x",
        "logit_bias=%7B%7D%7B",
        "%FF=1",
        "max_tokens=%ED%A0%80",
        "name=a&name=b&bogus=",
    ]
    for q in queries:
        for ctype in ("text/plain", "application/octet-stream"):
            fire(
                fz,
                Probe(
                    "bad-query",
                    INPUT,
                    "POST",
                    f"{INPUT}?{q}",
                    b"hello",
                    json_type=False,
                    headers=(("content-type", ctype),),
                ),
            )
    assert fz.client.get(concrete(SESSION, fz), headers=[AUTH]).json() == before


query_values = st.sampled_from(ODD) | st.text(max_size=12) | st.sampled_from(["true", "", "[]"])


@settings(FUZZ, max_examples=30)
@given(
    query=st.dictionaries(
        st.sampled_from([*InputParams.model_fields, "bogus", "rle", ""]),
        query_values,
        min_size=1,
        max_size=3,
    )
)
def test_input_query_strings_on_an_unknown_session(fz: Fuzz, query: dict[str, str]) -> None:
    """Any query string: refused as a bad parameter (400) or, on this unknown id, 404."""
    path = f"/v1/sessions/no-such-session/input?{urlencode(query)}"
    fire(fz, Probe("random-query", INPUT, "POST", path, b"hello", json_type=False))


# -- ids -------------------------------------------------------------------------------------
ID_ROUTES = [("GET", SESSION), ("DELETE", SESSION), ("POST", MESSAGES), ("POST", INPUT),
             ("GET", RESPONSE), ("DELETE", RESPONSE)]  # fmt: skip
ids = st.one_of(
    st.sampled_from(TRICKY_IDS).map(lambda s: ("traversal-id", s)),
    st.text(min_size=1, max_size=60).map(lambda s: ("unicode-id", quote(s, safe=""))),
    st.integers(300, 6000).map(lambda n: ("long-id", "i" * n)),
)


@settings(FUZZ, max_examples=80)
@given(route=st.sampled_from(ID_ROUTES), id_=ids)
def test_unknown_and_traversal_looking_ids(
    fz: Fuzz, route: tuple[str, str], id_: tuple[str, str]
) -> None:
    (method, template), (kind, sid) = route, id_
    path = template.replace("{session_id}", sid).replace("{response_id}", sid)
    body, json_type = None, True
    if template == MESSAGES:
        body = encode({"messages": MSG, "max_tokens": 1})
    elif template == INPUT:
        body, json_type, path = b"hello", False, path + "?max_tokens=1"
    fire(fz, Probe(kind, template, method, path, body, json_type=json_type))


def test_the_session_header_with_unknown_and_odd_ids(fz: Fuzz) -> None:
    body = encode(BASES[CHAT])
    for sid in ("../../etc/passwd", "%00", "x" * 5000, "caf\xe9".encode("latin-1"), "*", "-"):
        fire(fz, Probe("session-header", CHAT, "POST", CHAT, body, (("x-continuum-session", sid),)))


def test_lone_surrogates_in_text_the_server_checks(fz: Fuzz) -> None:
    """A JSON ``\\ud800`` escape, or its raw CESU-8 bytes, in a message or the model name: no
    poison, since a lone surrogate is never valid text."""
    bad = [
        (CHAT, "messages", [{"role": "user", "content": "a\ud800"}]),
        (CHAT, "messages", [{"role": "user", "content": "hi", "name": "\udfff"}]),
        (CHAT, "model", "\ud800"),
        (MESSAGES, "messages", [{"role": "user", "content": "\ud800"}]),
        (RESPONSES, "input", "x\udbff"),
        (RESPONSES, "instructions", "\ud800"),
        (RESPONSES, "truncation", "\ud800"),
        (COMPACT, "input", "\ud800"),
        (COMPACT, "instructions", "\udc00"),
    ]
    for route, field, value in bad:
        body = encode({**BASES[route], field: value})
        fire(fz, Probe("surrogate-escape", route, "POST", route, body))
        if b"\\ud800" in body:  # the same as raw bytes: json.loads lets them through as one
            raw = body.replace(b"\\ud800", b"\xed\xa0\x80")
            fire(fz, Probe("surrogate-bytes", route, "POST", route, raw))


def test_what_the_first_corpus_found(fz: Fuzz) -> None:
    """Requests that were 5xx or resets before: JSON nested past the parser's recursion limit,
    lone surrogates in fields that are hashed, tokenised or stored, a negative seed (sampled,
    streamed or not), and a path with a trailing slash (was a 307 with no body)."""
    deep = b"[" * 1000 + b"]" * 1000
    for route in (CHAT, COMPLETIONS, SESSIONS, RESPONSES):
        fire(fz, Probe("deep-json", route, "POST", route, deep))
        nested = encode({**BASES[route], "x": "\x00raw:" + "[" * 3000 + "]" * 3000})
        fire(fz, Probe("deep-json", route, "POST", route, nested))
    bad = [
        (COMPLETIONS, "prompt", "a\ud800"),
        (CHAT, "stop", ["\ud800"]),
        (CHAT, "user", "\ud800"),
        (CHAT, "prompt_cache_key", "\udc00"),
        (RESPONSES, "previous_response_id", "resp_\ud800"),
        (RESPONSES, "metadata", {"k": "\ud800"}),
        (SESSIONS, "session_id", "\ud800"),
        (SESSIONS, "system", "\ud800"),
        (SESSIONS, "continuity", "\ud800"),
        (MESSAGES, "stop", ["\udfff"]),
    ]
    for route, field, value in bad:
        body = encode({**BASES[route], field: value})
        fire(fz, Probe("surrogate-hashed", route, "POST", route, body))
    for route in (CHAT, COMPLETIONS, MESSAGES):
        for extra in ({"seed": -1}, {"seed": -1, "stream": True}, {"seed": -5, "temperature": 1}):
            fire(
                fz, Probe("negative-seed", route, "POST", route, encode({**BASES[route], **extra}))
            )
    fire(
        fz,
        Probe(
            "negative-seed", INPUT, "POST", INPUT + "?max_tokens=1&seed=-1", b"hi", json_type=False
        ),
    )
    for method, path in (("GET", "/v1/models/"), ("POST", CHAT + "/")):
        body = encode(BASES[CHAT]) if method == "POST" else None
        fire(
            fz,
            Probe("trailing-slash", CHAT if method == "POST" else "/v1/models", method, path, body),
        )


# -- headers and methods ---------------------------------------------------------------------
def plain(route: str) -> tuple[str, str, bytes | None]:
    """A well-formed request to ``route`` (method, path, body): only a header refuses it."""
    method = next(m for m, r in sorted(ROUTES) if r == route)
    path = route + ("?max_tokens=1" if route == INPUT else "")
    body = b"hi" if route == INPUT else encode(BASES[route]) if route in BASES else None
    return method, path, body


def test_missing_wrong_and_odd_api_keys(fz: Fuzz) -> None:
    keys: list[tuple[tuple[str, str | bytes], ...]] = [
        (),
        (("authorization", "Bearer wrong-0123456789abcdef"),),
        (("authorization", KEY),),
        (("authorization", f"Basic {KEY}"),),
        (("authorization", "Bearer"),),
        (("authorization", "Bearer " + "k" * 8000),),
        (("authorization", b"Bearer \xff\xfe"),),
        (("authorization", "Bearer wrong"), ("authorization", f"Bearer {KEY}")),
        (("authorization", f"Bearer {KEY}x"),),
        (("authorization", f"Token {KEY}"),),
    ]
    for i, (method, route) in enumerate(sorted(ROUTES - {("GET", "/health")})):
        _, path, body = plain(route)
        for headers in [*keys[i % 3 :: 3], ()]:
            fire(
                fz,
                Probe(
                    "api-key",
                    route,
                    method,
                    path,
                    body,
                    headers,
                    auth=False,
                    json_type=route != INPUT,
                ),
            )


def test_hosts_and_origins_from_elsewhere(fz: Fuzz) -> None:
    hosts = [
        "evil.example",
        "",
        "127.0.0.1.evil.example",
        "[::1",
        "localhost:1:2",
        "h" * 4000,
        "localhost.",
        "0x7f000001",
    ]
    origins = [
        "http://evil.example",
        "null",
        "http://127.0.0.1.evil.example",
        "file://",
        "http://127.0.0.1:1",
        "o" * 4000,
        "https://localhost",
    ]
    for i, (method, route) in enumerate(sorted(ROUTES)):
        _, path, body = plain(route)
        for host in hosts[i % 4 :: 4]:
            fire(
                fz,
                Probe(
                    "host", route, method, path, body, (("host", host),), json_type=route != INPUT
                ),
            )
        for origin in origins[i % 3 :: 3]:
            fire(
                fz,
                Probe(
                    "origin",
                    route,
                    method,
                    path,
                    body,
                    (("origin", origin),),
                    json_type=route != INPUT,
                ),
            )


def test_bad_tenant_headers(fz: Fuzz) -> None:
    tenants: list[str | bytes] = [
        "../x",
        "a" * 500,
        "a/b",
        "caf\xe9".encode("latin-1"),
        "%2e%2e%2f",
        "x y",
        "*",
        "..\\..\\x",
        "t" * 8000,
        "a:b",
    ]
    for i, route in enumerate(TENANT_ROUTES):
        method, path, body = plain(route)
        for tenant in tenants[i % 3 :: 3]:
            fire(
                fz,
                Probe(
                    "tenant",
                    route,
                    method,
                    path,
                    body,
                    (("x-continuum-tenant", tenant),),
                    json_type=route != INPUT,
                ),
            )
    for tenant in ("..", ".", "other"):  # valid names of another namespace: not its session
        for method in ("GET", "DELETE"):
            fire(
                fz,
                Probe("tenant", SESSION, method, SESSION, None, (("x-continuum-tenant", tenant),)),
            )


def test_wrong_content_types(fz: Fuzz) -> None:
    kinds = [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
        "json",
        "application/json-seq",
        "*/*",
        "application/ json",
    ]
    for i, route in enumerate(SCHEMAS):
        body = encode(BASES[route])
        fire(fz, Probe("content-type", route, "POST", route, body, json_type=False))
        for kind in kinds[i % 2 :: 2]:
            fire(
                fz,
                Probe(
                    "content-type",
                    route,
                    "POST",
                    route,
                    body,
                    (("content-type", kind),),
                    json_type=False,
                ),
            )


def test_wrong_methods_on_every_path(fz: Fuzz) -> None:
    methods = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE")
    for path in sorted({r for _, r in ROUTES}):
        served = {m for m, r in ROUTES if r == path}
        for method in methods:
            if method in served:
                continue
            body = b"{}" if method in ("POST", "PUT", "PATCH") else None
            fire(fz, Probe("wrong-method", path, method, path, body))


def test_odd_but_valid_requests_are_served(fz: Fuzz) -> None:
    """Not the corpus: odd requests a server may take (2xx) or refuse (4xx), never a 5xx; any
    that runs the model decodes at most two tokens."""
    ok = frozenset({200, 201})
    odd = {
        "model": "continuum",
        "temperature": 1e308,
        "seed": 2**70,
        "top_k": 2**70,
        "max_tokens": 1,
        "x-unknown": {"deep": [None]},
        "stream_options": {"a": 1},
    }
    probes = [
        Probe("odd-valid", "/health", "GET", "/health", auth=False),
        Probe(
            "odd-valid",
            "/health",
            "GET",
            "/health",
            auth=False,
            headers=(("authorization", "Basic nope"),),
        ),
        Probe("odd-valid", "/v1/models", "GET", "/v1/models?limit=-1&after=%FF&order=%00"),
        Probe("odd-valid", "/v1/models", "GET", "/v1/models", headers=(("host", "LOCALHOST:1"),)),
        Probe("odd-valid", "/metrics", "GET", "/metrics", headers=(("accept", "*/*; q=NaN"),)),
        Probe("odd-valid", CHAT, "POST", CHAT, encode({**odd, "messages": MSG})),
        Probe(
            "odd-valid",
            COMPLETIONS,
            "POST",
            COMPLETIONS,
            encode(
                {**BASES[COMPLETIONS], "stream": True, "stream_options": {"include_usage": "x"}}
            ),
        ),
        Probe(
            "odd-valid",
            RESPONSES,
            "POST",
            RESPONSES,
            encode({**BASES[RESPONSES], "input": "\u202e\u0000\U0001f4a9 hi", "metadata": {}}),
        ),
    ]
    for p in probes:
        fire(fz, Probe(p.kind, p.route, p.method, p.path, p.body, p.headers, p.auth, ok=ok))


def test_the_corpus_covers_every_route_and_was_refused(fz: Fuzz) -> None:
    """Sums up the tests above (run it with them): at least 300 requests, over every route."""
    corpus = [(route, kind, status) for route, kind, status in SEEN if kind != "odd-valid"]
    statuses = Counter(status for _, _, status in corpus)
    kinds = Counter(kind for _, kind, _ in corpus)
    print(f"\nfuzz corpus: {len(corpus)} requests; statuses {dict(sorted(statuses.items()))}")
    print(f"kinds: {dict(sorted(kinds.items()))}")
    for route in sorted({r for _, r in ROUTES}):
        print(f"  {route}: {dict(Counter(k for r, k, _ in corpus if r == route))}")
    assert len(corpus) >= 300
    assert {r for _, r in ROUTES} <= {route for route, _, _ in corpus}
    assert all(400 <= s < 500 or s == 501 for s in statuses)
    after = fz.client.get(concrete(SESSION, fz), headers=[AUTH]).json()
    assert after["turns"] == [] and [m["role"] for m in after["history"]] == ["system"]
