"""Crash safety: 100 ``kill -9``s at chosen points of a real workload, and what survives them.

Each trial is one life of ``tests/store/crash_child.py`` (the real model, every store in one
directory), killed with SIGKILL. Kills are aimed: a trial picks a phase — the model load, the
metadata load, a session reopen, a turn's decode, its commit, a snapshot file write, a graph
write, a metadata save, a tool call, an op — waits for the child to announce it (the first or
second time), then kills it a random fraction of that phase's usual length later, so kills land
inside short phases too, not only where the child spends its time. The phase a kill actually
landed in is read from what the child announced before it died.

After each kill, with plain store APIs and no model: the history opens and passes SQLite's
integrity check; every turn the child saw committed is there with the same messages, identities
and token ids, in order; the turn in flight is there whole or not at all, and no turn has
messages without its turn row or the reverse; every snapshot file decodes or is rejected with
``SnapshotError`` (never another exception); the graph opens, every op has its result, and a
lookup of every op key does not raise; the cache metadata loads. Every next life must reopen
both sessions and run a turn on each (the session continues), and a last life, not killed,
does so after the final kill. Damage that persists is reported once, by the trial that made it.

The trials run in two lanes at once (two store directories, one fork server each, one thread
per life): a life is mostly single-threaded, so two of them use the machine's two cores.
``CONTINUUM_CRASH_TRIALS`` lowers the count while developing, ``CONTINUUM_CRASH_SEED`` changes
the schedule; ``pytest -s`` shows the one-line summary.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import statistics
import time
from collections import Counter, defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from continuum.errors import MetadataError, SessionNotFound, SnapshotError
from continuum.hashing import message_identity
from continuum.store import cache_meta
from continuum.store.graph import GraphStore, NodeQuery
from continuum.store.snapshot_format import SUFFIX, decode_snapshot
from continuum.store.sqlite import HistoryStore
from continuum.tiers.memory_graph import MemoryGraph
from tests.store import crash_child as child
from tests.store.crash_child import Event, ForkServer

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

TRIALS = 100
SEED = 1517
LANES = 2
TARGETS = (
    "load", "meta_load", "open", "turn", "commit", "snapshot", "graph", "meta", "tool", "op",
)  # fmt: skip
# first guesses of each phase's length (s); then the median of what the child measured
GUESS = {
    "load": 0.6, "meta_load": 0.01, "open": 0.3, "turn": 0.3, "commit": 0.003,
    "snapshot": 0.005, "graph": 0.01, "meta": 0.01, "tool": 0.01, "op": 0.2,
}  # fmt: skip
# phases aimed at on their first or second occurrence; these only on their first (once a life,
# or once per round of the work loop, where waiting for a second round buys nothing new)
FIRST_ONLY = {"load", "meta_load", "meta", "tool", "op"}
# one-shot phases of a life's start, and the phase that shows one was missed (no metadata
# saved yet, or no second reopen): the kill then lands in what comes next
MISSED_AT = {"meta_load": "open", "open": "turn"}
LIFE_S = 60.0  # a life that reaches none of its target in this long is killed anyway


@dataclass
class Life:
    events: list[Event] = field(default_factory=list)
    code: int | None = None  # exit code; -9 when killed
    problems: list[str] = field(default_factory=list)

    def landed(self) -> str:
        """The innermost phase open when the life ended ("between" outside every phase)."""
        stack: list[str] = []
        for e in self.events:
            if e["ev"] == "B":
                stack.append(e["ph"])
            elif e["ev"] == "E" and stack:
                stack.pop()
        return stack[-1] if stack else "between"

    def continued(self) -> bool:
        return {e["sid"] for e in self.events if e["ev"] == "continued"} == set(child.SESSIONS)


class Durations:
    """Each phase's length as the child measured it (its monotonic clock is the parent's)."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=25))

    def add(self, events: list[Event]) -> None:
        stack: list[Event] = []
        for e in events:
            if e["ev"] == "B":
                stack.append(e)
            elif e["ev"] == "E" and stack:
                begin = stack.pop()
                self._seen[begin["ph"]].append(e["t"] - begin["t"])

    def typical(self, name: str) -> float:
        seen = self._seen.get(name)
        return statistics.median(seen) if seen else GUESS[name]


