"""``continuum bench sweep`` and ``continuum bench http``: the 16-turn conversation compared
over HTTP against peer servers (llama-cpp-python's server, and llama-server when its binary is
given), besides the in-process modes; and the other comparisons over HTTP (``agent``,
``concurrent``, ``codex``). Registered on the group in :mod:`continuum.cli.bench`.

Each command's options are generated from a settings tree: the bench's own config (``run``,
:class:`~continuum.bench.agent.AgentConfig`...) and where the result goes (``output``). The
configs' modules load when this one does (they are light: the models load when a bench runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from continuum.bench.agent import AgentConfig
from continuum.bench.codex import CodexConfig
from continuum.bench.concurrent import ConcurrentConfig
from continuum.bench.conversation import TURNS
from continuum.bench.http import HttpConfig
from continuum.bench.settings import PeerSettings
from continuum.cli.common import Output, emit, stderr_progress, write_json
from continuum.cli.settings_options import options, settings_from
from continuum.settings import Names, Settings, Sizes, setting


class SweepOutput(Output):
    out: Path | None = setting(
        None, "Write sweep.json into this folder (rewritten after every size).", directory=True
    )


class SweepSettings(PeerSettings):
    """What ``bench sweep`` can be told; the command makes its :class:`SweepConfig`."""

    sizes: Sizes = setting(
        (512, 2048, 4096, 8192, 16384),
        "System prompt lengths in tokens (about), comma-separated.",
    )
    max_tokens: int = setting(48, "Most tokens in a reply.", ge=1)
    turns: int = setting(len(TURNS), "User turns of the conversation.", ge=2, le=len(TURNS))
    modes: Names | None = setting(
        None,
        "Comma-separated: stateful, prefix, cold, delta, llama-cpp-python, llama-server "
        "(default: all but llama-server, plus llama-server when its path is given).",
    )
    idle_ms: int = setting(
        250,
        "HTTP modes: pause between a reply and the next message, the same for every mode.",
        ge=0,
    )
    cold_full_upto: int = setting(
        2048, "Time cold recompute on every turn up to this size; on turns 2, 9, 16 above.", ge=0
    )
    cold_all_reps_upto: int = setting(
        4096, "Time cold recompute in every run up to this size; in the first run above.", ge=0
    )
    output: SweepOutput = SweepOutput()


@click.command("sweep")
@options(SweepSettings)
def bench_sweep(**flags: Any) -> None:
    """eva's context sweep: the 16-turn conversation after system prompts of 0.5k-16k tokens,
    stateful append vs prefix reuse vs cold recompute in process, and session deltas vs full
    replay to llama-cpp-python's server and llama-server over HTTP."""
    from continuum.bench.sweep import SweepConfig, default_modes, format_table, run_sweep

    s = settings_from(SweepSettings, flags)
    llama_server = s.llama_server
    cfg = SweepConfig(
        model=s.model,
        sizes=s.sizes,
        reps=s.reps,
        n_threads=s.threads,
        max_tokens=s.max_tokens,
        turns=s.turns,
        modes=s.modes or default_modes(bool(llama_server)),
        llama_server=llama_server,
        idle_ms=s.idle_ms,
        cold_full_upto=s.cold_full_upto,
        cold_all_reps_upto=s.cold_all_reps_upto,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    out = s.output.out
    with stderr_progress() as progress:
        try:
            result = run_sweep(
                cfg, progress, on_point=lambda partial: write_json(partial, out, "sweep.json")
            )
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    emit(result, "sweep.json", out, s.output.as_json, format_table)


class HttpOutput(Output):
    name: str | None = setting(None, "Result file name (default http[-systemN].json).")


class HttpCommand(Settings):
    """``bench http``'s command line: the run's config, and where its result goes."""

    run: HttpConfig = HttpConfig()
    output: HttpOutput = HttpOutput()


@click.command("http")
@options(HttpCommand)
def bench_http(**flags: Any) -> None:
    """The 16-turn conversation over HTTP: session deltas (and the input stream) vs
    full-transcript replay to llama-cpp-python's server and llama-server."""
    from continuum.bench.http import format_table, run_http

    s = settings_from(HttpCommand, flags)
    _check_http_modes(s.run)
    with stderr_progress() as progress:
        result = run_http(s.run, progress)
    system_tokens = s.run.system_tokens
    default = "http.json" if not system_tokens else f"http-system{system_tokens}.json"
    emit(result, s.output.name or default, s.output.out, s.output.as_json, format_table)


def _check_http_modes(cfg: HttpConfig) -> None:
    """http's --modes, before anything runs: known names, and llama-server with its binary."""
    from continuum.bench.http import MODES

    bad = [m for m in cfg.modes or () if m not in MODES]
    if bad:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if cfg.modes and "llama-server" in cfg.modes and not cfg.llama_server:
        raise click.BadParameter("llama-server mode needs --llama-server PATH")


class AgentCommand(Settings):
    """``bench agent``'s command line: the run's config, and where its result goes."""

    run: AgentConfig = AgentConfig()
    output: Output = Output()


@click.command("agent")
@options(AgentCommand)
def bench_agent(**flags: Any) -> None:
    """A scripted tool loop (a test log or a file of ~300 tokens per step, no idle gap):
    tokens evaluated and TTFT per step, continuum's session and stateless chat vs
    llama-server --jinja replaying the transcript."""
    from continuum.bench.agent import format_table, run_agent

    s = settings_from(AgentCommand, flags)
    with stderr_progress() as progress:
        try:
            result = run_agent(s.run, progress)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    emit(result, "agent.json", s.output.out, s.output.as_json, format_table)


class ConcurrentCommand(Settings):
    """``bench concurrent``'s command line: the run's config, and where its result goes."""

    run: ConcurrentConfig = ConcurrentConfig()
    output: Output = Output()


@click.command("concurrent")
@options(ConcurrentCommand)
def bench_concurrent(**flags: Any) -> None:
    """Many agents at once, each its own conversation: TTFT p50/p95, inter-token latency and
    total tokens/s of continuum serve vs llama-server with a slot per client (each server
    started alone for its run)."""
    from continuum.bench.concurrent import format_table, result_name, run_concurrent

    s = settings_from(ConcurrentCommand, flags)
    with stderr_progress() as progress:
        result = run_concurrent(s.run, progress)
    name = result_name(s.run.prefill_share, s.run.exact)
    emit(result, name, s.output.out, s.output.as_json, format_table)


class CodexOutput(Output):
    out: Path | None = setting(
        None, "Write codex.json and codex.txt (the tables) into this folder.", directory=True
    )


class CodexCommand(Settings):
    """``bench codex``'s command line: the run's config, and where its result goes."""

    run: CodexConfig = CodexConfig()
    output: CodexOutput = CodexOutput()


@click.command("codex")
@options(CodexCommand)
def bench_codex(**flags: Any) -> None:
    """The requests Codex sends (a synthetic stand-in of their shape and size): a tool loop
    that re-sends everything each step, then new sessions with the same instructions;
    continuum serve vs llama-server --jinja, each started alone for its run."""
    from continuum.bench.codex import run_codex
    from continuum.bench.codex_report import format_table

    s = settings_from(CodexCommand, flags)
    with stderr_progress() as progress:
        try:
            result = run_codex(s.run, progress=progress)
        except RuntimeError as e:  # a server refused a request, or did not start
            raise click.ClickException(str(e)) from None
    out = s.output.out
    emit(result, "codex.json", out, s.output.as_json, format_table)
    if out:
        (Path(out) / "codex.txt").write_text(format_table(result) + "\n")
