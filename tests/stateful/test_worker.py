"""Session lifecycle on the real models: reopen in a new process, several sessions in one worker,
eviction, and every bad input we could think of (typed error, nothing lost)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from continuum import (
    ContextOverflow,
    GenerationParams,
    InvalidMessage,
    InvalidRequest,
    LlamaConfig,
    ModelFile,
    ModelFileError,
    ResetReason,
    SessionBusy,
    SessionClosed,
    SessionNotFound,
    TurnConflict,
    UnknownBackend,
    Worker,
    WorkerConfig,
)
from continuum.backends.base import Capabilities
from continuum.backends.llamacpp_ops import LlamaCppOpBackend
from continuum.backends.registry import BackendRegistry
from continuum.bench.conversation import SYSTEM, TURNS
from continuum.stateful.residency import snapshot_key
from continuum.store.snapshots import file_name
from tests.conftest import WorkerFactory, model

PARAMS = GenerationParams(max_tokens=24)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


_PROCESS = """
import json, sys
from continuum import GenerationParams, LlamaConfig, Worker, WorkerConfig
alias, store, session_id = sys.argv[1], sys.argv[2], sys.argv[3]
params = GenerationParams(max_tokens=24)
with Worker(alias, WorkerConfig(llama=LlamaConfig(n_ctx=2048), eager_glue=False), store=store) as w:
    if session_id == "new":
        s = w.create_session("You are Eva, a concise assistant.")
        for text in ["My name is Priya.", "I have a dog named Biscuit.", "I live in Lisbon."]:
            s.append([{"role": "user", "content": text}], params)
        out = {"id": s.id, "tokens": w.seq.tokens, "history": s.history}
    else:
        s = w.open_session(session_id)
        opened = list(w.seq.tokens)
        r = s.append([{"role": "user", "content": "What is my name?"}], params)
        out = {"opened": opened, "history": s.history, "metrics": r.metrics.to_dict(),
               "turn": r.turn}
