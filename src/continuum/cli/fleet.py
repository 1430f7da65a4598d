"""``continuum fleet``: several ``continuum serve`` workers behind HAProxy, sharing one Redis
(:mod:`continuum.server.fleet` starts and stops the processes; ``fleet config`` prints the
HAProxy configuration it writes).

``fleet up`` runs a fleet until SIGINT/SIGTERM, printing the router's URL on stdout.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from continuum.server.fleet import Fleet, haproxy_config, worker_args
from continuum.store.stores import cache_dir


def run_fleet(
    *,
    workers: int,
    port: int,
    store: str | None,
    directory: Path | None,
    serve_args: list[str],
    shared_graph: bool = False,
) -> None:
    """Start the fleet, print the router's URL on stdout, and run until SIGINT/SIGTERM."""
    fleet = Fleet(directory or cache_dir() / "fleet")
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        fleet.start(
            workers=workers,
            port=port,
            store=store,
            serve_args=serve_args,
            shared_graph=shared_graph,
        )
        click.echo(f"{fleet.url}/v1")
        sys.stdout.flush()
        while not stopping:
            time.sleep(0.2)
    finally:
        click.echo("stopping the fleet (workers park their sessions in Redis)", err=True)
        fleet.stop()


@click.group()
def fleet() -> None:
    """Several workers behind HAProxy, sharing one Redis (a local fleet)."""


@fleet.command("config")
@click.option("--workers", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--first-worker-port", type=click.IntRange(1, 65535), default=8001, show_default=True)
def fleet_config(workers: int, port: int, first_worker_port: int) -> None:
    """Print the HAProxy configuration for WORKERS workers on consecutive ports."""
    click.echo(
        haproxy_config(list(range(first_worker_port, first_worker_port + workers)), port), nl=False
    )


@fleet.command("up")
@click.option("--workers", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--store", default=None, help="A running Redis (redis://…); default: start one.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="Logs, haproxy.cfg, Redis data, fleet.json (<cache>/fleet).",
)
@click.option("--model", default=None, help="Model alias or GGUF path for every worker.")
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=None,
    help="Threads per worker (default: the cores shared out).",
)
@click.option("--n-ctx", type=int, default=8192, show_default=True)
@click.option("--parallel", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option(
    "--admin-key",
    envvar="CONTINUUM_ADMIN_KEY",
    default=None,
    help="Every worker's admin key (POST /admin/drain).",
)
@click.option(
    "--semantic",
    is_flag=True,
    help="The semantic tier on every worker, its entries shared in Redis.",
)
@click.option(
    "--graph", "shared_graph", is_flag=True, help="One memory graph in Redis for every worker."
)
def fleet_up(
    workers: int,
    port: int,
    store: str | None,
    directory: str | None,
    model: str | None,
    threads: int | None,
    n_ctx: int,
    parallel: int,
    admin_key: str | None,
    semantic: bool,
    shared_graph: bool,
) -> None:
    """Start Redis, WORKERS `continuum serve` workers and HAProxy; run until Ctrl-C."""
    run_fleet(
        workers=workers,
        port=port,
        store=store,
        directory=Path(directory) if directory else None,
        serve_args=worker_args(
            workers=workers,
            threads=threads,
            n_ctx=n_ctx,
            parallel=parallel,
            model=model,
            admin_key=admin_key,
            semantic=semantic,
        ),
        shared_graph=shared_graph,
    )
