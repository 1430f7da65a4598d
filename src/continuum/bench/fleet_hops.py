"""What the fleet adds to a request, measured on a running fleet after its load phase (the
fleet is idle, so these are the uncontended costs). Used by :mod:`continuum.bench.fleet`.

Router hop
    The same request sent straight to a worker and through HAProxy, alternated (the order
    flips every pair), on keep-alive connections: ``GET /health`` (the hop with nothing behind
    it) and a streamed one-token session turn on a probe session (its owner found from the
    workers' ``continuum_ttft_seconds_count``, so both paths reach the same worker and its
    resident KV), timed from send to the end of the stream. The hop is the median of the
    paired differences, routed minus direct.

Redis hop
    The store calls the server makes for one session turn, replayed in this process through
    the same store classes with the records the fleet's turns wrote (read back from its
    Redis): ``session_tenant`` twice (the stream's owner check and ``own_session``),
    ``load_session`` (``open_session``'s freshness check), the memo tier's ``get`` (a miss,
    when the turn consulted it), the parked snapshot's ``delete`` (when the session came back
    into a lane from one: ``hit_tier`` ``layer_kv``), ``commit_turn`` and the memo ``put``
    (when the turn decoded).
    Once against the fleet's Redis (a key prefix of its own; ``appendfsync always``) and once
    against a SQLite history, the memo in RAM and a snapshot folder (what a single ``continuum
    serve`` uses), alternating per turn. Redis's ``INFO commandstats`` counts the commands of
    the replay and of the live load phase (Lua scripts' inner calls included), so a replay
    that no longer matches what the server does shows as a mismatch.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.bench.http_client import sse
from continuum.hashing import digest
from continuum.keys import OpKey
from continuum.server.fleet import Fleet
from continuum.stateful.residency import snapshot_key
from continuum.store.base import HistoryLog, SnapshotStore, StoredMessage
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.stores import SnapshotPlace, Stores
from continuum.tiers.memo import MemoEntry, MemoTier

RESULT_TIERS = ("memo", "semantic", "memory_graph")  # a hit there decoded nothing


# -- Redis's own counters -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RedisCounts:
    """Redis's ``INFO commandstats`` totals of the commands that succeeded (a script's first
    ``EVALSHA`` from a process fails with ``NOSCRIPT`` before redis-py loads it), less
    ``INFO`` itself (this bench's own calls)."""

    calls: int
    usec: int
    by_command: dict[str, int]

    @classmethod
    def read(cls, target: RedisTarget) -> RedisCounts:
        stats = target.call(target.client.info, "commandstats")
        by = {
            name.removeprefix("cmdstat_"): int(s["calls"]) - int(s.get("failed_calls", 0))
            for name, s in stats.items()
            if name != "cmdstat_info"
        }
        usec = sum(int(s["usec"]) for name, s in stats.items() if name != "cmdstat_info")
        return cls(sum(by.values()), usec, by)

    def since(self, before: RedisCounts) -> RedisCounts:
        by = {k: v - before.by_command.get(k, 0) for k, v in self.by_command.items()}
        return RedisCounts(
            self.calls - before.calls, self.usec - before.usec, {k: v for k, v in by.items() if v}
        )

    def per_turn(self, turns: int) -> dict[str, Any]:
        n = max(turns, 1)
        return {
            "turns": turns,
            "commands_per_turn": self.calls / n,
            "redis_usec_per_turn": self.usec / n,
            "by_command_per_turn": {k: v / n for k, v in sorted(self.by_command.items())},
        }


# -- the router hop -------------------------------------------------------------------------
def _served(fleet: Fleet) -> list[float]:
    """Each worker's count of turns answered (its TTFT histogram's count)."""
    out = []
    for port, _ in fleet.workers:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        line = next(ln for ln in text.splitlines() if ln.startswith("continuum_ttft_seconds_count"))
        out.append(float(line.split()[-1]))
    return out


def _probe_turn(client: httpx.Client, sid: str, n: int) -> tuple[float, int]:
    """One streamed one-token turn: (ms from send to the end of the stream, resets)."""
    body = {
        "messages": [{"role": "user", "content": f"Probe {n}: answer with one word."}],
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    _, _, last = sse(client, f"/v1/sessions/{sid}/messages", body)
    ms = (time.perf_counter() - t0) * 1000
    return ms, len(((last.get("usage") or {}).get("continuum") or {}).get("resets") or ())


def _paired(
    pairs: int, routed: Callable[[int], float], direct: Callable[[int], float]
) -> dict[str, float]:
    """Alternate ``routed`` and ``direct`` (the order flips each pair); their medians and the
    median of the paired differences."""
    r, d = [], []
    for i in range(pairs):
        if i % 2 == 0:
            r.append(routed(2 * i))
            d.append(direct(2 * i + 1))
        else:
            d.append(direct(2 * i))
            r.append(routed(2 * i + 1))
    return {
        "routed_ms": statistics.median(r),
        "direct_ms": statistics.median(d),
        "hop_ms": statistics.median(a - b for a, b in zip(r, d, strict=True)),
        "pairs": pairs,
    }


def router_hop(fleet: Fleet, turn_pairs: int, health_pairs: int) -> dict[str, Any]:
    """The router's cost per request: ``/health`` and a session turn, direct vs routed."""
    sid = f"probe-{uuid.uuid4().hex[:12]}"
    with httpx.Client(base_url=fleet.url, timeout=600) as via:
        r = via.post(
            "/v1/sessions",
            json={"system": "Answer in one word.", "session_id": sid},
            headers={"X-Session-ID": sid},
        )
        r.raise_for_status()
        before = _served(fleet)
        _, first_resets = _probe_turn(via, sid, 0)
        grew = [a - b for a, b in zip(_served(fleet), before, strict=True)]
        owner = max(range(len(grew)), key=grew.__getitem__)
        resets = [first_resets]
        with httpx.Client(
            base_url=f"http://127.0.0.1:{fleet.workers[owner][0]}", timeout=600
        ) as direct:

            def timed(client: httpx.Client) -> Callable[[int], float]:
                def turn(n: int) -> float:
                    ms, k = _probe_turn(client, sid, n + 1)
                    resets.append(k)
                    return ms

                return turn

            def health(client: httpx.Client) -> Callable[[int], float]:
                def get(_: int) -> float:
                    t0 = time.perf_counter()
                    client.get("/health").raise_for_status()
                    return (time.perf_counter() - t0) * 1000

                return get

            turns = _paired(turn_pairs, timed(via), timed(direct))
            checks = _paired(health_pairs, health(via), health(direct))
    return {
        "owner": owner + 1,
        "owner_turns_seen": grew[owner],  # 1: the probe turn reached exactly that worker
        "turn": turns,
        "health": checks,
        "probe_resets": sum(resets),
    }


# -- the Redis hop --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Turn:
    """One committed turn as the fleet stored it, to replay."""

    sid: str
    n: int  # turns before it
    new: tuple[StoredMessage, StoredMessage]
    finish_reason: str
    metrics: dict[str, Any]
    system: str | None

    def memo_ops(self) -> tuple[bool, bool]:
        """(consulted the memo, recorded its reply there), from the turn's tier outcomes."""
        memo = [t for t in self.metrics.get("tiers", ()) if t.get("tier") == "memo"]
        consulted = bool(memo) and memo[0].get("outcome") != "skipped"
        return consulted, consulted and self.metrics.get("hit_tier") not in RESULT_TIERS


@dataclass(frozen=True, slots=True)
class _Stores:
    """What one server's turns call: its history, memo tier and parked snapshots."""

    history: HistoryLog
    memo: MemoTier
    snapshots: SnapshotStore


def _turn_ops(stores: _Stores, t: _Turn) -> float:
    """The store calls of one session turn; their milliseconds."""
    hist, memo = stores.history, stores.memo
    consulted, recorded = t.memo_ops()
    key = OpKey(digest(f"{t.sid}/{t.n}".encode(), person=b"cont-opkey"))
    reply = t.new[1]
    t0 = time.perf_counter()
    hist.session_tenant(t.sid)
    hist.session_tenant(t.sid)
    hist.load_session(t.sid)
    if consulted:
        memo.get(key)
    if t.metrics.get("hit_tier") == "layer_kv":  # back from its parked snapshot: now stale
        stores.snapshots.delete(snapshot_key(t.sid))
    hist.commit_turn(
        t.sid,
        keep=2 * t.n,
        new=list(t.new),
        finish_reason=t.finish_reason,
        metrics=t.metrics,
        system=t.system,
        expected_turn=t.n,
    )
    if recorded:
        prompt = t.metrics["prompt_tokens_evaluated"] + t.metrics["tokens_reused"]
        memo.put(
            MemoEntry(
                key,
                memo.version,
                str(reply.message.get("content") or ""),
                tuple(reply.gen_tokens or ()),
                t.finish_reason,
                prompt,
            )
        )
    return (time.perf_counter() - t0) * 1000


def _stored_turns(source: RedisHistoryStore, sids: Sequence[str]) -> tuple[list[_Turn], int]:
    """Every committed turn of ``sids``, and how many sessions could not be replayed (a
    history that is not one user message and one reply per turn)."""
    out: list[_Turn] = []
    skipped = 0
    for sid in sids:
        msgs, turns = source.messages(sid), source.turns(sid)
        system = source.load_session(sid).system
        if len(msgs) != 2 * len(turns):
            skipped += 1
            continue
        for i, rec in enumerate(turns):
            pair = (msgs[2 * i], msgs[2 * i + 1])
            out.append(_Turn(sid, i, pair, rec["finish_reason"], rec["metrics"], system))
    return out, skipped


def _copy_session(source: HistoryLog, sid: str, into: HistoryLog) -> None:
    rec = source.load_session(sid)
    into.create_session(
        model_digest=rec.model_digest,
        chat_format=rec.chat_format,
        system=rec.system,
        continuity=rec.continuity,
        config=rec.config,
        session_id=sid,
        tenant=rec.tenant,
    )


def redis_hop(store_url: str, sids: Sequence[str], scratch: Path) -> dict[str, Any]:
    """The fleet's stored turns replayed against its Redis and against SQLite, per turn."""
    source = RedisHistoryStore(store_url)
    replay_url = f"{store_url}?prefix=bench-replay-{uuid.uuid4().hex[:8]}"
    opened = {
        "redis": Stores.open(replay_url, SnapshotPlace(256 << 20, 4 << 30)),
        # one `continuum serve`: SQLite, the memo in RAM, snapshots in RAM and a folder
        "sqlite": Stores.open(
            scratch / "replay.db", SnapshotPlace(256 << 20, directory=scratch / "replay-snapshots")
        ),
    }
    replay = opened["redis"].redis
    assert replay is not None
    try:
        turns, skipped = _stored_turns(source, sids)
        stores = {
            name: _Stores(st.history, MemoTier(shared=st.results), st.snapshots)
            for name, st in opened.items()
        }
        for sid in dict.fromkeys(t.sid for t in turns):
            for st in stores.values():
                _copy_session(source, sid, st.history)
        before = RedisCounts.read(replay)
        ms: dict[str, list[float]] = {"redis": [], "sqlite": []}
        for i, t in enumerate(turns):
            for name in ("redis", "sqlite") if i % 2 == 0 else ("sqlite", "redis"):
                ms[name].append(_turn_ops(stores[name], t))
        counted = RedisCounts.read(replay).since(before)
    finally:
        for each in opened.values():
            each.close()
        source.close()
    if not turns:
        return {"turns": 0, "sessions_skipped": skipped}
    return {
        "turns": len(turns),
        "sessions_skipped": skipped,
        "redis_ms": statistics.median(ms["redis"]),
        "sqlite_ms": statistics.median(ms["sqlite"]),
        "hop_ms": statistics.median(a - b for a, b in zip(ms["redis"], ms["sqlite"], strict=True)),
        "replay": counted.per_turn(len(turns)),
    }


__all__ = ["RedisCounts", "redis_hop", "router_hop"]
