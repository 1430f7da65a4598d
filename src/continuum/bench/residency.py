"""``continuum bench residency``: what switching the active session costs.

The worker keeps one sequence in the llama.cpp context and parks the others as state snapshots
in RAM. This measures that choice against its alternative — rebuilding a session by prefilling
its tokens again — at several resident lengths: snapshot bytes, park (``state_seq_get_data``)
and restore (``set_data``) time, and re-prefill time. Each size is measured ``reps`` times,
alternating restore and re-prefill; medians are reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import long_system_prompt


def run_residency(
    model: str | None = None,
    sizes: tuple[int, ...] = (512, 1024, 2048, 4096),
    reps: int = 3,
    n_threads: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    mf = resolve_model(model)
    n_ctx = -(-(max(sizes) + 64) // 256) * 256
    cfg = LlamaConfig(n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads)
    rows = []
    with LlamaCppBackend(mf, cfg) as b:
        text_tokens = b.tokenize(long_system_prompt(max(sizes) + 200))
        for i, size in enumerate(sizes):
            if progress:
                progress(f"{size} tokens", i, len(sizes))
            tokens = [b.bos_id, *text_tokens[: size - 1]]
            save, restore, prefill, nbytes = [], [], [], 0
            for _ in range(reps):
                b.clear()
                t0 = time.perf_counter()
                b.decode(tokens)
                prefill.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                state = b.save_state()
                save.append((time.perf_counter() - t0) * 1000)
                nbytes = len(state)
                b.clear()
                t0 = time.perf_counter()
                b.load_state(state, tokens)
                restore.append((time.perf_counter() - t0) * 1000)
            rows.append(
                {
                    "tokens": size,
                    "snapshot_bytes": nbytes,
                    "park_ms": statistics.median(save),
                    "restore_ms": statistics.median(restore),
                    "reprefill_ms": statistics.median(prefill),
                }
            )
        threads = b.n_threads
    if progress:
        progress("done", len(sizes), len(sizes))
    return {
        "experiment": "residency",
        "model_digest": mf.digest,
        "model_path": str(mf.path),
        "n_threads": threads,
        "reps": reps,
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"residency · {result['n_threads']} threads · median of {result['reps']}",
        "",
        "| resident tokens | snapshot | park | restore | re-prefill | restore speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tokens']:,} | {r['snapshot_bytes'] / 2**20:.1f} MiB | "
            f"{r['park_ms']:.1f} ms | {r['restore_ms']:.1f} ms | {r['reprefill_ms']:.0f} ms | "
            f"{r['reprefill_ms'] / max(r['restore_ms'], 1e-6):.0f}x |"
        )
    return "\n".join(lines)
