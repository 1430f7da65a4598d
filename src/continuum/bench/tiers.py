"""``continuum bench tiers``: seed 003's per-tier measurements, with and without the stack.

Experiments (all on the real model, greedy):

``shared_prefix``  ten ops sharing a ~3,000-character prefix: prompt tokens the backend
                   evaluates with the stack vs with ``ReusePolicy.never()``, and latency.
``memo``           one op, then five exact repeats: hits and milliseconds per repeat.
``workflow``       a scripted 20-step agent workflow (planning, tool calls, summaries, repeats,
                   shared prefixes) with and without the stack: tokens the backend evaluated,
                   backend calls eliminated, and whether the final answers match.
``restore``        layer-KV restore from RAM and from disk vs re-prefill, end to end through the
                   tier (lookup, checks, restore, first token), at several prompt lengths.
                   Before a disk restore the snapshot files leave the page cache
                   (``posix_fadvise(DONTNEED)``): "from disk" means from the disk.
``overhead``       the reuse layer's own cost: key + memo lookup, and prefix-trie lookup at
                   1k-32k tokens, in microseconds.

Modes alternate (stack first on odd repetitions, never() first on even ones); medians reported.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.backends.registry import BackendRegistry
from continuum.bench.conversation import long_system_prompt
from continuum.engine import EngineConfig, Session
from continuum.keys import op_key
from continuum.metrics import Metrics
from continuum.ops import TokenOp, ToolOp
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.results import Result
from continuum.stateful.plan import common_prefix
from continuum.store.snapshots import FileSnapshotStore
from continuum.tiers.prefix_kv import RadixTrie

PARAMS = GenerationParams(max_tokens=16)
PREFIX_CHARS = 3000  # the shared prefix of the shared-prefix experiment (seed 003: ~3,000)
QUESTIONS = [
    "What is the first rule?",
    "Summarise section 2.",
    "Who handles escalations?",
    "What is the limit for item 3?",
    "When do I ask for a record number?",
    "What happens past a deadline?",
    "Name one record type.",
    "What is section 5 about?",
    "Is shipping covered?",
    "How long should a summary be?",
]


def _op(system: str, question: str, name: str = "answer") -> TokenOp:
    return TokenOp(
        name,
        messages=({"role": "system", "content": system}, {"role": "user", "content": question}),
        params=PARAMS,
    )


def _session(
    model: ModelFile, snapshots: Path, n_ctx: int, threads: int | None, exact: bool = False
) -> Session:
    return Session(
        "bench",
        BackendRegistry(),
        model=model,
        n_ctx=n_ctx,
        n_threads=threads,
        n_slots=4,
        config=EngineConfig(snapshot_dir=snapshots, exact=exact),
    )


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def shared_prefix(
    model: ModelFile,
    reps: int,
    threads: int | None,
    tmp: Path,
    exact: bool = False,
    prefix_chars: int = PREFIX_CHARS,
) -> dict[str, Any]:
    system = long_system_prompt(700)[:prefix_chars]
    runs: dict[str, list[dict[str, Any]]] = {"stack": [], "never": []}
    for rep in range(reps):
        for mode in ("stack", "never") if rep % 2 == 0 else ("never", "stack"):
            with _session(model, tmp / f"sp-{mode}-{rep}", 4096, threads, exact) as s:
                s.policy = ReusePolicy.always() if mode == "stack" else ReusePolicy.never()
                results = [s.run(_op(system, q)) for q in QUESTIONS]
                runs[mode].append(
                    {
                        "tokens_sent": [r.metrics.prompt_tokens_evaluated for r in results],
                        "ms": [r.metrics.total_ms for r in results],
                        "ttft_ms": [r.metrics.ttft_ms for r in results],
                        "tiers": [r.metrics.hit_tier for r in results],
                        "texts": [r.text for r in results],
                        "tokens": [list(r.tokens) for r in results],
                    }
                )
    stack, never = runs["stack"][0], runs["never"][0]
    differ = mismatches(runs["stack"], runs["never"])
    sent_with = sum(stack["tokens_sent"][1:]) / (len(QUESTIONS) - 1)
    sent_without = sum(never["tokens_sent"][1:]) / (len(QUESTIONS) - 1)
    return {
        "prefix_chars": len(system),
        "calls": len(QUESTIONS),
        "tokens_sent_per_later_call_with": sent_with,
        "tokens_sent_per_later_call_without": sent_without,
        "fewer_tokens_pct": 100 * (1 - sent_with / sent_without),
        "hit_tiers": stack["tiers"],
        "median_ttft_ms_hit": _median([x for r in runs["stack"] for x in r["ttft_ms"][1:]]),
        "median_ttft_ms_without": _median([x for r in runs["never"] for x in r["ttft_ms"][1:]]),
        "median_ms_hit": _median([x for r in runs["stack"] for x in r["ms"][1:]]),
        "median_ms_without": _median([x for r in runs["never"] for x in r["ms"][1:]]),
        "answers_identical": len(QUESTIONS) * reps - len(differ),
        "answers_compared": len(QUESTIONS) * reps,
        "mismatches": differ,
    }


def mismatches(stack: list[dict[str, Any]], never: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each answer of each run that differs from the same call's answer with reuse off: the
    run, the call, the tier that served it and where the two token sequences part."""
    out = []
    for rep, (a, b) in enumerate(zip(stack, never, strict=True)):
        for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=True)):
            if x != y:
                first = common_prefix(x, y)
                out.append({"rep": rep, "call": i, "tier": a["tiers"][i], "first_token": first})
    return out


