"""Prefill on arrival (``feed``/``commit``) and eager glue, on the real models: the model sees
exactly the tokens a whole-message append shows it, and answers the same."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from continuum import (
    GenerationParams,
    InvalidRequest,
    ModelFile,
    SessionClosed,
    Worker,
)
from continuum.server.routes.sessions import Coalescer
from continuum.stateful.session import ChatSession
from tests.conftest import WorkerFactory, model
from tests.server.test_app import Running, _serve

P = GenerationParams(max_tokens=12)
SYSTEM = "You are a concise assistant."
FIRST = "Hi there, who are you?"
TEXTS = [
    "Please summarise the plot of Hamlet in two sentences, without spoilers if possible.",
    "naïve café owners in Zürich sell crème brûlée for €20 — 中文也可以吗？ 🙂 ok",
    "Compute 3.14159 * 2,000,000 and then 1e-3 + 0.5; is 42 > 41.99?",
    "What does <end_of_turn> mean, and why does <start_of_turn>user appear in logs?",
]


def chunkings(text: str, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        pieces.append(text[i : i + n])
        i += n
    return {"chars": list(text), "random": pieces, "whole": [text]}


def primed(w: Worker) -> ChatSession:
    s = w.create_session(SYSTEM)
    s.append([{"role": "user", "content": FIRST}], P)
    assert w.settle()
    return s


SLOW = pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(TEXTS[0], id="words"),
        pytest.param(TEXTS[1], id="utf8", marks=SLOW),
        pytest.param(TEXTS[2], id="numbers", marks=SLOW),
        pytest.param(TEXTS[3], id="special", marks=SLOW),
    ],
)
def test_fed_prompt_and_reply_equal_a_whole_message_append(
    gemma: ModelFile, make_worker: WorkerFactory, text: str
) -> None:
    w = make_worker(gemma, eager_glue=True)
    _compare_chunkings(w, text)


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_feeding_without_eager_glue_also_equals_an_append(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    _compare_chunkings(make_worker(gemma), TEXTS[0])  # the close decoded with the first batch


def _compare_chunkings(w: Worker, text: str) -> None:
    ref = primed(w)
    expected = ref.append([{"role": "user", "content": text}], P)
    expected_tokens = list(w.seq.tokens)
    for name, pieces in chunkings(text, seed=len(text)).items():
        s = primed(w)
        decoded = 0
        for piece in pieces:
            decoded = s.feed(piece)
        assert s.arriving == text
        r = s.commit(P)
        assert list(w.seq.tokens) == expected_tokens, name  # token-identical prompt + reply
        assert r.tokens == expected.tokens and r.text == expected.text, name
        m = r.metrics
        assert m.fed_tokens <= decoded  # some fed tokens may be re-decoded in the last batch
        if name == "chars":  # most of the message was decoded before the end of input
            assert m.fed_tokens > 0
            assert m.prompt_tokens_evaluated < expected.metrics.prompt_tokens_evaluated
        assert s.history[-2] == {"role": "user", "content": text}
        assert s.arriving is None


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_speculative_finish_makes_the_first_token_immediate(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, eager_glue=True)
    text = TEXTS[0]
    want = primed(w).append([{"role": "user", "content": text}], P)
    s = primed(w)
    s.feed(text)
    time.sleep(0.3)  # quiet input: the idle runner decodes the end of the turn ahead
    assert w.settle()
    r = s.commit(P)
    assert r.tokens == want.tokens
    assert r.metrics.prompt_tokens_evaluated == 0  # nothing left to decode after the input
    # more text after a speculative finish truncates it; the answer is still the append's
    t = primed(w)
    t.feed(text[:40])
    time.sleep(0.3)
    assert w.settle()
    t.feed(text[40:])
    assert t.commit(P).tokens == want.tokens
    # with speculation off the same input decodes its end after commit
    off = make_worker(
        gemma, store=w.store.path.parent / "off.db", eager_glue=True, speculate_after_ms=None
    )
    u = primed(off)
    u.feed(text)
    time.sleep(0.1)
    r_off = u.commit(P)
    assert r_off.tokens == want.tokens and r_off.metrics.prompt_tokens_evaluated >= 8


def test_eager_glue_is_decoded_while_idle_and_used_by_the_next_turn(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    eager = make_worker(gemma, eager_glue=True)
    lazy = make_worker(gemma, store=eager.store.path.parent / "lazy.db", eager_glue=False)
    results = []
    for w in (eager, lazy):
        s = w.create_session(SYSTEM)
        s.append([{"role": "user", "content": FIRST}], P)
        before = len(w.seq.tokens)
        assert w.settle()
        glue = len(w.seq.tokens) - before
        r = s.append([{"role": "user", "content": "And what can you do?"}], P)
        results.append((glue, r))
    (glue, r_eager), (no_glue, r_lazy) = results
    assert glue > 0 and no_glue == 0  # "<end_of_turn>\n<start_of_turn>user\n" went in early
    assert r_eager.metrics.eager_tokens_used == glue
    assert r_eager.metrics.prompt_tokens_evaluated == r_lazy.metrics.prompt_tokens_evaluated - glue
    assert r_lazy.metrics.eager_tokens_used == 0


def test_glue_not_decoded_at_idle_is_decoded_by_the_next_turn(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    idle = make_worker(gemma, eager_glue=True)
    late = make_worker(
        gemma, store=idle.store.path.parent / "late.db", eager_glue=True, idle_glue=False
    )
    replies = []
    for w in (idle, late):
        s = primed(w)
        r = s.append([{"role": "user", "content": "And what can you do?"}], P)
        replies.append(r)
    # the glue is its own batch either way, so the answer does not depend on timing
    assert replies[0].tokens == replies[1].tokens
    assert replies[1].metrics.eager_tokens_used == replies[0].metrics.eager_tokens_used > 0


def test_a_tool_result_replaces_the_eager_user_header(make_worker: WorkerFactory) -> None:
    smol = model("smollm2-135m")  # ChatML: the header names the role, so "user" != "tool"
    w = make_worker(smol, eager_glue=True)
    s = w.create_session(SYSTEM)
    s.append([{"role": "user", "content": "Look up the weather in Lisbon."}], P)
    assert w.settle()
    glued = list(w.seq.tokens)
    r = s.append([{"role": "tool", "content": '{"city": "Lisbon", "temp_c": 21}'}], P)
    m = r.metrics
    assert m.eager_tokens_discarded > 0 and m.eager_tokens_used > 0  # the close was kept
    # the prompt the model saw is exactly the template's rendering of the history
    fmt = w.backend.chat_format
    text = fmt.render(s.history[:-1], add_generation_prompt=True)
    want = w.backend.tokenize(text)
    assert w.seq.tokens[: len(want)] == want
    assert glued[: m.tokens_reused] == want[: m.tokens_reused]
    # a tool result fed in pieces works the same way
    cold = make_worker(smol, store=w.store.path.parent / "cold.db", eager_glue=True)
    twin = cold.create_session(SYSTEM)
    twin.append([{"role": "user", "content": "Look up the weather in Lisbon."}], P)
    assert cold.settle()
    for piece in ['{"city": ', '"Lisbon", "te', 'mp_c": 21}']:
        twin.feed(piece, role="tool")
    fed = twin.commit(P)
    assert fed.tokens == r.tokens and twin.history == s.history


def test_abandoned_input_leaves_nothing_behind(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, eager_glue=True)
    s = primed(w)
    resident = list(w.seq.tokens)
    turns = len(w.store.turns(s.id))
    for ch in "This message is never finished because the user walked away":
        s.feed(ch)
    assert len(w.seq.tokens) > len(resident)
    assert s.abandon() > 0
    assert list(w.seq.tokens) == resident and s.arriving is None
    assert len(w.store.turns(s.id)) == turns and len(s.history) == 3
    ref = primed(w)
    want = ref.append([{"role": "user", "content": "Bye!"}], P)
    got = s.append([{"role": "user", "content": "Bye!"}], P)
    assert got.tokens == want.tokens
    # a whole-message turn while a message is arriving replaces it
    s.feed("half a thought")
    s.append([{"role": "user", "content": "Never mind."}], P)
    assert s.arriving is None and s.history[-2]["content"] == "Never mind."


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_concurrent_feeds_on_two_sessions(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    w = make_worker(gemma, eager_glue=True)
    texts = {"a": TEXTS[0], "b": TEXTS[2]}
    want = {}
    for k, text in texts.items():
        ref = primed(w)
        want[k] = ref.append([{"role": "user", "content": text}], P).tokens
    sessions = {k: primed(w) for k in texts}
    errors: list[BaseException] = []

    def run(k: str) -> None:
        try:
            for ch in texts[k]:
                while True:
                    try:
                        sessions[k].feed(ch)
                        break
                    except Exception as e:  # pragma: no cover - reported below
                        errors.append(e)
                        return
                time.sleep(0)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in texts:
        assert sessions[k].commit(P).tokens == want[k]
    assert w.swaps > 4  # the two sessions really took turns on the one context


def test_feed_bad_input(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    w = make_worker(gemma, eager_glue=True)
    s = primed(w)
    with pytest.raises(InvalidRequest, match="takes text"):
        s.feed(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="role"):
        s.feed("hi", role="assistant")
    with pytest.raises(InvalidRequest, match="nothing to commit"):
        s.commit(P)
    s.feed("hello", role="user")
    with pytest.raises(InvalidRequest, match="already arriving"):
        s.feed("{}", role="tool")
    assert s.arriving == "hello"
    s.close()
    with pytest.raises(SessionClosed):
        s.feed(" more")


# -- over HTTP -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    # no eager glue: an idle session's glue decoded in the same step as another session's
    # turn changes that step's batch split (lanes are decoded together), so the fed reply
    # would equal the reference only up to a near-tie, depending on timing (seen under load)
    yield from _serve(tmp_path_factory.mktemp("prefill"), max_queue=8, eager_glue=False)


def _session(srv: Running, tenant: str = "default") -> str:
    with srv.http(headers={"X-Continuum-Tenant": tenant}) as h:
        sid: str = h.post("/v1/sessions", json={"system": SYSTEM}).json()["id"]
        h.post(
            f"/v1/sessions/{sid}/messages",
            json={
                "messages": [{"role": "user", "content": FIRST}],
                "max_tokens": 12,
                "temperature": 0,
            },
        )
    return sid


def test_input_stream_over_http(srv: Running) -> None:
    text = TEXTS[1]
    # the reference runs in another tenant: the same greedy turn in this one would be a memo
    # hit, and this test is about the tokens fed as the body arrived
    ref, sid = _session(srv, "reference"), _session(srv)
    with srv.http(headers={"X-Continuum-Tenant": "reference"}) as h:
        want = h.post(
            f"/v1/sessions/{ref}/messages",
            json={
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 12,
                "temperature": 0,
            },
        ).json()
    with srv.http() as h:

        def body() -> Iterator[bytes]:
            data = text.encode()
            for i in range(0, len(data), 5):  # splits inside multi-byte characters
                yield data[i : i + 5]
                time.sleep(0.01)

        with h.stream(
            "POST",
            f"/v1/sessions/{sid}/input",
            params={"max_tokens": 12, "temperature": 0, "stream": "true"},
            content=body(),
        ) as r:
            assert r.status_code == 200
            pieces = [ln for ln in r.iter_lines() if ln.startswith("data: {")]
        got = h.get(f"/v1/sessions/{sid}").json()
    streamed = "".join(
        (__import__("json").loads(p[6:])["choices"] or [{}])[0].get("delta", {}).get("content")
        or ""
        for p in pieces
    )
    assert streamed == want["choices"][0]["message"]["content"]
    assert got["history"][-2] == {"role": "user", "content": text}
    assert got["turns"][-1]["metrics"]["fed_tokens"] > 0


def test_input_stream_bad_input_and_disconnect(srv: Running, tmp_path: Path) -> None:
    sid = _session(srv)
    with srv.http() as h:
        bad = h.post(f"/v1/sessions/{sid}/input", content=b"caf\xe9 is not utf-8")
        assert bad.status_code == 400 and "UTF-8" in bad.json()["error"]["message"]
        assert h.post("/v1/sessions/nope/input", content=b"hi").status_code == 404
        role = h.post(f"/v1/sessions/{sid}/input", params={"role": "assistant"}, content=b"x")
        assert role.status_code == 400
        turns = len(h.get(f"/v1/sessions/{sid}").json()["turns"])

    def dropped() -> Iterator[bytes]:
        yield b"This message is cut off by a client that"
        raise RuntimeError("client gone")

    with pytest.raises((httpx.HTTPError, RuntimeError)), srv.http() as h:
        h.post(f"/v1/sessions/{sid}/input", content=dropped())
    deadline = time.time() + 10
    with srv.http() as h:
        while time.time() < deadline:  # the server notices the disconnect asynchronously
            state = h.get(f"/v1/sessions/{sid}").json()
            if len(state["turns"]) == turns:
                break
        assert len(state["turns"]) == turns
        ok = h.post(
            f"/v1/sessions/{sid}/messages",
            json={"messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 4},
        )
        assert ok.status_code == 200
        assert h.get(f"/v1/sessions/{sid}").json()["history"][-2]["content"] == "Still there?"


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_fed_message_longer_than_the_context_is_a_typed_error(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    from continuum import ContextOverflow

    w = make_worker(gemma, n_ctx=512)
    s = primed(w)
    resident = list(w.seq.tokens)
    with pytest.raises(ContextOverflow, match="raise n_ctx"):
        for _ in range(200):
            s.feed("a long stream of words that never ends ")
    s.abandon()
    assert list(w.seq.tokens) == resident and s.arriving is None
    assert s.append([{"role": "user", "content": "Short now."}], P).text is not None


def test_input_stream_over_the_body_limit_is_413(tmp_path: Path) -> None:
    for running in _serve(tmp_path, max_body_bytes=2000):
        sid = _session(running)
        with running.http() as h:

            def big() -> Iterator[bytes]:
                for _ in range(10):
                    yield b"x" * 300

            r = h.post(f"/v1/sessions/{sid}/input", content=big())
            assert r.status_code == 413 and "2000 bytes" in r.json()["error"]["message"]
            assert len(h.get(f"/v1/sessions/{sid}").json()["turns"]) == 1  # nothing committed


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "prefill", "--sizes", "ten"],
        ["bench", "restore", "--sizes", "1"],
        ["bench", "overhead", "--sizes", ""],
        ["bench", "http", "--modes", "carrier-pigeon"],
        ["bench", "http", "--modes", "llama-server"],
    ],
)
def test_new_bench_commands_refuse_bad_arguments(args: list[str]) -> None:
    from click.testing import CliRunner

    from continuum.cli.main import main

    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and ("sizes" in r.output or "mode" in r.output), r.output


def test_a_failed_commit_ends_the_message(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    """A commit that fails (here its reader goes away mid-reply) leaves nothing arriving: the
    next message starts on its own instead of being glued onto the failed one."""
    w = make_worker(gemma, n_ctx=1024)
    s = primed(w)
    resident, turns = list(w.seq.tokens), s.turns
    s.feed("This message's reply is never read, ")

    def gone(text: str) -> None:
        raise ConnectionError("the reader went away")

    with pytest.raises(ConnectionError):
        s.commit(P, on_text=gone)
    assert s.arriving is None and s.turns == turns
    assert list(w.seq.tokens)[: len(resident)] == resident
    s.feed("Second message.")
    s.commit(P)
    assert s.history[-2] == {"role": "user", "content": "Second message."}


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_a_body_sent_a_byte_at_a_time_is_fed_in_few_pieces(
    srv: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each feed re-tokenises the message's tail: one per byte would make a long body pin the
    model thread for minutes (quadratic), so the server coalesces what arrives."""
    fed: list[int] = []
    real = ChatSession.feed

    def counting(self: ChatSession, chunk: str, **kw: Any) -> int:
        fed.append(len(chunk))
        return real(self, chunk, **kw)

    monkeypatch.setattr(ChatSession, "feed", counting)
    sid = _session(srv)
    text = " ".join(f"item {i} is on the list" for i in range(120))  # ~3 KB
    with srv.http() as h:
        t0 = time.monotonic()
        r = h.post(
            f"/v1/sessions/{sid}/input",
            params={"max_tokens": 2, "temperature": 0},
            content=(bytes([b]) for b in text.encode()),
        )
        sent_s = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert h.get(f"/v1/sessions/{sid}").json()["history"][-2]["content"] == text
    # the pieces that grow (about 30 for 3 KB), plus at most one per quiet interval
    assert sum(fed) == len(text) and len(fed) <= 40 + sent_s / Coalescer.QUIET_S, len(fed)
    assert len(fed) < len(text) / 10


