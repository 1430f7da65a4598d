"""``continuum bench memory``: what each server holds in RAM, serving the same model.

Every server runs alone, as a process of its own, started for each run and stopped after it.
Each run sends one greedy chat completion (16 tokens) once the server answers ``/health``, then
reads the process's resident set (``VmRSS``) and its peak (``VmHWM``) from ``/proc``. Modes run
alternated, run by run; the table gives medians.

``continuum``          ``continuum serve`` with its defaults (``--parallel 4``: four lanes, a KV
                       stream of ``--n-ctx`` cells each, in the one context ops run in too)
``continuum-judge``    the same with ``--semantic --semantic-verifier judge`` (the semantic
                       tier's embedder, and the judge's context on the same weights)
``llama-server``       ``-c 4*n_ctx -np 4`` (four slots of ``n_ctx`` cells, as ours), ``-fa
                       off``, its default sliding-window cache (only the window's cells on
                       SWA layers: its least memory)
``llama-server-swa-full``  the same with ``--swa-full`` (every layer's cache full size, as
                       ours: any position can be truncated to)
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.http import _free_port, _process, serve_command
from continuum.errors import InvalidRequest

MODES = ("continuum", "continuum-judge", "llama-server", "llama-server-swa-full")
SLOTS = 4


def _rss_mb(pid: int) -> tuple[float, float]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def _command(
    mode: str,
    model: Path,
    alias: str | None,
    n_ctx: int,
    threads: int,
    server: str | None,
    port: int,
    tmp: str,
) -> list[str]:
    if mode.startswith("continuum"):
        args = serve_command(alias, port, threads, n_ctx, f"{tmp}/history.db")
        if mode == "continuum-judge":
            args += ["--semantic", "--semantic-verifier", "judge"]
        return args
    assert server is not None
    args = [
        server,
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(n_ctx * SLOTS),
        "-np",
        str(SLOTS),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-fa",
        "off",
        "--no-repack",
    ]
    return [*args, "--swa-full"] if mode == "llama-server-swa-full" else args


def _one(cmd: list[str], port: int) -> tuple[float, float]:
    url = f"http://127.0.0.1:{port}"
    with _process(cmd, f"{url}/health") as proc:
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
        r.raise_for_status()
        return _rss_mb(proc.pid)


def run_memory(
    model: str | None,
    reps: int,
    threads: int,
    n_ctx: int,
    modes: Sequence[str],
    llama_server: str | None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise InvalidRequest(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    if llama_server is None:
        modes = [m for m in modes if not m.startswith("llama-server")]
    mf = resolve_model(model)
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    total, done = reps * len(modes), 0
    for _ in range(reps):
        for mode in modes:  # alternated run by run; each server alone
            if progress is not None:
                progress(f"memory: {mode}", done, total)
            port = _free_port()
            with tempfile.TemporaryDirectory() as tmp:
                cmd = _command(mode, mf.path, model, n_ctx, threads, llama_server, port, tmp)
                runs[mode].append(_one(cmd, port))
            done += 1
    rows = []
    for mode in modes:
        rss = statistics.median(r for r, _ in runs[mode])
        peak = statistics.median(h for _, h in runs[mode])
        rows.append(
            {
                "mode": mode,
                "rss_mb": round(rss),
                "peak_mb": round(peak),
                "runs": [[round(r), round(h)] for r, h in runs[mode]],
            }
        )
    return {
        "experiment": "memory",
        "model": mf.path.name,
        "n_ctx_per_slot": n_ctx,
        "slots": SLOTS,
        "threads": threads,
        "reps": reps,
        "rows": rows,
    }


def memory_table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    base = next((r["rss_mb"] for r in rows if r["mode"] == "llama-server"), None)
    lines = [
        f"memory: {result['model']}, {result['slots']} slots of {result['n_ctx_per_slot']} "
        f"cells, {result['threads']} threads; median of {result['reps']} runs, each server "
        "alone, after one 16-token chat completion",
        "",
        "| server | RSS (MB) | peak (MB) | RSS / llama-server |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        ratio = f"{r['rss_mb'] / base:.2f}x" if base else "—"
        lines.append(f"| {r['mode']} | {r['rss_mb']:,} | {r['peak_mb']:,} | {ratio} |")
    return "\n".join(lines)
