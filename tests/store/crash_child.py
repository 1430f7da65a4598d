"""The workload ``tests/store/test_sqlite_crash.py`` kills with SIGKILL (not a test module).

One *life* opens an engine on the real model with every store in one directory — the history
log, KV snapshot files, the memory graph and the cache metadata — loads the metadata, reopens
(or creates) both sessions and runs one turn on each (the session continues), then works until
it is killed: session turns (each switch parks the other session's KV: with no RAM budget for
snapshots, every park is a snapshot file write), tool calls and model ops recorded in the graph,
and metadata saves.

Every step is announced as JSON lines on fd 1: ``{"ev": "B", "ph": <phase>}`` before it and
``{"ev": "E", "ph": <phase>}`` after it. A commit's ``B`` line carries exactly what it commits,
so the parent knows which turns must survive (an ``E`` was seen) and which one was in flight.
Each line is one ``os.write``: nothing is buffered in this process, so what the parent reads is
what happened before the kill (a killed process loses no data it has already written, so no
fsync is needed — this test kills processes, it does not cut power). Lines stay under
PIPE_BUF, so the child's lines and the fork server's never interleave.

Modes (the parent's end of the pipe, :class:`ForkServer`, is here too)::

    python tests/store/crash_child.py <dir> <seed> [--finish]   one life, in this process
    python tests/store/crash_child.py --serve <model alias>     a fork server (below)

The fork server imports continuum once and forks one life per command line on stdin
(``{"dir": ..., "seed": ..., "finish": ...}``), answering ``{"ev": "pid"}`` and, once the life
is over, ``{"ev": "exit", "code": ...}`` (-9 when it was killed). Forking saves the second of
interpreter start and imports per life, which is what lets 100 lives fit the test's budget;
nothing is open in the server when it forks (no model, no store, no thread), so each life
opens every store and loads the model itself, as a restarted process would.
"""

from __future__ import annotations

import functools
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NoReturn

from continuum import (
    ChatSession,
    Engine,
    EngineConfig,
    GenerationParams,
    MemoryGraph,
    ModelFile,
    Result,
    Session,
    SessionNotFound,
    TokenOp,
    ToolOp,
    WorkerConfig,
    resolve_model,
)
from continuum.store import cache_meta, snapshots
from continuum.store.sqlite import HistoryStore

NAMESPACE = "crash"
SESSIONS = ("s0", "s1")
SYSTEM = "You are a terse assistant. Answer with one word."
HISTORY, SNAPSHOTS, GRAPH, METADATA = "history.db", "snaps", "graph.db", "meta.db"
N_CTX = 1024
HIGH_WATER = 128  # tokens: the window moves now and then, and a rebuild on reopen stays short
# two lives run at once on the machine's 2 cores: one thread each (llama.cpp's threads wait on
# each other, and two of them on a busy core made a turn ten times slower here)
THREADS = 1
SNAPSHOT_DISK_BYTES = 6 << 20  # ~18 KB a token: now and then a least recently used file goes
WORDS = ("colour", "fruit", "city", "river", "tree", "metal", "planet", "bird")
# a few op prompts, repeated across lives: a later life finds them in the graph (a lookup of
# what earlier, killed lives recorded), and their entities make it surface related ops
PROMPTS = (
    "Ada Lovelace wrote to Charles Babbage in 1843 about",
    "Grace Hopper and Howard Aiken built the Mark I in 1944, and",
    "Alan Turing met Claude Shannon in 1943; they talked about",
)
OP_PARAMS = GenerationParams(max_tokens=4)
MAX_STEPS = 500  # a life left alone (a parent that died) ends by itself
PIPE_BUF = 4096
Event = dict[str, Any]


def emit(**event: Any) -> None:
    """One event line, written at once (see the module docstring)."""
    event["t"] = time.monotonic()
    line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
    if len(line) > PIPE_BUF:  # it could interleave with the server's lines: fail loudly
        raise ValueError(f"event of {len(line)} bytes is over PIPE_BUF: {line[:200]!r}")
    os.write(1, line)


@contextmanager
def phase(name: str, **info: Any) -> Iterator[dict[str, Any]]:
    """``B`` with ``info`` before the block, ``E`` with what the block put in the dict after."""
    emit(ev="B", ph=name, **info)
    out: dict[str, Any] = {}
    yield out
    emit(ev="E", ph=name, **out)


