"""``continuum bench fleet``: throughput, TTFT and the router and Redis hops of a local fleet
at 1, 2, 3 … workers (each a fresh ``fleet up``). Registered on the group in
:mod:`continuum.cli.bench`; the measurement is :mod:`continuum.bench.fleet`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from continuum.bench.conversation import TURNS
from continuum.bench.settings import BenchModel
from continuum.cli.common import Output, emit, stderr_progress
from continuum.cli.settings_options import options, settings_from
from continuum.settings import Counts, setting

MAX_WORKERS = 64  # as `fleet up --workers`


class FleetBenchSettings(BenchModel):
    """What ``bench fleet`` can be told; the command makes its :class:`FleetPlan`."""

    workers: Counts = setting((1, 2, 3), "Worker counts, comma-separated: a fresh fleet for each.")
    sessions: int = setting(
        12, "Sessions running at once, each its own conversation.", ge=1, le=256
    )
    turns: int = setting(6, "User turns of each session.", ge=1, le=len(TURNS))
    max_tokens: int = setting(16, "Most tokens in a reply.", ge=1)
    threads: int = setting(
        1, "Threads per worker (the same in every row).", flags=("--threads", "-t"), ge=1
    )
    parallel: int = setting(4, "Lanes per worker (`serve --parallel`).", ge=1, le=32)
    n_ctx: int | None = setting(
        None, "Context per lane (default: the longest conversation fits).", ge=512
    )
    system_tokens: int = setting(
        0, "A system prompt of about N tokens per session (0: a short one).", ge=0
    )
    hop_pairs: int = setting(
        20, "Router hop: session turns sent direct and routed, alternating.", ge=1
    )
    health_pairs: int = setting(
        200, "Router hop: GET /health direct and routed, alternating.", ge=1
    )
    note: str | None = setting(
        None,
        "A line kept with the results and printed in the report (e.g. what else "
        "ran on the machine).",
    )
    plot: Path | None = setting(None, "Draw the results as a PNG here (needs matplotlib).")
    output: Output = Output()


@click.command("fleet")
@options(FleetBenchSettings)
def bench_fleet(**flags: Any) -> None:
    """The local fleet under load at each worker count: turns/s, tokens/s, TTFT p50/p95,
    every session read back (committed, in order, resets), and what the router and the
    shared Redis cost per request."""
    from continuum.bench.fleet import FleetPlan, format_table, run_fleet_bench

    s = settings_from(FleetBenchSettings, flags)
    if max(s.workers) > MAX_WORKERS:
        raise click.BadParameter(f"at most {MAX_WORKERS} workers", param_hint="'--workers'")
    plan = FleetPlan(
        workers=s.workers,
        sessions=s.sessions,
        turns=s.turns,
        max_tokens=s.max_tokens,
        threads=s.threads,
        parallel=s.parallel,
        n_ctx=s.n_ctx,
        system_tokens=s.system_tokens,
        hop_pairs=s.hop_pairs,
        health_pairs=s.health_pairs,
    )
    if s.plot:
        from continuum.bench.plots import check_matplotlib

        check_matplotlib()  # missing: say so before minutes of measuring
    with stderr_progress() as progress:
        result = run_fleet_bench(plan, s.model, progress, s.note)
    if s.plot:
        from continuum.bench.plots import plot_fleet

        plot_fleet(result, s.plot)
    emit(result, "fleet.json", s.output.out, s.output.as_json, format_table)
