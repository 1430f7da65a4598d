"""``continuum bench shared-prefix``: the sessions of one agent open with one long system prompt.

In process, on an engine laid out as ``continuum serve`` lays it out (``--parallel 4``: four
lanes of one context; ``lanes`` says otherwise). First a *cold* reference: one session of a
tenant of its own (nothing of its tenant to copy from) is created and sends its first message.
Then ``sessions`` sessions of one tenant are created one after another with the same system
prompt of about ``system_tokens`` tokens, each sending its own first message (greedy,
``max_tokens`` tokens); past four (the lanes), each new session parks the least recently used
one.

Per session: the prompt tokens decoded for its wake and first turn, and its first TTFT (from
the call that creates it to the first token of its first reply). A session whose tenant has the
prompt resident in another lane copies that KV (``llama_memory_seq_cp``) instead of decoding it;
one whose siblings are all parked (one lane: always) loads the prompt from a parked sibling's
snapshot. The goal: tokens decoded ≈ one prompt + every session's own suffix, and the last
session's TTFT at most 0.1x the cold one. Medians over ``reps`` runs, each on a fresh engine.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import long_system_prompt
from continuum.params import GenerationParams
from continuum.stateful.worker import WorkerConfig

LANES = 4  # serve's default --parallel


def _open(
    engine: Any, system: str, tenant: str, i: int, params: GenerationParams
) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = engine.create_session(system, tenant=tenant)
    created_ms = (time.perf_counter() - t0) * 1000
    wake = s.wake_decoded
    msg = [{"role": "user", "content": f"I am user {i + 1}. Which section covers refunds?"}]
    r = s.append(msg, params)
    return {
        "decoded": wake + r.metrics.prompt_tokens_evaluated,
        "wake_decoded": wake,
        "ttft_ms": created_ms + r.metrics.ttft_ms,
    }


def _one(model: Any, threads: int, plan: dict[str, Any]) -> dict[str, Any]:
    from continuum.engine.core import Engine, EngineConfig

    system = long_system_prompt(plan["system_tokens"])
    params = GenerationParams(max_tokens=plan["max_tokens"])
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.open(
            model=model,
            n_ctx=plan["n_ctx"],
            n_threads=threads,
            config=EngineConfig(snapshot_dir=Path(tmp) / "snaps"),
            worker=WorkerConfig(parallel=plan.get("lanes", LANES)),
            store=Path(tmp) / "h.db",
        )
        with engine:
            cold = _open(engine, system, "cold", 0, params)
            sessions = [_open(engine, system, "agent", i, params) for i in range(plan["sessions"])]
            prompt = len(engine.worker().lanes[0].seq.backend.tokenize(system))
    return {"cold": cold, "sessions": sessions, "prompt_tokens": prompt}


def run_shared_prefix(
    model: str | None,
    reps: int,
    threads: int,
    plan: dict[str, Any],
    progress: Progress | None = None,
) -> dict[str, Any]:
    mf = resolve_model(model)
    runs = []
    for rep in range(reps):
        if progress is not None:
            progress("shared-prefix", rep, reps)
        runs.append(_one(mf, threads, plan))
    n = plan["sessions"]
    rows = []
    for i in range(n):
        rows.append(
            {
                "session": i + 1,
                "decoded": statistics.median(r["sessions"][i]["decoded"] for r in runs),
                "ttft_ms": round(statistics.median(r["sessions"][i]["ttft_ms"] for r in runs), 1),
            }
        )
    cold = {
        "decoded": statistics.median(r["cold"]["decoded"] for r in runs),
        "ttft_ms": round(statistics.median(r["cold"]["ttft_ms"] for r in runs), 1),
    }
    return {
        "experiment": "shared_prefix",
        "model": mf.path.name,
        "threads": threads,
        "reps": reps,
        "lanes": LANES,
        **plan,  # its "lanes" when given
        "prompt_tokens": runs[0]["prompt_tokens"],
        "cold": cold,
        "rows": rows,
        "runs": runs,
    }


def shared_prefix_table(result: dict[str, Any]) -> str:
    cold = result["cold"]
    rows = result["rows"]
    total = sum(r["decoded"] for r in rows)
    lines = [
        f"shared-prefix: {result['model']}, {result['threads']} threads, {result['lanes']} "
        f"lane{'s' if result['lanes'] != 1 else ''}; {result['sessions']} sessions of one "
        "tenant, one system prompt of "
        f"{result['prompt_tokens']:,} tokens; medians of {result['reps']} runs",
        "",
        "| session | prompt tokens decoded | first TTFT | TTFT / cold |",
        "|---|---:|---:|---:|",
        f"| cold (a tenant of its own) | {cold['decoded']:,} | {cold['ttft_ms']:,.0f} ms | 1.00x |",
    ]
    for r in rows:
        lines.append(
            f"| {r['session']} | {r['decoded']:,} | {r['ttft_ms']:,.0f} ms | "
            f"{r['ttft_ms'] / cold['ttft_ms']:.2f}x |"
        )
    lines += [
        "",
        f"all {len(rows)} sessions decoded {total:,} prompt tokens "
        f"(each decoding the whole prompt: {len(rows) * cold['decoded']:,})",
    ]
    return "\n".join(lines)