def instrument() -> None:
    """Announce the store writes the parent aims its kills at; what they do is unchanged."""
    commit_turn = HistoryStore.commit_turn

    def commit(self: HistoryStore, session_id: str, **kw: Any) -> int:
        new = kw["new"]
        with phase(
            "commit",
            sid=session_id,
            msgs=[m.message for m in new],
            ids=[m.identity for m in new],
            toks=[None if m.gen_tokens is None else list(m.gen_tokens) for m in new],
        ) as out:
            out["turn"] = commit_turn(self, session_id, **kw)
        return int(out["turn"])

    HistoryStore.commit_turn = commit  # type: ignore[method-assign]
    snapshots.write_atomic = _announced("snapshot", snapshots.write_atomic)
    cache_meta.save = _announced("meta", cache_meta.save)
    MemoryGraph.record_op = _announced("graph", MemoryGraph.record_op)  # type: ignore[method-assign]
    MemoryGraph.record_tool = _announced("graph", MemoryGraph.record_tool)  # type: ignore[method-assign]


def _announced(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kw: Any) -> Any:
        with phase(name):
            return fn(*args, **kw)

    return wrapped


# -- one life ------------------------------------------------------------------------------------
def open_engine(directory: Path, model: ModelFile) -> Engine:
    return Engine.open(
        model=model,
        n_ctx=N_CTX,
        n_slots=1,
        n_threads=THREADS,
        config=EngineConfig(
            snapshot_dir=directory / SNAPSHOTS,
            snapshot_ram_bytes=0,  # every park and every spill is a snapshot file write
            snapshot_disk_bytes=SNAPSHOT_DISK_BYTES,
        ),
        graph=MemoryGraph(directory / GRAPH),
        worker=WorkerConfig(
            high_water=HIGH_WATER,
            rebuild_reserve_tokens=16,
            eager_glue=False,  # no idle thread: one thread does everything, in order
            speculate_after_ms=None,
        ),
        store=directory / HISTORY,
    )


def open_session(engine: Engine, sid: str) -> ChatSession:
    with phase("open", sid=sid) as out:
        try:
            session = engine.open_session(sid)
            out["how"] = "reopened"
        except SessionNotFound:
            session = engine.create_session(SYSTEM, session_id=sid)
            out["how"] = "created"
    return session


def say(session: ChatSession, rng: random.Random, seed: int) -> Result:
    text = f"{session.id} turn {session.turns + 1}, life {seed}: name a {rng.choice(WORDS)}."
    with phase("turn", sid=session.id) as out:
        params = GenerationParams(max_tokens=rng.choice((4, 5, 6)))
        result = session.append([{"role": "user", "content": text}], params)
        out["turn"] = result.turn
    return result


def inventory(item: str, life: int) -> dict[str, Any]:
    """A tool whose result changes between lives now and then: the graph invalidates."""
    return {"item": item, "count": life % 3}


def life(directory: Path, seed: int, model: ModelFile, finish: bool) -> None:
    rng = random.Random(seed)
    with phase("load"):
        engine = open_engine(directory, model)
    worker = engine.worker()
    # one context holds the sessions and the layer KV: every snapshot file carries this config
    emit(ev="info", digest=model.digest, ctx=worker.seq.backend.context_config())
    view = Session(NAMESPACE, engine=engine)
    meta = directory / METADATA
    if meta.exists():
        with phase("meta_load"):
            view.load_cache_metadata(meta)
    sessions = [open_session(engine, sid) for sid in SESSIONS]
    for session in sessions:
        emit(ev="continued", sid=session.id, turn=say(session, rng, seed).turn)
    if finish:
        engine.close()  # a clean end: open sessions are persisted as snapshots
        emit(ev="done")
        return
    work(view, sessions, rng, seed, meta)


def work(
    view: Session, sessions: list[ChatSession], rng: random.Random, seed: int, meta: Path
) -> None:
    """Turns on both sessions, a tool call, an op and a metadata save, in a seeded order, over
    and over until killed."""
    steps: list[Callable[[], object]] = [
        *(functools.partial(say, s, rng, seed) for s in sessions),
        functools.partial(call_tool, view, rng, seed),
        functools.partial(run_op, view, rng),
        functools.partial(save, view, meta),
    ]
    parent = os.getppid()
    for _ in range(MAX_STEPS):
        if os.getppid() != parent:
            return  # the fork server is gone: nobody will kill this life
        for step in rng.sample(steps, len(steps)):
            step()


