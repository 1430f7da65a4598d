"""``continuum bench all``: every experiment into one results folder, then plots and a report.

``tiny=True`` runs each experiment at toy sizes (one repetition, short prompts, small indexes):
a smoke test of the whole suite in a couple of minutes, whose numbers mean nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuum.backends.progress import Progress
from continuum.bench import eva, http, overhead, prefill, residency, semantic, sweep, tiers
from continuum.bench.plots import plot_all
from continuum.bench.report import render_report

Job = Callable[[Progress], dict[str, Any]]
Entry = tuple[str, Job, Callable[[dict[str, Any]], str]]


@dataclass(frozen=True, slots=True)
class _Suite:
    """One suite run's settings, shared by every job; ``reps`` is already 1 when ``tiny``."""

    model: str | None
    threads: int | None
    reps: int
    llama_server: str | None
    tiny: bool

    @property
    def peers(self) -> tuple[str, ...]:
        return ("llama-server",) if self.llama_server else ()

    @property
    def tier_sizes(self) -> tuple[int, ...]:
        return (64,) if self.tiny else (512, 1024, 2048, 4096)

    @property
    def semantic_sizes(self) -> tuple[int, ...]:
        return (50,) if self.tiny else (1_000, 10_000, 100_000)


def _eva(s: _Suite) -> Entry:
    return (
        "eva.json",
        lambda p: eva.run_eva(
            eva.EvaConfig(
                model=s.model,
                reps=s.reps,
                n_threads=s.threads,
                turns=3 if s.tiny else 16,
                max_tokens=4 if s.tiny else 48,
            ),
            p,
        ),
        eva.format_table,
    )


def _sweep(s: _Suite) -> Entry:
    return (
        "sweep.json",
        lambda p: sweep.run_sweep(
            sweep.SweepConfig(
                model=s.model,
                sizes=(64,) if s.tiny else sweep.DEFAULT_SIZES,
                reps=s.reps,
                n_threads=s.threads,
                max_tokens=2 if s.tiny else 48,
                turns=3 if s.tiny else 16,
                modes=("stateful", "prefix", "cold", "delta", "llama-cpp-python", *s.peers),
                llama_server=s.llama_server,
                idle_ms=20 if s.tiny else 250,
            ),
            p,
        ),
        sweep.format_table,
    )


def _tiers(s: _Suite) -> Entry:
    return (
        "tiers.json",
        lambda p: tiers.run_tiers(
            s.model,
            s.reps,
            s.threads,
            s.tier_sizes,
            p,
            prefix_chars=600 if s.tiny else tiers.PREFIX_CHARS,
        ),
        tiers.format_table,
    )


def _restore(s: _Suite) -> Entry:
    sizes = (64,) if s.tiny else (512, 1024, 2048, 4096, 8192)
    return (
        "restore.json",
        lambda p: tiers.run_restore(s.model, s.reps, s.threads, sizes, p),
        tiers.restore_table,
    )


def _residency(s: _Suite) -> Entry:
    return (
        "residency.json",
        lambda p: residency.run_residency(s.model, s.tier_sizes, s.reps, s.threads, p),
        residency.format_table,
    )


def _overhead(s: _Suite) -> Entry:
    return (
        "overhead.json",
        lambda p: overhead.run_overhead(
            s.model, s.threads, s.semantic_sizes, 64 if s.tiny else 1000, p
        ),
        overhead.format_table,
    )


def _semantic(s: _Suite) -> Entry:
    return (
        "semantic.json",
        lambda p: semantic.run_semantic(
            reps=s.reps, sizes=s.semantic_sizes, queries=10 if s.tiny else 500, progress=p
        ),
        semantic.format_table,
    )


def _prefill(s: _Suite) -> Entry:
    return (
        "prefill.json",
        lambda p: prefill.run_prefill(
            prefill.PrefillConfig(
                model=s.model,
                reps=s.reps,
                threads=s.threads,
                sizes=(12, 40) if s.tiny else (10, 100, 1000),
                idle_ms=20 if s.tiny else 500,
                rate=2000 if s.tiny else 200,
                max_tokens=3 if s.tiny else 8,
            ),
            p,
        ),
        prefill.format_table,
    )


def _http(s: _Suite) -> Entry:
    return (
        "http.json",
        lambda p: http.run_http(
            http.HttpConfig(
                model=s.model,
                reps=s.reps,
                threads=s.threads,
                max_tokens=2 if s.tiny else 48,
                system_tokens=0,
                llama_server=s.llama_server,
                turns=2 if s.tiny else 16,
                idle_ms=20 if s.tiny else 500,
                modes=("delta", "input", "llama-cpp-python", *s.peers),
            ),
            p,
        ),
        http.format_table,
    )


# the suite's order: each job's results file, how to run it, and its table
_JOBS: tuple[Callable[[_Suite], Entry], ...] = (
    _eva,
    _sweep,
    _tiers,
    _restore,
    _residency,
    _overhead,
    _semantic,
    _prefill,
    _http,
)


def jobs(
    model: str | None, threads: int | None, reps: int, llama_server: str | None, tiny: bool
) -> Iterator[Entry]:
    suite = _Suite(model, threads, 1 if tiny else reps, llama_server, tiny)
    for job in _JOBS:
        yield job(suite)


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
