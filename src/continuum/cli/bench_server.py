"""``continuum bench memory`` and ``interference``: one ``continuum serve`` process measured from
outside — what it holds in RAM beside its peers, and what a long stateless request does to the
sessions it is streaming. Each server runs alone, started for each run."""

from __future__ import annotations

import click

from continuum.cli.common import (
    emit,
    json_opt,
    llama_server_opt,
    model_opt,
    out_opt,
    parse_modes,
    reps_opt,
    stderr_progress,
    threads_opt,
)
from continuum.errors import InvalidRequest


@click.command("memory")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--n-ctx",
    type=click.IntRange(256),
    default=8192,
    show_default=True,
    help="Cells per slot (llama-server gets 4 slots of it, as serve's 4 lanes).",
)
@click.option(
    "--modes",
    default="continuum,llama-server,llama-server-swa-full",
    show_default=True,
    help="Also: continuum-judge (needs the semantic extra).",
)
@llama_server_opt
@json_opt
@out_opt
def bench_memory(
    model: str | None,
    threads: int | None,
    reps: int,
    n_ctx: int,
    modes: str,
    llama_server: str | None,
    as_json: bool,
    out: str | None,
) -> None:
    """Resident memory of `continuum serve` with its defaults, and of llama-server with as many
    slots of as many cells, each server alone after one request."""
    from continuum.backends.llamacpp import default_threads
    from continuum.bench.memory import memory_table, run_memory

    with stderr_progress() as progress:
        result = run_memory(
            model,
            reps,
            threads or default_threads(),
            n_ctx,
            parse_modes(modes),
            llama_server,
            progress,
        )
    emit(result, "memory.json", out, as_json, memory_table)


@click.command("interference")
@model_opt
@threads_opt
@reps_opt
@click.option("--sessions", type=click.IntRange(1, 32), default=4, show_default=True)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(16),
    default=2000,
    show_default=True,
    help="The stateless request's prompt.",
)
@click.option(
    "--reply-tokens",
    type=click.IntRange(16),
    default=400,
    show_default=True,
    help="Each session's reply (long enough to outlast the stateless request).",
)
@click.option("--system-tokens", type=click.IntRange(0), default=300, show_default=True)
@click.option(
    "--warmup",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Pieces every session streams before the stateless request is sent.",
)
@click.option("--n-ctx", type=click.IntRange(256), default=8192, show_default=True)
@click.option(
    "--compare",
    multiple=True,
    metavar="NAME=EXE",
    help="Also run another `continuum` executable (a before/after comparison).",
)
@json_opt
@out_opt
def bench_interference(
    model: str | None,
    threads: int | None,
    reps: int,
    sessions: int,
    prompt_tokens: int,
    reply_tokens: int,
    system_tokens: int,
    warmup: int,
    n_ctx: int,
    compare: tuple[str, ...],
    as_json: bool,
    out: str | None,
) -> None:
    """Sessions streaming replies while a long stateless request arrives: their inter-token
    gaps during it against their p50 outside it."""
    from continuum.backends.llamacpp import default_threads
    from continuum.bench.interference import interference_table, run_interference

    serves = {"continuum": ""}
    for item in compare:
        name, sep, exe = item.partition("=")
        if not sep or not name or not exe or name in serves:
            raise InvalidRequest(f"--compare takes NAME=EXE with a new name, got {item!r}")
        serves[name] = exe
    plan = {
        "sessions": sessions,
        "prompt_tokens": prompt_tokens,
        "reply_tokens": reply_tokens,
        "system_tokens": system_tokens,
        "warmup": warmup,
        "n_ctx": n_ctx,
    }
    with stderr_progress() as progress:
        result = run_interference(model, reps, threads or default_threads(), plan, serves, progress)
    emit(result, "interference.json", out, as_json, interference_table)
