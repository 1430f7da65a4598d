"""``continuum bench sweep`` and ``continuum bench http``: the 16-turn conversation compared
over HTTP against peer servers (llama-cpp-python's server, and llama-server when its binary is
given), besides the in-process modes; and the other comparisons over HTTP (``agent``,
``concurrent``, ``codex``). Registered on the group in :mod:`continuum.cli.bench`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from continuum.bench.conversation import TURNS
from continuum.cli.common import (
    PREFILL_SHARES,
    emit,
    json_opt,
    llama_server_opt,
    model_opt,
    out_opt,
    parse_modes,
    parse_sizes,
    reps_opt,
    stderr_progress,
    threads_opt,
    write_json,
)


@click.command("sweep")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--sizes",
    default="512,2048,4096,8192,16384",
    show_default=True,
    help="System prompt lengths in tokens (about), comma-separated.",
)
@click.option("--max-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--turns", type=click.IntRange(2, 16), default=16, show_default=True)
@click.option(
    "--modes",
    default=None,
    help="Comma-separated: stateful, prefix, cold, delta, llama-cpp-python, llama-server "
    "(default: all but llama-server, plus llama-server when its path is given).",
)
@llama_server_opt
@click.option(
    "--idle-ms",
    type=click.IntRange(0),
    default=250,
    show_default=True,
    help="HTTP modes: pause between a reply and the next message, the same for every mode.",
)
@click.option(
    "--cold-full-upto",
    type=click.IntRange(0),
    default=2048,
    show_default=True,
    help="Time cold recompute on every turn up to this size; on turns 2, 9, 16 above.",
)
@click.option(
    "--cold-all-reps-upto",
    type=click.IntRange(0),
    default=4096,
    show_default=True,
    help="Time cold recompute in every run up to this size; in the first run above.",
)
@json_opt
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write sweep.json into this folder (rewritten after every size).",
)
def bench_sweep(
    model: str | None,
    threads: int | None,
    reps: int,
    sizes: str,
    max_tokens: int,
    turns: int,
    modes: str | None,
    llama_server: str | None,
    idle_ms: int,
    cold_full_upto: int,
    cold_all_reps_upto: int,
    as_json: bool,
    out: str | None,
) -> None:
    """eva's context sweep: the 16-turn conversation after system prompts of 0.5k-16k tokens,
    stateful append vs prefix reuse vs cold recompute in process, and session deltas vs full
    replay to llama-cpp-python's server and llama-server over HTTP."""
    from continuum.bench.sweep import SweepConfig, format_table, run_sweep

    cfg = SweepConfig(
        model=model,
        sizes=parse_sizes(sizes),
        reps=reps,
        n_threads=threads,
        max_tokens=max_tokens,
        turns=turns,
        modes=_sweep_modes(modes, llama_server),
        llama_server=llama_server,
        idle_ms=idle_ms,
        cold_full_upto=cold_full_upto,
        cold_all_reps_upto=cold_all_reps_upto,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    with stderr_progress() as progress:
        try:
            result = run_sweep(
                cfg, progress, on_point=lambda partial: write_json(partial, out, "sweep.json")
            )
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    emit(result, "sweep.json", out, as_json, format_table)


def _sweep_modes(modes: str | None, llama_server: str | None) -> tuple[str, ...]:
    """sweep's --modes as given, else every mode (llama-server only when its path is given)."""
    from continuum.bench.sweep import default_modes

    return parse_modes(modes) if modes else default_modes(bool(llama_server))


@click.command("http")
@model_opt
@threads_opt
@reps_opt
@click.option("--max-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--system-tokens", type=click.IntRange(0), default=0)
@click.option("--turns", type=click.IntRange(2, 16), default=16, show_default=True)
@llama_server_opt
@click.option(
    "--modes",
    default=None,
    help="Comma-separated: delta, resend, input, llama-cpp-python, llama-server "
    "(default: delta, resend, llama-cpp-python, and llama-server when given).",
)
@click.option(
    "--idle-ms",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Pause between a reply and the next message, the same for every mode.",
)
@click.option(
    "--rate",
    type=click.FloatRange(1),
    default=200.0,
    show_default=True,
    help="input mode: tokens per second the message arrives at (4 characters a token).",
)
@click.option(
    "--end-delay-ms",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="input mode: time between the last piece and the end of the message (Enter key).",
)
@click.option("--name", default=None, help="Result file name (default http[-systemN].json).")
@json_opt
@out_opt
def bench_http(
    model: str | None,
    threads: int | None,
    reps: int,
    max_tokens: int,
    system_tokens: int,
    turns: int,
    llama_server: str | None,
    modes: str | None,
    idle_ms: int,
    rate: float,
    end_delay_ms: int,
    name: str | None,
    as_json: bool,
    out: str | None,
) -> None:
    """The 16-turn conversation over HTTP: session deltas (and the input stream) vs
    full-transcript replay to llama-cpp-python's server and llama-server."""
    from continuum.bench.http import format_table, run_http

    chosen = _http_modes(modes, llama_server)
    with stderr_progress() as progress:
        result = run_http(
            model,
            reps,
            threads,
            max_tokens,
            system_tokens,
            llama_server,
            turns,
            progress,
            idle_ms=idle_ms,
            modes=chosen,
            rate_tps=rate,
            end_delay_ms=end_delay_ms,
        )
    default = "http.json" if not system_tokens else f"http-system{system_tokens}.json"
    emit(result, name or default, out, as_json, format_table)


def _http_modes(modes: str | None, llama_server: str | None) -> tuple[str, ...] | None:
    """http's --modes (None: the bench's default set); llama-server needs its binary."""
    from continuum.bench.http import MODES

    chosen = parse_modes(modes) if modes else None
    bad = [m for m in chosen or () if m not in MODES]
    if bad:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if chosen and "llama-server" in chosen and not llama_server:
        raise click.BadParameter("llama-server mode needs --llama-server PATH")
    return chosen


@click.command("agent")
@model_opt
@threads_opt
@reps_opt
@click.option("--steps", type=click.IntRange(2, 40), default=10, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--n-ctx", type=click.IntRange(512), default=8192, show_default=True)
@llama_server_opt
@click.option(
    "--modes",
    default=None,
    help="Comma-separated: session, chat, responses, resend, llama-server (default: all, "
    "llama-server when its path is given).",
)
@json_opt
@out_opt
def bench_agent(
    model: str | None,
    threads: int | None,
    reps: int,
    steps: int,
    max_tokens: int,
    n_ctx: int,
    llama_server: str | None,
    modes: str | None,
    as_json: bool,
    out: str | None,
) -> None:
    """A scripted tool loop (a test log or a file of ~300 tokens per step, no idle gap):
    tokens evaluated and TTFT per step, continuum's session and stateless chat vs
    llama-server --jinja replaying the transcript."""
    from continuum.bench.agent import format_table, run_agent

    with stderr_progress() as progress:
        try:
            result = run_agent(
                model,
                reps,
                threads,
                steps,
                max_tokens,
                llama_server,
                parse_modes(modes) if modes else None,
                n_ctx,
                progress,
            )
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    emit(result, "agent.json", out, as_json, format_table)


@click.command("concurrent")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--clients",
    default="1,2,4,8",
    show_default=True,
    help="Numbers of agents running at once, comma-separated.",
)
@click.option("--turns", type=click.IntRange(1, len(TURNS)), default=6, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--system-tokens", type=click.IntRange(0), default=1000, show_default=True)
@click.option(
    "--idle-ms",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Gap between a reply and the client's next request (0: an agent loop).",
)
@click.option(
    "--prefill-share",
    type=PREFILL_SHARES,
    default="oldest",
    show_default=True,
    help="continuum serve's --prefill-share (the results go to concurrent.json for oldest, "
    "concurrent-equal.json for equal).",
)
@click.option(
    "--exact",
    is_flag=True,
    help="continuum serve runs with --exact (results in concurrent[-equal]-exact.json).",
)
@llama_server_opt
@json_opt
@out_opt
def bench_concurrent(
    model: str | None,
    threads: int | None,
    reps: int,
    clients: str,
    turns: int,
    max_tokens: int,
    system_tokens: int,
    idle_ms: int,
    prefill_share: str,
    exact: bool,
    llama_server: str | None,
    as_json: bool,
    out: str | None,
) -> None:
    """Many agents at once, each its own conversation: TTFT p50/p95, inter-token latency and
    total tokens/s of continuum serve vs llama-server with a slot per client (each server
    started alone for its run)."""
    from continuum.bench.concurrent import format_table, result_name, run_concurrent

    with stderr_progress() as progress:
        result = run_concurrent(
            model=model,
            clients=parse_sizes(clients, least=1),
            reps=reps,
            threads=threads,
            turns=turns,
            max_tokens=max_tokens,
            system_tokens=system_tokens,
            idle_ms=idle_ms,
            llama_server=llama_server,
            prefill_share=prefill_share,
            exact=exact,
            progress=progress,
        )
    emit(result, result_name(prefill_share, exact), out, as_json, format_table)


@click.command("codex")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--steps",
    type=click.IntRange(1, 40),
    default=10,
    show_default=True,
    help="Requests in session 1's tool loop.",
)
@click.option(
    "--sessions",
    type=click.IntRange(1, 8),
    default=4,
    show_default=True,
    help="Sessions with the same instructions (session 1 runs the loop).",
)
@click.option("--max-output-tokens", type=click.IntRange(1), default=24, show_default=True)
@click.option(
    "--n-ctx",
    type=click.IntRange(2048),
    default=16384,
    show_default=True,
    help="Context per session, on both servers.",
)
@llama_server_opt
@click.option(
    "--llama-server-args",
    default="",
    help="More llama-server flags, appended to its command line (e.g. '--no-repack' where "
    "its repacked weights crash); recorded in the results.",
)
@json_opt
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write codex.json and codex.txt (the tables) into this folder.",
)
def bench_codex(
    model: str | None,
    threads: int | None,
    reps: int,
    steps: int,
    sessions: int,
    max_output_tokens: int,
    n_ctx: int,
    llama_server: str | None,
    llama_server_args: str,
    as_json: bool,
    out: str | None,
) -> None:
    """The requests Codex sends (a synthetic stand-in of their shape and size): a tool loop
    that re-sends everything each step, then new sessions with the same instructions;
    continuum serve vs llama-server --jinja, each started alone for its run."""
    from continuum.bench.codex import run_codex
    from continuum.bench.codex_report import format_table

    with stderr_progress() as progress:
        try:
            result = run_codex(
                model=model,
                reps=reps,
                threads=threads,
                steps=steps,
                sessions=sessions,
                max_output_tokens=max_output_tokens,
                n_ctx=n_ctx,
                llama_server=llama_server,
                llama_server_args=shlex.split(llama_server_args),
                progress=progress,
            )
        except RuntimeError as e:  # a server refused a request, or did not start
            raise click.ClickException(str(e)) from None
    emit(result, "codex.json", out, as_json, format_table)
    if out:
        (Path(out) / "codex.txt").write_text(format_table(result) + "\n")
