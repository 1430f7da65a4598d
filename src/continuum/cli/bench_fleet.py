"""``continuum bench fleet``: throughput, TTFT and the router and Redis hops of a local fleet
at 1, 2, 3 … workers (each a fresh ``fleet up``). Registered on the group in
:mod:`continuum.cli.bench`; the measurement is :mod:`continuum.bench.fleet`."""

from __future__ import annotations

from pathlib import Path

import click

from continuum.bench.conversation import TURNS
from continuum.cli.common import emit, json_opt, model_opt, out_opt, parse_sizes, stderr_progress

MAX_WORKERS = 64  # as `fleet up --workers`


@click.command("fleet")
@model_opt
@click.option(
    "--workers",
    default="1,2,3",
    show_default=True,
    help="Worker counts, comma-separated: a fresh fleet for each.",
)
@click.option(
    "--sessions",
    type=click.IntRange(1, 256),
    default=12,
    show_default=True,
    help="Sessions running at once, each its own conversation.",
)
@click.option("--turns", type=click.IntRange(1, len(TURNS)), default=6, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=16, show_default=True)
@click.option(
    "--threads",
    "-t",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Threads per worker (the same in every row).",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 32),
    default=4,
    show_default=True,
    help="Lanes per worker (`serve --parallel`).",
)
@click.option(
    "--n-ctx",
    type=click.IntRange(512),
    default=None,
    help="Context per lane (default: the longest conversation fits).",
)
@click.option(
    "--system-tokens",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="A system prompt of about N tokens per session (0: a short one).",
)
@click.option(
    "--hop-pairs",
    type=click.IntRange(1),
    default=20,
    show_default=True,
    help="Router hop: session turns sent direct and routed, alternating.",
)
@click.option(
    "--health-pairs",
    type=click.IntRange(1),
    default=200,
    show_default=True,
    help="Router hop: GET /health direct and routed, alternating.",
)
@click.option(
    "--note",
    default=None,
    help="A line kept with the results and printed in the report (e.g. what else "
    "ran on the machine).",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw the results as a PNG here (needs matplotlib).",
)
@json_opt
@out_opt
def bench_fleet(
    model: str | None,
    workers: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    threads: int,
    parallel: int,
    n_ctx: int | None,
    system_tokens: int,
    hop_pairs: int,
    health_pairs: int,
    note: str | None,
    plot_path: str | None,
    as_json: bool,
    out: str | None,
) -> None:
    """The local fleet under load at each worker count: turns/s, tokens/s, TTFT p50/p95,
    every session read back (committed, in order, resets), and what the router and the
    shared Redis cost per request."""
    from continuum.bench.fleet import FleetPlan, format_table, run_fleet_bench

    try:
        counts = parse_sizes(workers, least=1)
    except click.BadParameter as e:
        e.param_hint = "'--workers'"
        raise
    if max(counts) > MAX_WORKERS:
        raise click.BadParameter(f"at most {MAX_WORKERS} workers", param_hint="'--workers'")
    plan = FleetPlan(
        workers=counts,
        sessions=sessions,
        turns=turns,
        max_tokens=max_tokens,
        threads=threads,
        parallel=parallel,
        n_ctx=n_ctx,
        system_tokens=system_tokens,
        hop_pairs=hop_pairs,
        health_pairs=health_pairs,
    )
    if plot_path:
        from continuum.bench.plots import check_matplotlib

        check_matplotlib()  # missing: say so before minutes of measuring
    with stderr_progress() as progress:
        result = run_fleet_bench(plan, model, progress, note)
    if plot_path:
        from continuum.bench.plots import plot_fleet

        plot_fleet(result, Path(plot_path))
    emit(result, "fleet.json", out, as_json, format_table)
