"""``continuum bench overhead``: what the reuse layer itself costs, apart from the model.

- memo hit end to end, rendering + tokenizing, key derivation, prefix-trie lookup at 1k-32k
  tokens (from ``bench tiers``' overhead experiment);
- semantic lookup at 1k-100k entries, without and with the query's embedding (from
  ``bench semantic``; needs the ``semantic`` extra, skipped with a note otherwise);
- memory per resident session: the KV snapshot bytes of a parked session against the Python
  memory the session's own bookkeeping (history, segment cache) takes, measured with
  tracemalloc over several sessions of the same length.
"""

from __future__ import annotations

import statistics
import tempfile
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import TURNS, long_system_prompt
from continuum.bench.tiers import overhead as tier_overhead
from continuum.errors import MissingExtra
from continuum.params import GenerationParams
from continuum.stateful.worker import Worker, WorkerConfig


def session_memory(
    model: str | None, threads: int | None, system_tokens: int, sessions: int, turns: int
) -> dict[str, Any]:
    mf = resolve_model(model)
    params = GenerationParams(max_tokens=16)
    system = long_system_prompt(system_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = WorkerConfig(
            llama=LlamaConfig(
                n_ctx=system_tokens + 2048, n_threads=threads, n_threads_batch=threads
            ),
            session_snapshots=False,
        )
        with Worker(mf, cfg, store=Path(tmp) / "h.db") as w:
            tracemalloc.start()
            before = tracemalloc.take_snapshot()
            made = []
            for _ in range(sessions):
                s = w.create_session(system)
                for t in TURNS[:turns]:
                    s.append([{"role": "user", "content": t.content}], params)
                made.append(s)
            w.park_active()  # park the last one too: every session's KV is a snapshot
            after = tracemalloc.take_snapshot()
            tracemalloc.stop()
            total = sum(st.size_diff for st in after.compare_to(before, "filename"))
            kv = w.parked_bytes
            tokens = [len(p.resident) for p in made if p.resident]
            parked = len(tokens)
    return {
        "sessions": sessions,
        "tokens_per_session": statistics.median(tokens) if tokens else 0,
        "kv_bytes_per_session": kv / max(parked, 1),
        "bookkeeping_bytes_per_session": max(0, total - kv) / sessions,
    }


def run_overhead(
    model: str | None = None,
    threads: int | None = None,
    semantic_sizes: Sequence[int] = (1_000, 10_000, 100_000),
    system_tokens: int = 1000,
    progress: Progress | None = None,
) -> dict[str, Any]:
    mf = resolve_model(model)
    out: dict[str, Any] = {"experiment": "overhead", "model_digest": mf.digest}
    with tempfile.TemporaryDirectory() as tmp:
        if progress:
            progress("memo, key, prefix trie", 0, 3)
        out["tiers"] = tier_overhead(mf, threads, Path(tmp))
    if progress:
        progress("semantic lookup", 1, 3)
    try:
        from continuum.backends.embedders import SentenceTransformerEmbedder
        from continuum.bench.semantic import embed_latency, lookup_latency

        embedder = SentenceTransformerEmbedder()
        embed_ms = embed_latency(embedder, 3)
        out["semantic"] = {
            "embed_ms_median": statistics.median(embed_ms),
            "lookup": lookup_latency(embedder, semantic_sizes, 300, None),
        }
    except MissingExtra as e:
        out["semantic"] = {"skipped": str(e)}
    if progress:
        progress("memory per resident session", 2, 3)
    out["session_memory"] = session_memory(model, threads, system_tokens, 4, 4)
    if progress:
        progress("done", 3, 3)
    return out


def format_table(r: dict[str, Any]) -> str:
    t = r["tiers"]
    lines = [
        "overhead · the reuse layer's own cost",
        "",
        f"memo hit end to end: {t['memo_hit_us_median']:.0f} µs (render + tokenize "
        f"{t['render_and_tokenize_us']:.0f} µs, key {t['key_us']:.0f} µs, "
        f"{t['prompt_tokens']} prompt tokens)",
        "prefix-trie lookup: "
        + ", ".join(f"{p['tokens']:,} tokens {p['lookup_us']:.0f} µs" for p in t["prefix_lookup"]),
    ]
    sem = r["semantic"]
    if "skipped" in sem:
        lines.append(f"semantic lookup: skipped ({sem['skipped']})")
    else:
        lines.append(
            "semantic lookup (without the query's embedding, which costs "
            f"{sem['embed_ms_median']:.1f} ms): "
            + ", ".join(
                f"{x['entries']:,} entries {x['lookup_us_p50']:.0f} µs ({x['index']})"
                for x in sem["lookup"]
            )
        )
    m = r["session_memory"]
    lines.append(
        f"memory per resident session ({m['tokens_per_session']:.0f} tokens): KV "
        f"{m['kv_bytes_per_session'] / 1e6:.1f} MB, bookkeeping "
        f"{m['bookkeeping_bytes_per_session'] / 1e3:.0f} kB"
    )
    return "\n".join(lines)