print(json.dumps(out))
"""


def _process(alias: str, store: Path, session_id: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-c", _PROCESS, alias, str(store), session_id],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["gemma3-270m", "smollm2-135m"])
def test_reopen_by_id_in_a_fresh_process_continues_the_same_conversation(
    alias: str, tmp_path: Path
) -> None:
    store = tmp_path / "history.db"
    first = _process(alias, store, "new")
    second = _process(alias, store, first["id"])

    # the very same causal sequence, generated tokens included: restored from the KV snapshot
    # the first worker wrote when it closed, plus the last reply's closing glue decoded
    opened = second["opened"]
    assert opened[: len(first["tokens"])] == first["tokens"]
    assert len(opened) - len(first["tokens"]) <= 4
    m = second["metrics"]
    assert [r["reason"] for r in m["resets"]] == ["evicted"]
    assert "restored" in m["resets"][0]["detail"]
    assert m["resets"][0]["tokens_rebuilt"] == len(opened) - len(first["tokens"])
    assert m["tokens_reused"] == len(opened)
    assert second["history"][: len(first["history"])] == first["history"]
    assert second["history"][-2] == user("What is my name?")
    assert second["turn"] == 4


@pytest.mark.slow
def test_reopen_with_a_corrupt_snapshot_rebuilds_from_the_log(tmp_path: Path) -> None:
    store = tmp_path / "history.db"
    first = _process("gemma3-270m", store, "new")
    snap = tmp_path / "snapshots" / file_name(snapshot_key(first["id"]))
    data = bytearray(snap.read_bytes())
    data[-100] ^= 0xFF
    snap.write_bytes(bytes(data))
    second = _process("gemma3-270m", store, first["id"])
    (reset,) = second["metrics"]["resets"]
    assert reset["reason"] == "restore_failed" and "checksum" in reset["detail"]
    assert reset["tokens_rebuilt"] == len(second["opened"])  # everything decoded again
    assert second["opened"][: len(first["tokens"])] == first["tokens"]


def test_a_session_from_another_model_is_retokenized_and_reported(
    make_worker: WorkerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "shared.db"
    g = make_worker(model("gemma3-270m"), store=store)
    s = g.create_session(SYSTEM)
    s.append([user("My name is Priya.")], PARAMS)
    sid, history = s.id, s.history
    g.close()
    smol = make_worker(model("smollm2-135m"), store=store)
    s2 = smol.open_session(sid)
    r = s2.append([user("What is my name?")], PARAMS)
    assert [x.reason for x in r.metrics.resets] == [ResetReason.MODEL_CHANGED]
    assert s2.history[: len(history)] == history


@pytest.mark.slow
def test_sessions_interleaved_in_one_worker_reuse_their_resident_state(
    gemma: ModelFile, make_worker: WorkerFactory, tmp_path: Path
) -> None:
    solo = make_worker(gemma, store=tmp_path / "solo.db")
    a_alone = solo.create_session(SYSTEM)
    alone = [a_alone.append([user(t.content)], PARAMS).text for t in TURNS[:3]]

    w = make_worker(gemma)
    a, b = w.create_session(SYSTEM), w.create_session("You are a pirate.")
    texts = []
    for t in TURNS[:3]:
        before_b = b.last.metrics.context_used if b.last else len(b.wake_tokens(b.system))
        before_a = a.last.metrics.context_used if a.last else len(a.wake_tokens(SYSTEM))
        ra = a.append([user(t.content)], PARAMS)
        rb = b.append([user(t.content)], PARAMS)
        assert ra.metrics.tokens_reused == before_a and ra.metrics.resets == ()
        assert rb.metrics.tokens_reused == before_b and rb.metrics.resets == ()
        texts.append(ra.text)
    assert texts == alone  # a restored snapshot is the same state: the same greedy replies
    assert w.swaps >= 6


def test_a_parked_session_pushed_out_of_ram_comes_back_from_disk_without_prefill(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, park_budget_bytes=1)  # every parked snapshot leaves RAM at once
    a, b = w.create_session(SYSTEM), w.create_session(SYSTEM)
    a.append([user("My name is Priya.")], PARAMS)
    resident_a = list(w.seq.tokens)
    b.append([user("Hello.")], PARAMS)
    assert w.evictions >= 1
    r = a.append([user("What is my name?")], PARAMS)
    assert r.metrics.resets == ()
    assert r.metrics.tokens_reused == len(resident_a)
    assert w.disk_restores >= 1


def test_a_parked_session_pushed_out_of_the_budget_is_rebuilt_visibly(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    # no disk snapshots: every parked snapshot is simply dropped
    w = make_worker(gemma, park_budget_bytes=1, session_snapshots=False)
    a, b = w.create_session(SYSTEM), w.create_session(SYSTEM)
    a.append([user("My name is Priya.")], PARAMS)
    resident_a = list(w.seq.tokens)
    b.append([user("Hello.")], PARAMS)
    assert w.evictions >= 1
    r = a.append([user("What is my name?")], PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason == ResetReason.EVICTED
    assert reset.tokens_dropped == len(resident_a)
    assert reset.tokens_rebuilt > 0
    assert r.metrics.tokens_reused == 0
    assert w.seq.tokens[: len(resident_a)] == resident_a  # rebuilt from the log, exactly
    assert w.store.resets(a.id)[-1]["reason"] == "evicted"


# -- bad input: a typed error, and nothing lost ------------------------------------------------
BAD_MESSAGES = [
    pytest.param([{"role": "robot", "content": "hi"}], InvalidMessage, id="unknown-role"),
    pytest.param([], InvalidRequest, id="empty-list"),
    pytest.param("hello", InvalidRequest, id="not-a-list"),
    pytest.param([{"role": "user", "content": 42}], InvalidMessage, id="int-content"),
    pytest.param([{"role": "user", "content": b"bytes"}], InvalidMessage, id="bytes-content"),
    pytest.param(
        [{"role": "user", "content": b"caf\xe9".decode("utf-8", "surrogateescape")}],
        InvalidMessage,
        id="invalid-utf8",
    ),
    pytest.param([{"role": "user"}], InvalidMessage, id="missing-content"),
    pytest.param(["just text"], InvalidMessage, id="not-an-object"),
    # a system message after others is no error where the template renders it there (the
    # built-in Gemma format does): tests/backends/test_chat_format.py covers both kinds
]


@pytest.mark.parametrize(("messages", "error"), BAD_MESSAGES)
def test_bad_messages_raise_typed_errors_and_lose_nothing(
    gemma: ModelFile, make_worker: WorkerFactory, messages: object, error: type[Exception]
) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    s.append([user("Hello.")], PARAMS)
    history, resident, turns = s.history, list(w.seq.tokens), len(w.store.turns(s.id))
    with pytest.raises(error) as e:
        s.append(messages, PARAMS)  # type: ignore[arg-type]
    assert "message" in str(e.value)
    full = [*history, *messages] if isinstance(messages, list) and messages else messages
    with pytest.raises(error):
        s.turn(full, PARAMS)  # type: ignore[arg-type]
    assert s.history == history
    assert w.seq.tokens == resident
    assert len(w.store.turns(s.id)) == turns
    assert s.append([user("Still fine?")], PARAMS).metrics.tokens_reused == len(resident)


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_tokens=0),
        GenerationParams(max_tokens="5"),  # type: ignore[arg-type]
        GenerationParams(temperature=-1.0),
        GenerationParams(top_p=0.0),
        GenerationParams(stop=("",)),
    ],
)
def test_bad_generation_params_raise_before_anything_runs(
    gemma: ModelFile, make_worker: WorkerFactory, params: GenerationParams
) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    resident = list(w.seq.tokens)
    with pytest.raises(InvalidRequest):
        s.append([user("Hello.")], params)
    assert w.seq.tokens == resident and s.history[1:] == []


def test_a_context_smaller_than_the_wake_prefix_is_an_overflow_and_stores_nothing(
    gemma: ModelFile, make_worker: WorkerFactory, tmp_path: Path
) -> None:
    w = make_worker(gemma, n_ctx=64, store=tmp_path / "small.db")
    assert w.backend.n_ctx == 256  # llama.cpp pads a context to at least 256 cells
    with pytest.raises(ContextOverflow) as e:
        w.create_session("You follow the handbook. " * 80)
    assert e.value.n_ctx == 256 and e.value.n_requested > 256
    assert "wake prefix" in str(e.value)
    with sqlite3.connect(tmp_path / "small.db") as db:
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone() == (0,)
    s = w.create_session("Be brief.")  # the worker is still usable
    assert s.append([user("Hi")], GenerationParams(max_tokens=4)).metrics.tokens_reused > 0


def test_a_missing_model_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileError) as e:
        Worker(missing, store=tmp_path / "h.db")
    assert str(missing) in str(e.value) and "does not exist" in str(e.value)


def test_two_threads_on_one_session_get_session_busy(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    inside, tried = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def stream(_: str) -> None:
        inside.set()
        tried.wait(timeout=60)

    def first() -> None:
        try:
            s.append([user("Tell me a story.")], PARAMS, on_text=stream)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(timeout=60)
    with pytest.raises(SessionBusy) as e:
        s.append([user("Me too!")], PARAMS)
    assert s.id in str(e.value)
    tried.set()
    t.join(timeout=60)
    assert not errors
    assert [m["content"] for m in s.history][1] == "Tell me a story."
    assert len(s.history) == 3


def test_in_turn_holds_from_a_turns_start_to_its_commit(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    """The idle runner skips a session whose turn runs or waits (it would decode the glue that
    turn's own prefill takes): ``in_turn`` is true while the reply streams, false after."""
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    assert not s.in_turn
    inside, seen = threading.Event(), threading.Event()
    during: list[bool] = []

    def stream(_: str) -> None:
        if not inside.is_set():
            during.append(s.in_turn)
            inside.set()
            seen.wait(timeout=60)

    t = threading.Thread(target=lambda: s.append([user("Tell me a story.")], PARAMS, stream))
    t.start()
    assert inside.wait(timeout=60)
    assert s.in_turn
    seen.set()
    t.join(timeout=60)
    assert during == [True] and not s.in_turn
    assert len(s.history) == 3


def test_closed_and_unknown_sessions(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    s.close()
    with pytest.raises(SessionClosed):
        s.append([user("Hello?")], PARAMS)
    with pytest.raises(SessionNotFound):
        w.open_session("no-such-session")
    with pytest.raises(InvalidRequest):
        w.create_session(SYSTEM, high_water=-1)
    with pytest.raises(InvalidRequest):
        w.create_session(42)  # type: ignore[arg-type]
    reopened = w.open_session(s.id)  # closed is not deleted: the history is still there
    assert reopened.history == s.history


def test_a_worker_of_its_own_gets_its_backend_from_the_registry(
    gemma: ModelFile, tmp_path: Path
) -> None:
    made: list[tuple[dict[str, object], LlamaCppOpBackend]] = []

    def factory(**options: object) -> LlamaCppOpBackend:
        b = LlamaCppOpBackend(**options)  # type: ignore[arg-type]
        made.append((options, b))
        return b

    class Remote:  # a backend that keeps no resident sequences (an HTTP upstream, say)
        capabilities = Capabilities(kv_snapshots=False)
        closed = False

        def close(self) -> None:
            self.closed = True

    remote = Remote()
    reg = BackendRegistry(entry_points_group=None)
    reg.register("mine", factory)
    reg.register("remote", lambda **options: remote)  # type: ignore[arg-type,return-value]
    config = WorkerConfig(llama=LlamaConfig(n_ctx=1024), backend="mine")
    with Worker(gemma, config, store=tmp_path / "h.db", registry=reg) as w:
        ((options, ops),) = made
        assert options["n_slots"] == 0 and options["config"] == config.llama
        assert w.backend is ops.llama and w.seq.seq == ops.resident_sequence()[1]
        r = w.create_session("Be brief.").append([user("Hi")], GenerationParams(max_tokens=4))
        assert r.metrics.tokens_reused > 0
    with pytest.raises(SessionClosed):  # the worker closed the backend it created
        ops.llama.tokenize("x")
    with pytest.raises(UnknownBackend, match="nope"):
        Worker(gemma, WorkerConfig(backend="nope"), store=tmp_path / "u.db", registry=reg)
    with pytest.raises(InvalidRequest, match="keeps no resident sequences"):
        Worker(gemma, WorkerConfig(backend="remote"), store=tmp_path / "r.db", registry=reg)
    assert remote.closed  # nothing left open


def test_two_workers_on_one_store_cannot_supersede_each_others_turns(
    make_worker: WorkerFactory, tmp_path: Path
) -> None:
    """Two processes' workers share one history file: the turn committed second is refused
    (compare-and-swap on the turn number), and nothing of it is written."""
    store = tmp_path / "shared.db"
    a = make_worker(model("gemma3-270m"), store=store, session_snapshots=False)
    s = a.create_session(SYSTEM)
    s.append([user("Hi, I am Ada.")], PARAMS)
    b = make_worker(model("gemma3-270m"), store=store, session_snapshots=False)
    other = b.open_session(s.id)
    s.append([user("I keep bees.")], PARAMS)  # turn 2, by the first worker
    with pytest.raises(TurnConflict) as e:
        other.append([user("I keep goats.")], PARAMS)
    assert (e.value.expected, e.value.found) == (1, 2) and "reopen" in str(e.value)
    said = [m.message["content"] for m in a.store.messages(s.id) if m.message["role"] == "user"]
    assert said == ["Hi, I am Ada.", "I keep bees."]
    assert [t["turn"] for t in a.store.turns(s.id)] == [1, 2]
    assert other.history == [{"role": "system", "content": SYSTEM}, *s.history[1:3]]
