"""``continuum bench interference``: what a long stateless request does to sessions generating.

``sessions`` clients each open a session (a system prompt of their own) and stream one long
greedy reply through the sessions API. Once every one of them has streamed ``warmup`` pieces,
one stateless ``/v1/chat/completions`` request arrives whose prompt is about ``prompt_tokens``
tokens (a prefill, then ``max_tokens`` = 8). Each session's inter-token gaps are taken from the
arrival times of its streamed pieces: gaps that overlap the stateless request (from its send
to its last byte) are *during*, the others *outside*. The table gives, per run, p50 outside,
p99 and max during, and the ratio p99 during / p50 outside (the goal: at most 2x), with the
stateless request's own time to first token.

``continuum serve`` runs in its own process with its defaults (``--parallel 4``), started for
each run and stopped after it; ``--serve`` runs another checkout's ``continuum`` (a before /
after comparison: modes alternate run by run, each server alone).
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import long_system_prompt
from continuum.bench.http import CONTINUUM, _free_port, _process
from continuum.bench.http_client import sse

# a long reply from an instruct model (a counting task ends early: the model abbreviates it)
STORY = "Write a long story of at least 800 words about a lighthouse keeper."


def _session(
    url: str,
    system: str,
    max_tokens: int,
    stamps: list[float],
    started: threading.Event,
    warmup: int,
) -> None:
    class Marking(list[float]):
        def append(self, t: float) -> None:
            super().append(t)
            stamps.append(t)
            if len(stamps) >= warmup:
                started.set()

    with httpx.Client(timeout=900) as client:
        sid = client.post(f"{url}/v1/sessions", json={"system": system}).json()["id"]
        body = {
            "messages": [{"role": "user", "content": STORY}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        sse(client, f"{url}/v1/sessions/{sid}/messages", body, Marking())


def _gaps(stamps: Sequence[float], start: float, end: float) -> tuple[list[float], list[float]]:
    """Inter-token gaps in ms: (outside [start, end], overlapping it)."""
    outside: list[float] = []
    during: list[float] = []
    for a, b in itertools.pairwise(stamps):
        (during if b > start and a < end else outside).append((b - a) * 1000)
    return outside, during


def _pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def one_run(args: list[str], port: int, plan: dict[str, Any]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}"
    n = plan["sessions"]
    base = long_system_prompt(plan["system_tokens"])
    stamps: list[list[float]] = [[] for _ in range(n)]
    ready = [threading.Event() for _ in range(n)]
    with _process(args, f"{url}/health"):
        threads = [
            threading.Thread(
                target=_session,
                args=(
                    url,
                    f"You are agent {i + 1}.\n{base}",
                    plan["reply_tokens"],
                    stamps[i],
                    ready[i],
                    plan["warmup"],
                ),
            )
            for i in range(n)
        ]
        for t in threads:
            t.start()
        for e in ready:
            if not e.wait(900):
                raise RuntimeError("a session streamed nothing in 900 s")
        body = {
            "messages": [
                {"role": "system", "content": long_system_prompt(plan["prompt_tokens"])},
                {"role": "user", "content": "Which section mentions invoices?"},
            ],
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
        }
        with httpx.Client(timeout=900) as client:
            body["model"] = client.get(f"{url}/v1/models").json()["data"][0]["id"]
            t0 = time.perf_counter()
            ttft, _, _ = sse(client, f"{url}/v1/chat/completions", body)
            t1 = time.perf_counter()
        for t in threads:
            t.join(900)
    outside: list[float] = []
    during: list[float] = []
    for s in stamps:
        o, d = _gaps(s, t0, t1)
        outside += o
        during += d
    if not during or not outside:
        raise RuntimeError(
            "the sessions' replies ended before the stateless request: raise --reply-tokens"
        )
    p50 = statistics.median(outside)
    p99 = _pct(during, 0.99)
    return {
        "stateless_ttft_ms": round(ttft, 1),
        "stateless_ms": round((t1 - t0) * 1000, 1),
        "p50_outside_ms": round(p50, 1),
        "p99_during_ms": round(p99, 1),
        "max_during_ms": round(max(during), 1),
        "ratio": round(p99 / p50, 2),
        "gaps_during": len(during),
    }


def run_interference(
    model: str | None,
    reps: int,
    threads: int,
    plan: dict[str, Any],
    serves: dict[str, str],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``serves``: mode name -> the ``continuum`` executable (or '' for this checkout's)."""
    mf = resolve_model(model)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in serves}
    total, done = reps * len(serves), 0
    for _ in range(reps):
        for mode, exe in serves.items():  # alternated run by run; each server alone
            if progress is not None:
                progress(f"interference: {mode}", done, total)
            port = _free_port()
            with tempfile.TemporaryDirectory() as tmp:
                base = [exe] if exe else list(CONTINUUM)
                args = [
                    *base,
                    "serve",
                    "-m",
                    str(mf.path),
                    "--port",
                    str(port),
                    "-t",
                    str(threads),
                    "--n-ctx",
                    str(plan["n_ctx"]),
                    "--store",
                    str(Path(tmp) / "h.db"),
                ]
                runs[mode].append(one_run(args, port, plan))
            done += 1
    rows = []
    for mode, rs in runs.items():
        row: dict[str, Any] = {"mode": mode, "runs": rs}
        for key in rs[0]:
            row[key] = statistics.median(r[key] for r in rs)
        rows.append(row)
    return {
        "experiment": "interference",
        "model": mf.path.name,
        "threads": threads,
        "reps": reps,
        **{k: v for k, v in plan.items()},
        "rows": rows,
    }


def interference_table(result: dict[str, Any]) -> str:
    lines = [
        f"interference: {result['model']}, {result['threads']} threads; {result['sessions']} "
        f"sessions streaming replies, then a {result['prompt_tokens']}-token stateless request; "
        f"medians of {result['reps']} runs, each server alone",
        "",
        "| server | sessions' gap p50 outside | p99 during | max during | p99 / p50 | "
        "stateless TTFT | stateless total |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mode']} | {r['p50_outside_ms']:.0f} ms | {r['p99_during_ms']:.0f} ms | "
            f"{r['max_during_ms']:.0f} ms | {r['ratio']:.2f}x | {r['stateless_ttft_ms']:.0f} ms "
            f"| {r['stateless_ms']:.0f} ms |"
        )
    return "\n".join(lines)
