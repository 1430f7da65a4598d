"""``continuum bench all``: every experiment into one results folder, then plots and a report.

``tiny=True`` runs each experiment at toy sizes (one repetition, short prompts, small indexes):
a smoke test of the whole suite in a couple of minutes, whose numbers mean nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from continuum.bench import eva, http, overhead, prefill, residency, semantic, sweep, tiers
from continuum.bench.plots import plot_all
from continuum.bench.report import render_report

Progress = Callable[[str, int, int], None]
Job = Callable[[Progress], dict[str, Any]]


def jobs(
    model: str | None, threads: int | None, reps: int, llama_server: str | None, tiny: bool
) -> Iterator[tuple[str, Job, Callable[[dict[str, Any]], str]]]:
    r = 1 if tiny else reps
    peers = ("llama-server",) if llama_server else ()
    yield (
        "eva.json",
        lambda p: eva.run_eva(
            eva.EvaConfig(
                model=model,
                reps=r,
                n_threads=threads,
                turns=3 if tiny else 16,
                max_tokens=4 if tiny else 48,
            ),
            p,
        ),
        eva.format_table,
    )
    yield (
        "sweep.json",
        lambda p: sweep.run_sweep(
            sweep.SweepConfig(
                model=model,
                sizes=(64,) if tiny else sweep.DEFAULT_SIZES,
                reps=r,
                n_threads=threads,
                max_tokens=2 if tiny else 48,
                turns=3 if tiny else 16,
                modes=("stateful", "prefix", "cold", "delta", "llama-cpp-python", *peers),
                llama_server=llama_server,
                idle_ms=20 if tiny else 250,
            ),
            p,
        ),
        sweep.format_table,
    )
    sizes = (64,) if tiny else (512, 1024, 2048, 4096)
    yield "tiers.json", lambda p: tiers.run_tiers(model, r, threads, sizes, p), tiers.format_table
    restore_sizes = (64,) if tiny else (512, 1024, 2048, 4096, 8192)
    yield (
        "restore.json",
        lambda p: tiers.run_restore(model, r, threads, restore_sizes, p),
        tiers.restore_table,
    )
    yield (
        "residency.json",
        lambda p: residency.run_residency(model, (64,) if tiny else sizes, r, threads, p),
        residency.format_table,
    )
    semantic_sizes = (50,) if tiny else (1_000, 10_000, 100_000)
    yield (
        "overhead.json",
        lambda p: overhead.run_overhead(model, threads, semantic_sizes, 64 if tiny else 1000, p),
        overhead.format_table,
    )
    yield (
        "semantic.json",
        lambda p: semantic.run_semantic(
            reps=r, sizes=semantic_sizes, queries=10 if tiny else 500, progress=p
        ),
        semantic.format_table,
    )
    yield (
        "prefill.json",
        lambda p: prefill.run_prefill(
            model,
            r,
            threads,
            (12, 40) if tiny else (10, 100, 1000),
            20 if tiny else 500,
            2000 if tiny else 200,
            3 if tiny else 8,
            progress=p,
        ),
        prefill.format_table,
    )
    yield (
        "http.json",
        lambda p: http.run_http(
            model,
            r,
            threads,
            2 if tiny else 48,
            0,
            llama_server,
            2 if tiny else 16,
            p,
            idle_ms=20 if tiny else 500,
            modes=("delta", "input", "llama-cpp-python", *peers),
        ),
        http.format_table,
    )


def run_all(
    out: str | Path,
    *,
    model: str | None = None,
    threads: int | None = None,
    reps: int = 3,
    llama_server: str | None = None,
    tiny: bool = False,
    progress: Callable[[], AbstractContextManager[Progress]],
    echo: Callable[[str], None],
) -> list[str]:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, job, table in jobs(model, threads, reps, llama_server, tiny):
        echo(f"== {name}")
        with progress() as p:
            result = job(p)
        (folder / name).write_text(json.dumps(result, indent=2))
        (folder / name.replace(".json", ".txt")).write_text(table(result) + "\n")
        written.append(name)
    plot_all(folder, folder)
    (folder / "benchmarks.md").write_text(render_report(folder))
    return written