def live(
    server: ForkServer, directory: Path, seed: int, target: str, nth: int, durations: Durations
) -> Life:
    """Run one life and SIGKILL it inside the ``nth`` occurrence of phase ``target``."""
    rng = random.Random(seed)
    server.start(directory, seed)
    out = Life()
    seen = 0
    now = time.monotonic()
    kill_at = now + rng.uniform(0, durations.typical("load")) if target == "load" else None
    deadline = now + LIFE_S
    while True:
        wait = min(kill_at or deadline, deadline) - time.monotonic()
        event = server.next_event(max(0.0, wait))
        if event is None:
            break  # the moment to kill
        if event["ev"] == "exit":
            server.pid, out.code = None, int(event["code"])
            out.problems.append(f"the life ended by itself (exit {out.code}) before its kill")
            return out
        out.events.append(event)
        if event["ev"] == "error":
            out.problems.append("the life raised:\n" + event["tb"])
        if event["ev"] != "B" or kill_at is not None:
            continue
        if event["ph"] == target:
            seen += 1
            if seen == nth:
                kill_at = event["t"] + rng.uniform(0, durations.typical(target))
        elif event["ph"] == MISSED_AT.get(target):
            kill_at = event["t"] + rng.uniform(0, durations.typical(event["ph"]))
    server.kill()
    out.code = server.ended(out.events)
    assert out.code is not None, "a killed life was not reported ended"
    durations.add(out.events)
    return out


def finish(server: ForkServer, directory: Path) -> Life:
    """A last life that is not killed: it must continue both sessions and close cleanly."""
    server.start(directory, 0, finish=True)
    out = Life()
    out.code = server.ended(out.events)  # the server's reply timeout bounds each event's wait
    out.problems += ["it raised:\n" + e["tb"] for e in out.events if e["ev"] == "error"]
    if out.code is None:
        server.kill()
        out.problems.append("it did not end")
    elif out.code != 0 or not out.continued():
        out.problems.append(f"it exited {out.code}, continued both sessions: {out.continued()}")
    return out


# -- the history: what the parent knows must be there ------------------------------------------
@dataclass
class Turn:
    sid: str
    rows: list[tuple[Any, str, list[int] | None]]  # (message, identity, token ids) committed
    turn: int | None = None  # None while in flight


class Ledger:
    """Every committed turn the children reported, per session, in order."""

    def __init__(self) -> None:
        self.turns: dict[str, list[Turn]] = defaultdict(list)
        self.adopted = 0  # turns in flight at a kill that turned out committed

    def absorb(self, events: list[Event]) -> Turn | None:
        """Take a life's commits; return the one in flight when it was killed, if any."""
        pending: Turn | None = None
        for e in events:
            if e["ev"] == "B" and e["ph"] == "commit":
                pending = Turn(e["sid"], list(zip(e["msgs"], e["ids"], e["toks"], strict=True)))
            elif e["ev"] == "E" and e["ph"] == "commit" and pending is not None:
                pending.turn = int(e["turn"])
                self.turns[pending.sid].append(pending)
                pending = None
        return pending

    def expected(self, sid: str) -> tuple[list[Any], list[int]]:
        done = self.turns.get(sid, [])
        return [r for t in done for r in t.rows], [t.turn or 0 for t in done]


def check_history(path: Path, ledger: Ledger, pending: Turn | None) -> list[str]:
    if not path.exists():
        return ["the history store is gone"] if ledger.turns else []
    problems = []
    with closing(sqlite3.connect(path)) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            problems.append(f"history integrity_check: {integrity}")
        for what, sql in (
            (
                "messages without their turn row",
                "SELECT session_id, turn FROM messages EXCEPT SELECT session_id, turn FROM turns",
            ),
            (
                "turn rows without their messages",
                "SELECT session_id, turn FROM turns EXCEPT SELECT session_id, turn FROM messages",
            ),
        ):
            half = db.execute(sql).fetchall()
            if half:
                problems.append(f"half-committed turns: {what}: {half}")
    with HistoryStore(path) as store:
        for sid in child.SESSIONS:
            problems += _check_session(store, sid, ledger, pending)
    return problems