@pytest.mark.slow
def test_input_refused_by_a_full_queue_leaves_nothing_behind(tmp_path: Path) -> None:
    """A feed refused with 429 drops what had arrived, although the queue is still full: the
    drop is a cleanup job, never refused."""
    for running in _serve(tmp_path, max_queue=1):
        sid = _session(running)
        _feed_until_the_queue_is_full(running, sid)
        with running.http() as h:
            r = h.post(f"/v1/sessions/{sid}/input", params={"max_tokens": 2}, content=b"Again.")
            assert r.status_code == 200, r.text
            history = h.get(f"/v1/sessions/{sid}").json()["history"]
        assert history[-2] == {"role": "user", "content": "Again."}


def _feed_until_the_queue_is_full(running: Running, sid: str) -> None:
    release, started = threading.Event(), threading.Semaphore(0)
    jobs = []

    def block() -> None:
        started.release()
        release.wait(60)

    def body() -> Iterator[bytes]:
        yield b"The first words of a message that will never be finished, "
        for _ in range(2):  # until the server has fed it (no job queued or running twice)
            time.sleep(0.3)
            while running.state.executor.running or running.state.executor.depth:
                time.sleep(0.05)
        for _ in range(running.state.executor.threads):  # every job thread is taken
            jobs.append(running.state.executor.submit(block))
            assert started.acquire(timeout=30)
        jobs.append(running.state.executor.submit(lambda: None))  # and the queue is full
        threading.Thread(target=release_once_the_drop_waits, daemon=True).start()
        yield b"because the server is too busy to take the rest of it just now."

    def release_once_the_drop_waits() -> None:
        """The refused feed's drop is a cleanup job queued behind the blocked ones: the 429
        comes once it has run, so the blocked jobs go once it waits (not after 60 s)."""
        executor = running.state.executor
        deadline = time.monotonic() + 60
        while executor.queued <= executor.depth and time.monotonic() < deadline:
            time.sleep(0.02)
        release.set()

    try:
        with running.http() as h:
            r = h.post(f"/v1/sessions/{sid}/input", params={"max_tokens": 2}, content=body())
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
    finally:
        release.set()
    for job in jobs:
        job.result(timeout=60)