def call_tool(view: Session, rng: random.Random, seed: int) -> None:
    args = {"item": rng.choice(("bolts", "nuts")), "life": seed % 2}
    with phase("tool"):
        view.run(ToolOp("inventory", inventory, args))


def run_op(view: Session, rng: random.Random) -> None:
    with phase("op"):
        view.run(TokenOp("complete", prompt=rng.choice(PROMPTS), params=OP_PARAMS))


def save(view: Session, meta: Path) -> None:
    with phase("save"):
        view.save_cache_metadata(meta)


def run_life(directory: Path, seed: int, model: ModelFile, finish: bool) -> NoReturn:
    """A life in a forked process: its exit code says how it ended (3: it raised). Whatever
    happens it ends here, never back in the server's loop, its atexit handlers or buffers."""
    code = 3
    try:
        life(directory, seed, model, finish)
        code = 0
    except BaseException:
        with suppress(BaseException):
            emit(ev="error", tb=traceback.format_exc()[-1500:])
    finally:
        os._exit(code)


# -- the fork server -----------------------------------------------------------------------------
def serve(alias: str) -> None:
    model = resolve_model(alias)
    instrument()
    emit(ev="ready")
    for line in sys.stdin:
        cmd = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_life(Path(cmd["dir"]), int(cmd["seed"]), model, bool(cmd["finish"]))
        emit(ev="pid", pid=pid)
        _, status = os.waitpid(pid, 0)
        emit(ev="exit", pid=pid, code=os.waitstatus_to_exitcode(status))


# -- the parent's end ----------------------------------------------------------------------------
class ForkServer:
    """A running ``--serve`` process: starts lives, kills them, and reads their events."""

    def __init__(self, log: Path, *, start_s: float = 120.0, reply_s: float = 30.0) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # no BLAS threads when it forks
        self._log = open(log, "wb")  # noqa: SIM115 - llama.cpp's chatter, kept for debugging
        alias = os.environ.get("CONTINUUM_MODEL", "gemma3-270m")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", alias],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            bufsize=0,
            env=env,
        )
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.fileno()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._out, selectors.EVENT_READ)
        self._buf = b""
        self._early: deque[Event] = deque()  # a life's events read before its pid arrived
        self.reply_s = reply_s
        self.pid: int | None = None  # the life running now
        ready = self.next_event(start_s)
        if ready is None or ready["ev"] != "ready":
            self.close()
            raise AssertionError(f"the fork server did not start (see {log}): {ready}")

    def next_event(self, timeout: float) -> Event | None:
        """The next event line; None when ``timeout`` passes first."""
        if self._early:
            return self._early.popleft()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                return None
            chunk = os.read(self._out, 1 << 16)
            if not chunk:
                raise AssertionError(f"the fork server died (exit {self.proc.poll()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        event: Event = json.loads(line)
        return event

    def start(self, directory: Path, seed: int, *, finish: bool = False) -> int:
        assert self.proc.stdin is not None
        cmd = {"dir": str(directory), "seed": seed, "finish": finish}
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        early: list[Event] = []
        while (event := self.next_event(self.reply_s)) is not None and event["ev"] != "pid":
            early.append(event)
        if event is None:
            raise AssertionError("the fork server did not fork a life")
        self._early.extend(early)
        self.pid = int(event["pid"])
        return self.pid

    def kill(self) -> None:
        """SIGKILL the running life (its exit event follows)."""
        if self.pid is not None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def ended(self, events: list[Event]) -> int | None:
        """Read the running life's events into ``events`` until it has ended; its exit code
        (-9 when killed), None if it was not reported ended in time."""
        while (event := self.next_event(self.reply_s)) is not None and event["ev"] != "exit":
            events.append(event)
        if event is None:
            return None
        self.pid = None
        return int(event["code"])

    def close(self) -> None:
        """Kill the running life, end the server (EOF on its stdin), never hang."""
        self.kill()
        with suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(self.reply_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(self.reply_s)
        self._sel.close()
        self._log.close()


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        serve(argv[1] if len(argv) > 1 else "gemma3-270m")
        return
    if len(argv) < 2:
        sys.exit("usage: crash_child.py <dir> <seed> [--finish] | --serve [model alias]")
    instrument()
    model = resolve_model(os.environ.get("CONTINUUM_MODEL", "gemma3-270m"))
    run_life(Path(argv[0]), int(argv[1]), model, "--finish" in argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