def _check_session(
    store: HistoryStore, sid: str, ledger: Ledger, pending: Turn | None
) -> list[str]:
    rows, turns = ledger.expected(sid)
    try:
        record = store.load_session(sid)
    except SessionNotFound:
        return [f"session {sid} is gone with {len(turns)} committed turns"] if turns else []
    got = [
        (m.message, m.identity, None if m.gen_tokens is None else list(m.gen_tokens))
        for m in store.messages(sid)
    ]
    got_turns = [t["turn"] for t in store.turns(sid)]
    problems = [
        f"session {sid}: message {i} has identity {ident}, its content hashes otherwise"
        for i, (msg, ident, _) in enumerate(got)
        if message_identity(msg) != ident
    ]
    if record.turns != len(got_turns):
        problems.append(f"session {sid}: {record.turns} turns counted, {len(got_turns)} rows")
    whole = pending is not None and pending.sid == sid and got == rows + pending.rows
    if pending is not None and whole and got_turns == [*turns, len(turns) + 1]:
        pending.turn = len(turns) + 1  # the turn in flight made it, whole
        ledger.turns[sid].append(pending)
        ledger.adopted += 1
    elif got != rows or got_turns != turns:
        pairs = enumerate(zip(got, rows, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(rows)))
        problems.append(
            f"session {sid}: stored history differs from the committed turns at message "
            f"{first} (stored {len(got)} messages, turns {got_turns[-3:]}; committed "
            f"{len(rows)}, turns {turns[-3:]}; in flight: {pending is not None})"
        )
    return problems


# -- the other stores ------------------------------------------------------------------------------
@dataclass
class Tally:
    rejected_snapshots: int = 0  # files the decoder refused (cleanly)
    stray_tmp: int = 0  # temporary files of an interrupted write, left for the next start


def check_snapshots(directory: Path, info: Event | None, tally: Tally) -> list[str]:
    if not directory.is_dir() or info is None:
        return []  # info: no life got as far as writing a snapshot yet
    problems = []
    tally.stray_tmp += len(list(directory.glob("*.tmp")))
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            decode_snapshot(path.read_bytes(), model=info["digest"], ctx=info["ctx"])
        except SnapshotError:
            tally.rejected_snapshots += 1
        except Exception as e:  # the loader must refuse a bad file, never fall over
            problems.append(f"snapshot {path.name}: the decoder raised {e!r}")
    return problems


def check_graph(path: Path, scratch: Path) -> list[str]:
    if not path.exists():
        return []
    problems = []
    with closing(sqlite3.connect(path)) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            problems.append(f"graph integrity_check: {integrity}")
    store = GraphStore(path)
    try:
        store.counts()
        ops = sorted(
            (n for ns in namespaces(path) for n in store.nodes(NodeQuery(ns, kinds=("op",)))),
            key=lambda n: n.id,
        )
        problems += half_recorded(store)
    finally:
        store.close()
    # a lookup writes (a run row), so lookups run on a copy: the next life gets the file as is
    for suffix in ("", "-wal", "-shm"):
        (scratch / f"graph.db{suffix}").unlink(missing_ok=True)
        if suffix != "-shm" and Path(f"{path}{suffix}").exists():
            shutil.copyfile(f"{path}{suffix}", scratch / f"graph.db{suffix}")
    graph = MemoryGraph(scratch / "graph.db")
    try:
        for op in {(o.namespace, o.key): o for o in ops}.values():
            graph.answer(op.namespace, op.key)
        for op in {o.text: o for o in ops[-8:]}.values():
            graph.surface(op.namespace, op.text)
    except Exception as e:
        problems.append(f"a graph lookup raised {e!r}")
    finally:
        graph.close()
    return problems


