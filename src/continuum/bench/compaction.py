"""``continuum bench compaction``: what summary compaction costs and what it keeps.

Conversations that state facts early and ask for them back later run on a session whose
high-water mark holds only a few turns, once per compaction mode: ``window`` (the turns leaving
the window are dropped from it) and ``summary`` (the model summarises the conversation into a
continuity note). A retention check passes when the reply contains the expected answer.

The conversations: seed 000's (``dev``: the one the summary instruction was chosen on) and the
held-out set in ``bench/data/retention_heldout.json``, written by a helper who had not seen the
design and committed untouched. Only held-out figures count as retention results.

Cost: the turns whose window moved against the others of the same run — TTFT (a summary is
generated inside it), the summary's decoded and generated tokens and wall time, and the tokens
of the window rebuilt after the wake prefix. Modes alternate run by run; medians are reported.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import SYSTEM, TURNS
from continuum.metrics import Metrics
from continuum.params import GenerationParams
from continuum.stateful.compaction import MODES
from continuum.stateful.worker import Worker, WorkerConfig


def conversations() -> list[dict[str, Any]]:
    """Seed 000's conversation (dev), then the held-out ones."""
    dev = {
        "name": "seed000 (dev)",
        "system": SYSTEM,
        "turns": [{"content": t.content, "expect": t.expect} for t in TURNS],
        "held_out": False,
    }
    raw = resources.files("continuum.bench").joinpath("data/retention_heldout.json").read_text()
    held = [{**c, "held_out": True} for c in json.loads(raw)["conversations"]]
    return [dev, *held]


def _run_one(w: Worker, conv: dict[str, Any], params: GenerationParams) -> dict[str, Any]:
    s = w.create_session(conv["system"])
    checks: list[bool] = []
    moved: list[Metrics] = []
    plain: list[Metrics] = []
    for t in conv["turns"]:
        r = s.append([{"role": "user", "content": t["content"]}], params)
        m = r.metrics
        if t["expect"] is not None:
            checks.append(t["expect"].lower() in r.text.lower())
        (moved if m.resets else plain).append(m)
    c = [m.compaction for m in moved if m.compaction is not None]
    spent = [m.compaction.summary_evaluated if m.compaction else 0 for m in moved]
    return {
        "passed": sum(checks),
        "checks": len(checks),
        "compactions": len(c),
        "moves": len(moved),
        "ttft_moved_ms": [m.ttft_ms for m in moved],
        "ttft_other_ms": [m.ttft_ms for m in plain],
        "ttft_all_ms": sum(m.ttft_ms for m in [*moved, *plain]),
        "summary_ms": [x.summary_ms for x in c],
        "summary_evaluated": [x.summary_evaluated for x in c],
        "summary_generated": [x.summary_generated for x in c],
        "rebuilt": [m.prompt_tokens_evaluated - n for m, n in zip(moved, spent, strict=True)],
        "note": s.transcript.note.text if s.transcript.note is not None else None,
    }


def run_compaction(
    model: str | None = None,
    reps: int = 1,
    high_water: int = 300,
    max_tokens: int = 40,
    note_tokens: int = 96,
    n_threads: int | None = 2,
    progress: Progress | None = None,
    only: int | None = None,
) -> dict[str, Any]:
    """Run every conversation (the first ``only`` of them) in both modes, ``reps`` times."""
    mf = resolve_model(model)
    convs = conversations()[:only]
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c["name"]: {m: [] for m in MODES} for c in convs
    }
    llama = LlamaConfig(n_ctx=1024, n_threads=n_threads, n_threads_batch=n_threads)
    total, done = reps * len(convs) * len(MODES), 0
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for i, conv in enumerate(convs):
                order = MODES if (rep + i) % 2 == 0 else MODES[::-1]
                for mode in order:
                    if progress:
                        progress(f"{conv['name']}: {mode}", done, total)
                    cfg = WorkerConfig(
                        llama=llama,
                        high_water=high_water,
                        compaction=mode,
                        note_tokens=note_tokens,
                        session_snapshots=False,
                    )
                    with Worker(mf, cfg, store=Path(tmp) / f"{rep}-{i}-{mode}.db") as w:
                        runs[conv["name"]][mode].append(_run_one(w, conv, params))
                    done += 1
    return {
        "experiment": "compaction",
        "model": mf.path.name,
        "model_digest": mf.digest,
        "machine": {"model_path": str(mf.path), "n_threads": n_threads},
        "n_threads": n_threads,
        "high_water": high_water,
        "max_tokens": max_tokens,
        "note_tokens": note_tokens,
        "reps": reps,
        "rows": _rows(convs, runs),
    }


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _flat(rs: list[dict[str, Any]], key: str) -> list[float]:
    return [x for r in rs for x in r[key]]