def memo(model: ModelFile, threads: int | None, tmp: Path) -> dict[str, Any]:
    with _session(model, tmp / "memo", 4096, threads) as s:
        op = _op(long_system_prompt(200), QUESTIONS[0])
        first = s.run(op)
        repeats = [s.run(op) for _ in range(5)]
    return {
        "first_ms": first.metrics.total_ms,
        "hits": sum(r.metrics.hit_tier == "memo" for r in repeats),
        "backend_calls": sum(r.metrics.backend_called for r in repeats),
        "repeat_ms": [r.metrics.total_ms for r in repeats],
        "identical": all(r.text == first.text for r in repeats),
    }


def _workflow(s: Session, prefix_chars: int) -> tuple[list[Result], int]:
    """A 20-step agent run: plan, look things up, summarise, answer, re-check."""
    system = (
        long_system_prompt(400)[: prefix_chars * 3 // 5]
        + "\n\nTools: search(query), fetch(record_id), "
        "calc(expression). Think step by step and name the tool you need."
    )
    tool_runs = 0

    def search(query: str) -> str:
        nonlocal tool_runs
        tool_runs += 1
        return f"3 records match {query!r}: R-1001 (open), R-1002 (shipped), R-1003 (late)."

    def fetch(record_id: str) -> str:
        nonlocal tool_runs
        tool_runs += 1
        return f"{record_id}: owner Dana, status late, amount 240 euros, deadline Friday."

    steps: list[TokenOp | ToolOp] = [
        _op(system, "Task: find late shipments and escalate them. Plan your steps.", "plan"),
        ToolOp("search", search, {"query": "late shipments"}),
        _op(
            system, "Search returned R-1001, R-1002, R-1003. Which should we fetch first?", "decide"
        ),
        ToolOp("fetch", fetch, {"record_id": "R-1003"}, read_only=True),
        _op(
            system,
            "R-1003: owner Dana, status late, 240 euros, deadline Friday. Escalate?",
            "decide",
        ),
        _op(system, "Task: find late shipments and escalate them. Plan your steps.", "plan"),
        ToolOp("fetch", fetch, {"record_id": "R-1003"}, read_only=True),
        _op(system, "Summarise record R-1003 in one sentence.", "summarise"),
        _op(system, "Summarise record R-1003 in one sentence.", "summarise"),
        ToolOp("search", search, {"query": "late shipments"}),
        _op(system, "Draft the escalation note for R-1003.", "draft"),
        _op(system, "Which section of the handbook covers escalation?", "lookup"),
        _op(system, "Which section of the handbook covers escalation?", "lookup"),
        ToolOp("fetch", fetch, {"record_id": "R-1001"}, read_only=True),
        _op(system, "R-1001 is open. Does it need escalation?", "decide"),
        _op(system, "Draft the escalation note for R-1003.", "draft"),
        _op(system, "List the records that were escalated.", "report"),
        _op(system, "Task: find late shipments and escalate them. Plan your steps.", "plan"),
        _op(system, "List the records that were escalated.", "report"),
        _op(system, "Write the final report in two sentences.", "report"),
    ]
    return [s.run(step) for step in steps], tool_runs


def workflow(
    model: ModelFile,
    reps: int,
    threads: int | None,
    tmp: Path,
    exact: bool = False,
    prefix_chars: int = PREFIX_CHARS,
) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {"stack": [], "never": []}
    for rep in range(reps):
        for mode in ("stack", "never") if rep % 2 == 0 else ("never", "stack"):
            with _session(model, tmp / f"wf-{mode}-{rep}", 4096, threads, exact) as s:
                s.policy = ReusePolicy.always() if mode == "stack" else ReusePolicy.never()
                t0 = time.perf_counter()
                results, tool_runs = _workflow(s, prefix_chars)
                out[mode].append(
                    {
                        "seconds": time.perf_counter() - t0,
                        "tokens_sent": sum(r.metrics.prompt_tokens_evaluated for r in results),
                        "prompt_tokens": sum(r.metrics.prompt_tokens for r in results),
                        "backend_calls": sum(r.metrics.backend_called for r in results),
                        "tiers": [r.metrics.hit_tier for r in results],
                        "tool_runs": tool_runs,
                        "texts": [r.text for r in results],
                        "tokens": [list(r.tokens) for r in results],
                    }
                )
    stack, never = out["stack"][0], out["never"][0]
    differ = mismatches(out["stack"], out["never"])
    steps = len(stack["tiers"])
    return {
        "steps": len(stack["tiers"]),
        "tokens_sent_with": stack["tokens_sent"],
        "tokens_sent_without": never["tokens_sent"],
        "tokens_saved_pct": 100 * (1 - stack["tokens_sent"] / never["tokens_sent"]),
        "backend_calls_with": stack["backend_calls"],
        "backend_calls_without": never["backend_calls"],
        "calls_eliminated": never["backend_calls"] - stack["backend_calls"],
        "tool_runs_with": stack["tool_runs"],
        "tool_runs_without": never["tool_runs"],
        "tiers": stack["tiers"],
        "median_seconds_with": _median([r["seconds"] for r in out["stack"]]),
        "median_seconds_without": _median([r["seconds"] for r in out["never"]]),
        "answers_identical": steps * reps - len(differ),
        "answers_compared": steps * reps,
        "mismatches": differ,
    }


def restore(
    model: ModelFile,
    sizes: tuple[int, ...],
    reps: int,
    threads: int | None,
    tmp: Path,
    progress: Progress | None,
) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        if progress:
            progress(f"restore at {size} tokens", 0, 0)
        system = long_system_prompt(size)
        prefill, ram, disk, ram_restore, disk_restore = [], [], [], [], []
        q = QUESTIONS[0]  # the same prompt each time: the suffix decoded after a hit is minimal
        with _session(model, tmp / f"restore-{size}", size + 1024, threads) as s:
            for rep in range(reps):
                # an empty layer-KV tier per repetition: the first restore must come from RAM
                s.layer.clear()
                s.policy = ReusePolicy.never()
                prefill.append(s.run(_op(system, q, f"p{rep}")).metrics.ttft_ms)
                s.policy = ReusePolicy.always()
                s.run(_op(system, q, f"seed{rep}"))  # cold, pinned
                s.drop_resident()  # spilled to layer KV (RAM + disk)
                r = s.run(_op(system, q, f"ram{rep}"))
                assert _restored(r.metrics) == "ram"
                ram.append(r.metrics.ttft_ms)
                ram_restore.append(r.metrics.lookup_ms)
                s.drop_resident()
                s.layer.store.release_ram()  # the next restore must come from disk,
                store = s.layer.store
                if isinstance(store, FileSnapshotStore):  # and not from the page cache
                    store.drop_page_cache()
                r = s.run(_op(system, q, f"disk{rep}"))
                assert _restored(r.metrics) == "disk"
                disk.append(r.metrics.ttft_ms)
                disk_restore.append(r.metrics.lookup_ms)
                s.drop_resident()
                n_tokens = r.metrics.prompt_tokens
                suffix = r.metrics.prompt_tokens_evaluated
        rows.append(
            {
                "prompt_tokens": n_tokens,
                "suffix_tokens_decoded": suffix,
                "reprefill_ttft_ms": _median(prefill),
                "ram_lookup_restore_ms": _median(ram_restore),
                "disk_lookup_restore_ms": _median(disk_restore),
                "ram_ttft_ms": _median(ram),
                "disk_ttft_ms": _median(disk),
                "ram_speedup": _median(prefill) / _median(ram),
                "disk_speedup": _median(prefill) / _median(disk),
            }
        )
    return rows


def overhead(model: ModelFile, threads: int | None, tmp: Path) -> dict[str, Any]:
    with _session(model, tmp / "overhead", 4096, threads) as s:
        op = _op(long_system_prompt(1000), QUESTIONS[0])
        s.run(op)
        hits = [s.run(op).metrics.total_ms * 1000 for _ in range(50)]
        b = s.backend
        tokens = b.prompt_tokens(op.messages, None)
        t0 = time.perf_counter()
        for _ in range(200):
            b.prompt_tokens(op.messages, None)
        render_tokenize_us = (time.perf_counter() - t0) / 200 * 1e6
        t0 = time.perf_counter()
        for _ in range(200):
            op_key(
                namespace="bench",
                backend=b.name,
                model=b.model_identity,
                op_name="answer",
                params=op.params,
                tokens=tokens,
            )
        key_us = (time.perf_counter() - t0) / 200 * 1e6
    rng = random.Random(0)
    prefix_rows = []
    for n in (1024, 4096, 16384, 32768):
        trie: RadixTrie[int] = RadixTrie(64)
        base = [rng.randrange(262144) for _ in range(n)]
        for i in range(32):
            trie.insert("ns", [*base[: n // 2], *(rng.randrange(262144) for _ in range(n // 2))], i)
        query = [*base[: n // 2], *(rng.randrange(262144) for _ in range(n // 2))]
        t0 = time.perf_counter()
        for _ in range(50):
            trie.longest("ns", query)
        prefix_rows.append({"tokens": n, "lookup_us": (time.perf_counter() - t0) / 50 * 1e6})
    return {
        "prompt_tokens": len(tokens),
        "memo_hit_us_median": _median(hits),
        "render_and_tokenize_us": render_tokenize_us,
        "key_us": key_us,
        "prefix_lookup": prefix_rows,
    }


def run_tiers(
    model: str | None = None,
    reps: int = 3,
    threads: int | None = None,
    sizes: tuple[int, ...] = (512, 1024, 2048, 4096),
    progress: Progress | None = None,
    *,
    exact: bool = False,
    prefix_chars: int = PREFIX_CHARS,
) -> dict[str, Any]:
    """``exact``: the shared-prefix and workflow experiments run an exact stack
    (``EngineConfig.exact``). ``prefix_chars``: the shared prefix's length (the workflow's
    system prompt is three fifths of it); ``bench all --tiny`` shortens it."""
    mf = resolve_model(model)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        steps = ["shared_prefix", "memo", "workflow", "restore", "overhead"]
        out: dict[str, Any] = {
            "experiment": "tiers",
            "model": mf.path.name,
            "model_digest": mf.digest,
            "reps": reps,
            "exact": exact,
        }
        for i, name in enumerate(steps):
            if progress:
                progress(name, i, len(steps))
            if name == "shared_prefix":
                out[name] = shared_prefix(mf, reps, threads, tmp, exact, prefix_chars)
            elif name == "memo":
                out[name] = memo(mf, threads, tmp)
            elif name == "workflow":
                out[name] = workflow(mf, reps, threads, tmp, exact, prefix_chars)
            elif name == "restore":
                out[name] = restore(mf, sizes, reps, threads, tmp, progress)
            else:
                out[name] = overhead(mf, threads, tmp)
        if progress:
            progress("done", len(steps), len(steps))
    return out


def run_restore(
    model: str | None = None,
    reps: int = 3,
    threads: int | None = None,
    sizes: tuple[int, ...] = (512, 1024, 2048, 4096, 8192),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``continuum bench restore``: the restore experiment on its own, up to 8k tokens."""
    mf = resolve_model(model)
    with tempfile.TemporaryDirectory() as d:
        rows = restore(mf, sizes, reps, threads, Path(d), progress)
    return {"experiment": "restore", "model_digest": mf.digest, "reps": reps, "restore": rows}


def restore_table(r: dict[str, Any]) -> str:
    lines = [
        f"restore · median of {r['reps']}",
        "",
        "| prompt tokens | re-prefill TTFT | RAM: TTFT | disk: TTFT | speed-up RAM / disk |",
        "|---|---|---|---|---|",
    ]
    for row in r["restore"]:
        lines.append(
            f"| {row['prompt_tokens']:,} | {row['reprefill_ttft_ms']:.0f} ms | "
            f"{row['ram_ttft_ms']:.1f} ms | {row['disk_ttft_ms']:.1f} ms | "
            f"{row['ram_speedup']:.0f}x / {row['disk_speedup']:.0f}x |"
        )
    return "\n".join(lines)


def format_table(r: dict[str, Any]) -> str:
    sp, me, wf, oh = r["shared_prefix"], r["memo"], r["workflow"], r["overhead"]
    lines = [
        f"tiers · {r.get('model', '')} · median of {r['reps']}"
        + (" · exact (EngineConfig.exact)" if r.get("exact") else ""),
        "",
        "| experiment | with the stack | without | |",
        "|---|---|---|---|",
        f"| shared ~{sp['prefix_chars']:,}-char prefix, tokens sent per later call | "
        f"{sp['tokens_sent_per_later_call_with']:.0f} | "
        f"{sp['tokens_sent_per_later_call_without']:.0f} | {sp['fewer_tokens_pct']:.1f}% fewer |",
        f"| shared prefix, median TTFT of later calls | {sp['median_ttft_ms_hit']:.0f} ms | "
        f"{sp['median_ttft_ms_without']:.0f} ms | answers identical "
        f"{sp['answers_identical']}/{sp['answers_compared']} |",
        f"| memo, 5 exact repeats | {me['hits']}/5 hits, {me['backend_calls']} backend calls, "
        f"median {_median(me['repeat_ms']):.2f} ms | {me['first_ms']:.0f} ms cold | |",
        f"| 20-step workflow, prompt tokens evaluated | {wf['tokens_sent_with']:,} | "
        f"{wf['tokens_sent_without']:,} | {wf['tokens_saved_pct']:.1f}% saved |",
        f"| 20-step workflow, backend calls | {wf['backend_calls_with']} | "
        f"{wf['backend_calls_without']} | {wf['calls_eliminated']} eliminated |",
        f"| 20-step workflow, tool runs | {wf['tool_runs_with']} | {wf['tool_runs_without']} | "
        "read-only tools memoised |",
        f"| 20-step workflow, wall time | {wf['median_seconds_with']:.1f} s | "
        f"{wf['median_seconds_without']:.1f} s | answers identical "
        f"{wf['answers_identical']}/{wf['answers_compared']} |",
        "",
        "| prompt tokens | re-prefill TTFT | RAM: lookup+restore | RAM: TTFT | disk: "
        "lookup+restore | disk: TTFT | TTFT speed-up RAM / disk |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["restore"]:
        lines.append(
            f"| {row['prompt_tokens']:,} | {row['reprefill_ttft_ms']:.0f} ms | "
            f"{row['ram_lookup_restore_ms']:.1f} ms | {row['ram_ttft_ms']:.1f} ms | "
            f"{row['disk_lookup_restore_ms']:.1f} ms | {row['disk_ttft_ms']:.1f} ms | "
            f"{row['ram_speedup']:.0f}x / {row['disk_speedup']:.0f}x |"
        )
    lines += [
        "",
        f"overhead ({oh['prompt_tokens']} prompt tokens): memo hit end to end "
        f"{oh['memo_hit_us_median']:.0f} µs (render + tokenize {oh['render_and_tokenize_us']:.0f}"
        f" µs, key {oh['key_us']:.0f} µs); prefix-trie lookup "
        + ", ".join(f"{p['tokens']:,} tokens {p['lookup_us']:.0f} µs" for p in oh["prefix_lookup"]),
    ]
    for name, part in (("shared prefix", sp), ("workflow", wf)):
        for m in part.get("mismatches", ()):
            lines.append(
                f"answer differs from reuse off: {name}, run {m['rep'] + 1}, call {m['call'] + 1} "
                f"({m['tier']}), from token {m['first_token']}"
            )
    return "\n".join(lines)


def _restored(m: Metrics) -> str:
    """Where a layer-KV hit came from ("ram" | "disk"), "" for any other tier."""
    t = m.tier("layer_kv")
    return t.source if m.hit_tier == "layer_kv" and t is not None else ""