def namespaces(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as db:
        return [str(r[0]) for r in db.execute("SELECT DISTINCT namespace FROM nodes")]


def half_recorded(store: GraphStore) -> list[str]:
    """Ops and tool calls without exactly one result, results without exactly one producer:
    what a crash between the writes of one recorded op or tool call would leave."""
    problems = []
    kinds = ("op", "tool_call", "result", "tool_result")
    for node in (
        n for ns in namespaces(store.path) for n in store.nodes(NodeQuery(ns, kinds=kinds))
    ):
        if node.kind in ("op", "tool_call"):
            n, what = len(store.targets(node.id, "produced")), "results"
        else:
            n, what = len(store.sources(node.id, "produced")), "producers"
        if n != 1:
            problems.append(f"graph {node.kind} {node.id} has {n} {what} (half-recorded)")
    return problems


def check_metadata(path: Path) -> list[str]:
    if not path.exists():
        return []
    try:
        cache_meta.load(path)
    except MetadataError as e:
        return [f"cache metadata does not load: {e}"]
    return []


# -- lanes -----------------------------------------------------------------------------------------
@dataclass
class Lane:
    """One store directory and the fork server whose lives use it."""

    root: Path
    server: ForkServer
    durations: Durations = field(default_factory=Durations)
    ledger: Ledger = field(default_factory=Ledger)
    tally: Tally = field(default_factory=Tally)
    landed: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[int, str]] = field(default_factory=list)  # (trial, what failed)
    reported: set[str] = field(default_factory=set)
    continued: int = 0  # lives that continued both sessions before their kill
    info: Event | None = None  # the model digest and context config, once a life got that far

    def record(self, trial: int, label: str, life: Life) -> None:
        """Check the stores after ``life``; a failure is a problem no earlier trial reported."""
        self.info = self.info or next((e for e in life.events if e["ev"] == "info"), None)
        stores = self.root / "stores"
        scratch = self.root / "scratch"
        scratch.mkdir(exist_ok=True)
        pending = self.ledger.absorb(life.events)
        problems = [
            *life.problems,
            *check_history(stores / child.HISTORY, self.ledger, pending),
            *check_snapshots(stores / child.SNAPSHOTS, self.info, self.tally),
            *check_graph(stores / child.GRAPH, scratch),
            *check_metadata(stores / child.METADATA),
        ]
        new = [p for p in problems if p not in self.reported]
        self.reported.update(problems)
        if new:
            self.failures.append((trial, f"{label}: " + "; ".join(new)))


def run_lane(lane: Lane, schedule: list[tuple[int, str, int, int]]) -> None:
    stores = lane.root / "stores"
    for trial, target, nth, seed in schedule:
        life = live(lane.server, stores, seed, target, nth, lane.durations)
        lane.landed[life.landed()] += 1
        lane.continued += life.continued()
        lane.record(trial, f"trial {trial} (aimed at {target}, landed in {life.landed()})", life)
    last = f"{lane.root.name}: the life after its last kill"
    lane.record(1 << 30, last, finish(lane.server, stores))


def test_kill_9_at_random_points_loses_no_committed_turn(tmp_path: Path) -> None:
    trials = int(os.environ.get("CONTINUUM_CRASH_TRIALS", TRIALS))
    rng = random.Random(int(os.environ.get("CONTINUUM_CRASH_SEED", SEED)))
    schedule = []
    for i in range(trials):
        target = rng.choice(TARGETS)
        nth = 1 if target in FIRST_ONLY else rng.randint(1, 2)
        schedule.append((i, target, nth, rng.randrange(1 << 30)))
    lanes: list[Lane] = []
    try:
        for k in range(LANES):
            root = tmp_path / f"lane{k}"
            (root / "stores").mkdir(parents=True)
            lanes.append(Lane(root, ForkServer(root / "children.log")))
        with ThreadPoolExecutor(LANES) as pool:
            done = [pool.submit(run_lane, lane, schedule[k::LANES]) for k, lane in enumerate(lanes)]
        for future in done:
            future.result()  # a lane's own breakdown (a dead fork server) fails the test here
    finally:
        for lane in lanes:
            lane.server.close()
    failures = [f for _, f in sorted(f for lane in lanes for f in lane.failures)]
    landed = sum((lane.landed for lane in lanes), Counter[str]())
    committed = sum(len(t) for lane in lanes for t in lane.ledger.turns.values())
    print(
        f"\ncrash safety: {trials} trials, {len(failures)} failures; kills by phase "
        f"{dict(sorted(landed.items()))}; {sum(lane.continued for lane in lanes)} lives "
        f"continued both sessions before their kill; {committed} committed turns intact "
        f"({sum(lane.ledger.adopted for lane in lanes)} in flight at a kill); "
        f"{sum(lane.tally.rejected_snapshots for lane in lanes)} snapshot files rejected, "
        f"{sum(lane.tally.stray_tmp for lane in lanes)} stray temporary files seen"
    )
    assert not failures, "\n".join(failures)
    assert sum(landed.values()) == trials  # every trial was one kill
    if "CONTINUUM_CRASH_TRIALS" not in os.environ:
        assert trials >= 100
    assert committed >= trials // 2  # the lives did commit turns for the kills to threaten
