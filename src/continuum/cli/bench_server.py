"""``continuum bench memory`` and ``interference``: one ``continuum serve`` process measured from
outside — what it holds in RAM beside its peers, and what a long stateless request does to the
sessions it is streaming. Each server runs alone, started for each run."""

from __future__ import annotations

from typing import Any

import click

from continuum.bench.settings import BenchSettings
from continuum.cli.common import (
    Output,
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
from continuum.cli.settings_options import options, settings_from
from continuum.errors import InvalidRequest
from continuum.settings import setting


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


class InterferenceSettings(BenchSettings):
    """What ``bench interference`` can be told."""

    sessions: int = setting(4, "Sessions streaming replies.", ge=1, le=32)
    prompt_tokens: int = setting(2000, "The stateless request's prompt.", ge=16)
    reply_tokens: int = setting(
        400, "Each session's reply (long enough to outlast the stateless request).", ge=16
    )
    system_tokens: int = setting(300, "Each session's system prompt, in tokens (about).", ge=0)
    warmup: int = setting(
        8, "Pieces every session streams before the stateless request is sent.", ge=1
    )
    n_ctx: int = setting(8192, "Context size.", ge=256)
    compare: tuple[str, ...] = setting(
        (),
        "Also run another `continuum` executable, given as NAME=EXE (a before/after comparison).",
    )
    output: Output = Output()


@click.command("interference")
@options(InterferenceSettings)
def bench_interference(**flags: Any) -> None:
    """Sessions streaming replies while a long stateless request arrives: their inter-token
    gaps during it against their p50 outside it."""
    from continuum.backends.llamacpp import default_threads
    from continuum.bench.interference import interference_table, run_interference

    s = settings_from(InterferenceSettings, flags)
    serves = {"continuum": ""}
    for item in s.compare:
        name, sep, exe = item.partition("=")
        if not sep or not name or not exe or name in serves:
            raise InvalidRequest(f"--compare takes NAME=EXE with a new name, got {item!r}")
        serves[name] = exe
    plan = {
        "sessions": s.sessions,
        "prompt_tokens": s.prompt_tokens,
        "reply_tokens": s.reply_tokens,
        "system_tokens": s.system_tokens,
        "warmup": s.warmup,
        "n_ctx": s.n_ctx,
    }
    threads = s.threads or default_threads()
    with stderr_progress() as progress:
        result = run_interference(s.model, s.reps, threads, plan, serves, progress)
    emit(result, "interference.json", s.output.out, s.output.as_json, interference_table)
