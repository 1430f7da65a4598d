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
from typing import Any

import click

from continuum.cli.settings_options import options, settings_from
from continuum.server.fleet import Fleet, haproxy_config, worker_args
from continuum.settings import Settings, setting
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


class FleetSettings(Settings):
    """What ``continuum fleet up`` can be told: the fleet's shape, and what every worker runs."""

    workers: int = setting(3, "Workers (`continuum serve` processes) behind HAProxy.", ge=1, le=64)
    port: int = setting(
        8000, "HAProxy's port (the workers take free ports on 127.0.0.1).", ge=1, le=65535
    )
    store: str | None = setting(None, "A running Redis (redis://…); default: start one.")
    directory: Path | None = setting(
        None,
        "Logs, haproxy.cfg, Redis data, fleet.json (<cache>/fleet).",
        flags=("--dir",),
        directory=True,
    )
    model: str | None = setting(None, "Model alias or GGUF path for every worker.")
    threads: int | None = setting(None, "Threads per worker (default: the cores shared out).", ge=1)
    n_ctx: int = setting(8192, "Every worker's context size.", ge=1)
    parallel: int = setting(4, "Every worker's lanes (serve's --parallel).", ge=1, le=32)
    admin_key: str | None = setting(
        None,
        "Every worker's admin key (POST /admin/drain).",
        envvar="CONTINUUM_ADMIN_KEY",
        secret=True,
    )
    semantic: bool = setting(
        False, "The semantic tier on every worker, its entries shared in Redis."
    )
    graph: bool = setting(False, "One memory graph in Redis for every worker.")


@fleet.command("up")
@options(FleetSettings)
def fleet_up(**flags: Any) -> None:
    """Start Redis, WORKERS `continuum serve` workers and HAProxy; run until Ctrl-C."""
    s = settings_from(FleetSettings, flags)
    run_fleet(
        workers=s.workers,
        port=s.port,
        store=s.store,
        directory=s.directory,
        serve_args=worker_args(
            workers=s.workers,
            threads=s.threads,
            n_ctx=s.n_ctx,
            parallel=s.parallel,
            model=s.model,
            admin_key=s.admin_key,
            semantic=s.semantic,
        ),
        shared_graph=s.graph,
    )