def _rows(
    convs: list[dict[str, Any]], runs: dict[str, dict[str, list[dict[str, Any]]]]
) -> list[dict[str, Any]]:
    rows = []
    for conv in convs:
        for mode in MODES:
            rs = runs[conv["name"]][mode]
            rows.append(
                {
                    "conversation": conv["name"],
                    "held_out": conv["held_out"],
                    "mode": mode,
                    "passed": statistics.median(r["passed"] for r in rs),
                    "checks": rs[0]["checks"],
                    "compactions": statistics.median(r["compactions"] for r in rs),
                    "window_moves": statistics.median(r["moves"] for r in rs),
                    "ttft_moved_ms": _median(_flat(rs, "ttft_moved_ms")),
                    "ttft_other_ms": _median(_flat(rs, "ttft_other_ms")),
                    "ttft_all_ms": statistics.median(r["ttft_all_ms"] for r in rs),
                    "summary_ms": _median(_flat(rs, "summary_ms")),
                    "summary_evaluated": _median(_flat(rs, "summary_evaluated")),
                    "summary_generated": _median(_flat(rs, "summary_generated")),
                    "rebuilt_tokens": _median(_flat(rs, "rebuilt")),
                    "last_note": rs[-1]["note"],
                }
            )
    return rows


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"compaction · {r['model']} · high-water {r['high_water']} tokens · replies "
        f"≤ {r['max_tokens']} · notes ≤ {r['note_tokens']} · {r['n_threads']} threads · "
        f"medians of {r['reps']} run(s)",
        "",
        "| conversation | mode | retention | window moves | compactions | TTFT moving / "
        "other turns (ms) | TTFT, all turns (s) | summary ms | summary decoded / generated | "
        "rebuilt after wake |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['conversation']} | {row['mode']} | {row['passed']:g} / {row['checks']} | "
            f"{row['window_moves']:g} | {row['compactions']:g} | "
            f"{_ms(row['ttft_moved_ms'])} / {_ms(row['ttft_other_ms'])} | "
            f"{row['ttft_all_ms'] / 1000:.1f} | "
            f"{_ms(row['summary_ms'])} | {_ms(row['summary_evaluated'])} / "
            f"{_ms(row['summary_generated'])} | {_ms(row['rebuilt_tokens'])} |"
        )
    held = [x for x in r["rows"] if x["held_out"]]
    for mode in MODES:
        got = [x for x in held if x["mode"] == mode]
        passed, checks = sum(x["passed"] for x in got), sum(x["checks"] for x in got)
        lines.append(f"held-out retention, {mode}: {passed:g} / {checks}")
    return "\n".join(lines)


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """The compaction section of ``bench report``, and what it did not keep."""
    cmd = (
        f"continuum bench compaction --reps {data['reps']} --high-water {data['high_water']} "
        f"--max-tokens {data['max_tokens']} --note-tokens {data['note_tokens']}"
    )
    lines += [
        "## Compaction: summarised vs windowed",
        "",
        f"Model {data['model']}. Command: `{cmd}`",
        "",
        *format_table(data).splitlines(),
        "",
    ]
    by = {(x["conversation"], x["mode"]): x for x in data["rows"]}
    slower = [
        (name, row["ttft_moved_ms"], by[(name, "window")]["ttft_moved_ms"])
        for (name, mode), row in by.items()
        if mode == "summary"
        and row["ttft_moved_ms"]
        and by[(name, "window")]["ttft_moved_ms"]
        and row["ttft_moved_ms"] > by[(name, "window")]["ttft_moved_ms"]
    ]
    if slower:
        lo = min(a / b for _, a, b in slower)
        hi = max(a / b for _, a, b in slower)
        misses.append(
            f"Compaction: a turn that compacts takes {lo:.1f}-{hi:.1f}x the TTFT of a windowed "
            f"window move ({len(slower)} of {len(by) // 2} conversations): the summary is "
            "generated inside it. Over a whole conversation it moves the window less often."
        )
    held = [x for x in data["rows"] if x["held_out"] and x["mode"] == "summary"]
    passed, checks = sum(x["passed"] for x in held), sum(x["checks"] for x in held)
    if checks and passed < checks:
        misses.append(
            f"Compaction keeps {passed:g} of {checks} held-out facts on {data['model']} (the "
            "windowed session keeps only what is still in its window): the model's "
            "summaries drop facts (each run's last note is in compaction.json)."
        )


__all__ = ["MODES", "conversations", "format_table", "report_section", "run_compaction"]
