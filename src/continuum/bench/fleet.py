"""``continuum bench fleet``: the local fleet (Redis + N workers + HAProxy) under load, for
each worker count, each a fresh fleet started by the code ``continuum fleet up`` runs
(:func:`continuum.server.fleet.running_fleet`) and stopped after its run.

Per worker count:

load phase    ``sessions`` sessions, each its own system prompt (the first line names the
              agent, so no two prompts are equal and the memo serves nothing), created through
              the router with their id in ``X-Session-ID`` (so the worker that owns the
              session's hash creates it, and its wake is done before the clock starts); then
              all at once, each sends seed 000's first ``turns`` user messages back to back
              (an agent loop), streamed, greedy, ``max_tokens`` each, through HAProxy.
throughput    committed turns and generated tokens (the server's ``completion_tokens``) over
              the span from the start to the last reply.
TTFT          at the client: request sent -> first content piece, every turn; p50 and p95.
correctness   every session read back through the router (``GET /v1/sessions/<id>``): its
              user messages are the ones sent, in order, its replies the streamed texts, one
              stored turn each, and the server's turn numbers 1..T in order; the resets the
              history logged, by kind: ``restored`` (KV from a snapshot), ``rebuilt`` (from
              the log), other reasons by name.
Redis load    ``INFO commandstats`` over the load phase: commands and Redis CPU time per turn.
hops          :mod:`continuum.bench.fleet_hops`: the router hop and the Redis hop, measured
              on the idle fleet after the load phase.

Every worker gets the same ``--threads`` (1 by default): the rows differ in the number of
workers only. On a machine with fewer cores than workers they share the cores, so throughput
is not expected to scale; the point is correctness and what the router and the shared store
cost per request.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench.concurrent import percentiles, run_clients
from continuum.bench.conversation import TURNS, long_system_prompt, n_ctx_for
from continuum.bench.fleet_hops import RedisCounts, redis_hop, router_hop
from continuum.bench.http import _free_port
from continuum.bench.http_client import sse
from continuum.server.fleet import running_fleet, worker_args
from continuum.store.redis_client import RedisTarget


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """What one ``bench fleet`` run measures (the CLI's options)."""

    workers: tuple[int, ...] = (1, 2, 3)
    sessions: int = 12
    turns: int = 6
    max_tokens: int = 16
    threads: int = 1
    parallel: int = 4
    n_ctx: int | None = None  # None: enough for the longest conversation, probes included
    system_tokens: int = 0
    hop_pairs: int = 20
    health_pairs: int = 200

    def context(self) -> int:
        load = n_ctx_for(self.system_tokens + 32, self.turns, self.max_tokens)
        return self.n_ctx or max(load, n_ctx_for(32, 2 * self.hop_pairs + 1, 1))

    def command(self, model: str | None) -> str:
        """The command line that repeats this run."""
        out = f"continuum bench fleet --workers {','.join(map(str, self.workers))} "
        out += f"--sessions {self.sessions} --turns {self.turns} --max-tokens {self.max_tokens} "
        out += f"--threads {self.threads} --parallel {self.parallel} "
        out += f"--hop-pairs {self.hop_pairs} --health-pairs {self.health_pairs}"
        out += f" --system-tokens {self.system_tokens}" if self.system_tokens else ""
        out += f" --n-ctx {self.n_ctx}" if self.n_ctx else ""
        return out + (f" --model {model}" if model else "")


class _Ticker:
    """One progress count shared by the client threads."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress, self.total, self.done = progress, total, 0
        self.lock = threading.Lock()

    def say(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self.done, self.total)

    def tick(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.done += n
            self.say(what)


def reset_kind(reset: dict[str, Any]) -> str:
    """``restored`` (KV from a snapshot), ``rebuilt`` (from the log), else the reason."""
    if reset["reason"] == "evicted" and "restored" in reset.get("detail", ""):
        return "restored"
    return "rebuilt" if reset["reason"] in ("evicted", "restore_failed") else reset["reason"]


def _messages(turns: int) -> list[str]:
    return [t.content for t in TURNS[:turns]]


def _agent(
    url: str, sid: str, plan: FleetPlan, start: threading.Barrier, tick: _Ticker, label: str
) -> list[dict[str, Any]]:
    """One session's turns, back to back; a failed turn ends the session (and is recorded)."""
    out: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, timeout=1800) as client:
        start.wait()
        for n, text in enumerate(_messages(plan.turns)):
            body = {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": plan.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                ttft, reply, last = sse(client, f"/v1/sessions/{sid}/messages", body)
            except httpx.HTTPError as e:
                out.append({"n": n, "error": f"{type(e).__name__}: {e}"})
                tick.tick(f"{label}: a turn failed")
                break
            usage = last.get("usage") or {}
            extra = usage.get("continuum") or {}
            out.append(
                {
                    "n": n,
                    "ttft_ms": ttft,
                    "text": reply,
                    "turn": extra.get("turn"),
                    "tokens": int(usage.get("completion_tokens") or 0),
                    "resets": len(extra.get("resets") or ()),
                }
            )
            tick.tick(f"{label}: turns")
    return out


def _create(url: str, sids: Sequence[str], systems: Sequence[str]) -> None:
    def one(i: int) -> None:
        body = {"system": systems[i], "session_id": sids[i]}
        r = httpx.post(
            f"{url}/v1/sessions", json=body, headers={"X-Session-ID": sids[i]}, timeout=1800
        )
        r.raise_for_status()

    with ThreadPoolExecutor(max_workers=min(8, len(sids))) as pool:
        list(pool.map(one, range(len(sids))))


def _verify(
    url: str, sids: Sequence[str], sent: list[str], got: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """Read every session back; what was committed, whether it is what was sent, in order."""
    committed, in_order = 0, 0
    kinds: Counter[str] = Counter()
    bad: list[str] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for sid, turns in zip(sids, got, strict=True):
            stored = client.get(f"/v1/sessions/{sid}").json()
            users = [m["content"] for m in stored["history"] if m["role"] == "user"]
            replies = [m["content"] for m in stored["history"] if m["role"] == "assistant"]
            committed += len(stored["turns"])
            kinds.update(reset_kind(r) for r in stored["resets"])
            ok = (
                users == sent
                and replies == [t.get("text") for t in turns]
                and len(stored["turns"]) == len(sent)
                and [t.get("turn") for t in turns] == list(range(1, len(sent) + 1))
            )
            in_order += ok
            if not ok:
                bad.append(sid)
    return {
        "turns_committed": committed,
        "sessions_in_order": in_order,
        "sessions_wrong": bad,
        "resets": dict(sorted(kinds.items())),
    }


def _row(
    n: int, plan: FleetPlan, got: list[list[dict[str, Any]]], span: float, checked: dict[str, Any]
) -> dict[str, Any]:
    turns = [t for session in got for t in session]
    done = [t for t in turns if "error" not in t]
    ttft = [t["ttft_ms"] for t in done if t["ttft_ms"] == t["ttft_ms"]]  # NaN: no content
    p50, p95 = percentiles(ttft) if ttft else (None, None)
    tokens = sum(t["tokens"] for t in done)
    return {
        "workers": n,
        "sessions": plan.sessions,
        "turns_sent": len(turns),
        "turns_answered": len(done),
        "turns_failed": [t["error"] for t in turns if "error" in t],
        "turns_without_content": len(done) - len(ttft),
        **checked,
        "resets_seen_by_clients": sum(t["resets"] for t in done),
        "span_s": span,
        "turns_per_s": checked["turns_committed"] / span,
        "tokens": tokens,
        "tokens_per_s": tokens / span,
        "ttft_ms_p50": p50,
        "ttft_ms_p95": p95,
    }


def _one_fleet(n: int, plan: FleetPlan, mf: ModelFile, tick: _Ticker) -> dict[str, Any]:
    """A fresh fleet of ``n`` workers: the load phase, the read-back, the hops; stopped."""
    label = f"{n} worker{'s' if n > 1 else ''}"
    args = worker_args(
        workers=n,
        threads=plan.threads,
        n_ctx=plan.context(),
        parallel=plan.parallel,
        model=str(mf.path),
    )
    # every session may hash to one worker: it must queue them all and hold them all open
    args += ["--max-queue", str(plan.sessions + 4), "--max-open-sessions", str(plan.sessions + 8)]
    base = long_system_prompt(plan.system_tokens)
    systems = [f"You are agent number {i + 1} of a team.\n{base}" for i in range(plan.sessions)]
    sids = [f"fleet-{n}w-s{i + 1}-{os.urandom(4).hex()}" for i in range(plan.sessions)]
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_fleet(
            Path(tmp) / "fleet",
            workers=n,
            port=_free_port(),
            serve_args=args,
            say=lambda line: tick.say(f"{label}: {line}"),
        ) as fleet,
    ):
        tick.say(f"{label}: creating {plan.sessions} sessions")
        _create(fleet.url, sids, systems)
        redis = RedisTarget(fleet.store)
        try:
            before = RedisCounts.read(redis)

            def target(i: int, start: threading.Barrier) -> list[dict[str, Any]]:
                return _agent(fleet.url, sids[i], plan, start, tick, label)

            got, span = run_clients(plan.sessions, target)
            live = RedisCounts.read(redis).since(before)
        finally:
            redis.close()
        checked = _verify(fleet.url, sids, _messages(plan.turns), got)
        row = _row(n, plan, got, span, checked)
        row["redis_live"] = live.per_turn(checked["turns_committed"])
        tick.say(f"{label}: router hop")
        row["router_hop"] = router_hop(fleet, plan.hop_pairs, plan.health_pairs)
        tick.tick(f"{label}: router hop", 2 * plan.hop_pairs + 1)
        tick.say(f"{label}: Redis hop (replaying the stored turns)")
        row["redis_hop"] = redis_hop(fleet.store, sids, Path(tmp))
        row["worker_ports"] = [p for p, _ in fleet.workers]
    row["load_avg_1m"] = [load_before, os.getloadavg()[0]]
    return row


def run_fleet_bench(
    plan: FleetPlan,
    model: str | None = None,
    progress: Progress | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Every worker count of ``plan``, each on a fresh fleet; the rows and how they were
    measured. ``note``: a line kept with the results (what else ran on the machine)."""
    mf = resolve_model(model)
    per_run = plan.sessions * plan.turns + 2 * plan.hop_pairs + 1
    tick = _Ticker(progress, per_run * len(plan.workers))
    rows = [_one_fleet(n, plan, mf, tick) for n in plan.workers]
    tick.say("done")
    return {
        "experiment": "fleet",
        "machine": {"model_path": str(mf.path), "cores": os.cpu_count()},
        "model": mf.path.name,
        "model_digest": mf.digest,
        "plan": {**asdict(plan), "n_ctx": plan.context()},
        "command": plan.command(model),
        "note": note,
        "rows": rows,
    }


def _ms(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f} ms"


def _resets(row: dict[str, Any]) -> str:
    r = row["resets"]
    other = sum(v for k, v in r.items() if k not in ("rebuilt", "restored"))
    out = f"{r.get('rebuilt', 0)} / {r.get('restored', 0)}"
    return out + (f" (+{other} other)" if other else "")


def _hop_cells(row: dict[str, Any]) -> list[str]:
    rh, sh = row["router_hop"], row["redis_hop"]
    live, replay = row["redis_live"], sh.get("replay", {})
    return [
        _ms(rh["health"]["hop_ms"], 2),
        _ms(rh["turn"]["hop_ms"], 1),
        _ms(sh.get("redis_ms"), 2),
        _ms(sh.get("sqlite_ms"), 2),
        _ms(sh.get("hop_ms"), 2),
        f"{live['commands_per_turn']:.1f} / {replay.get('commands_per_turn', 0):.1f}",
        f"{live['redis_usec_per_turn']:.0f} µs",
    ]


def table_lines(r: dict[str, Any]) -> list[str]:
    """The two tables: load and correctness, then the hops (one row per worker count)."""
    p = r["plan"]
    lines = [
        f"| workers ({r['model']}) | turns committed | sessions in order | resets rebuilt / "
        "restored | turns/s | tokens/s | TTFT p50 | TTFT p95 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['workers']} | {row['turns_committed']}/{row['sessions'] * p['turns']} | "
            f"{row['sessions_in_order']}/{row['sessions']} | {_resets(row)} | "
            f"{row['turns_per_s']:.2f} | {row['tokens_per_s']:.1f} | "
            f"{_ms(row['ttft_ms_p50'])} | {_ms(row['ttft_ms_p95'])} |"
        )
    lines += [
        "",
        f"| workers ({r['model']}) | router hop, /health | router hop, session turn | "
        "store calls per turn, Redis | same, SQLite | Redis hop per turn | Redis commands per "
        "turn, load / replay | Redis CPU per turn |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {row['workers']} | " + " | ".join(_hop_cells(row)) + " |" for row in r["rows"]]
    return lines


def format_table(r: dict[str, Any]) -> str:
    p = r["plan"]
    head = (
        f"fleet · {r['model']} · {p['threads']} thread(s) per worker, {p['parallel']} lanes · "
        f"{p['sessions']} sessions x {p['turns']} turns of {p['max_tokens']} tokens at once · "
        f"hops: {p['hop_pairs']} turn pairs, {p['health_pairs']} /health pairs"
    )
    return "\n".join([head, *([r["note"]] if r.get("note") else []), "", *table_lines(r)])


def report_fleet(lines: list[str], misses: list[str], r: dict[str, Any]) -> None:
    """The section of docs/benchmarks.md, and the sessions a run lost or mixed up."""
    cores = r["machine"]["cores"]
    before = ", ".join(f"{row['load_avg_1m'][0]:.1f}" for row in r["rows"])
    lines += [
        "## A local fleet: Redis + N workers + HAProxy",
        "",
        "Each worker count is a fresh `continuum fleet up` (Redis with deploy/redis.conf's "
        "settings, N `continuum serve` workers on one `--store redis://`, HAProxy hashing the "
        "session key), loaded with sessions that all run at once through the router, each "
        "sending seed 000's user turns back to back; then every session is read back. TTFT is "
        "the client's (request sent -> first content piece). The router hop is the median "
        "paired difference of the same request sent through HAProxy and straight to the "
        "worker that owns the session (alternated): `GET /health`, and a streamed one-token "
        "session turn. The Redis hop is the store calls of one session turn (owner checks, "
        "the freshness check, memo get, the parked snapshot's delete when the session came "
        "back into a lane, commit, memo put) replayed with the fleet's own stored turns "
        "against its Redis and against a SQLite history, the memo in RAM and a snapshot "
        "folder (what one `continuum serve` uses); Redis's `INFO commandstats` shows the "
        "replay issues the commands the live turns did (`load / replay`). Every worker has "
        "the same threads, so rows differ only in the number of workers.",
        "",
        f"Model {r['model']}, {r['plan']['threads']} thread(s) per worker, "
        f"{cores} cores. Command: `{r['command']}`",
        "",
        *([r["note"], ""] if r.get("note") else []),
        f"The 1-minute load average as each fleet started: {before} (on {cores} cores; the "
        "previous fleet's processes still count for a minute after they stop). With one "
        "thread per worker the 1-worker row uses one core; workers beyond the cores share "
        "them, so throughput is not expected to scale. `router hop, session turn` is the "
        "difference of two ~100 ms+ turns: within the noise of a turn (a negative value is "
        "noise); `/health` isolates the hop. `load / replay`: Redis commands per turn in the "
        "load phase and in the replay (Lua scripts' inner calls counted; the load phase adds "
        "each connection's `HELLO` and `SCRIPT LOAD`). `Redis CPU per turn`: the time Redis "
        "spent executing them (`INFO commandstats` usec), not counting the network or fsync.",
        "",
        *table_lines(r),
        "",
        "![fleet](fleet.png)",
        "",
    ]
    for row in r["rows"]:
        want = row["sessions"] * r["plan"]["turns"]
        if row["turns_committed"] != want or row["sessions_in_order"] != row["sessions"]:
            misses.append(
                f"fleet of {row['workers']}: {row['turns_committed']} of {want} turns committed, "
                f"{row['sessions_in_order']} of {row['sessions']} sessions as sent, in order "
                "(goal: all)."
            )


__all__ = [
    "FleetPlan", "format_table", "report_fleet", "reset_kind", "run_fleet_bench", "table_lines",
]  # fmt: skip
