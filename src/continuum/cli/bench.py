"""``continuum bench``: benchmarks that print tables (and write JSON with --json/--out).

This module holds the group, the in-process experiments and the commands that turn results
into plots and a report; the HTTP comparisons against peer servers (``sweep``, ``http``) are in
:mod:`continuum.cli.bench_http`. Each experiment lives in ``continuum.bench`` and runs only
when its command does; a command's options are generated from a settings tree (the bench's own
config, such as :class:`~continuum.bench.prefill.PrefillConfig`, or one declared here), and
importing those modules loads no model, so ``continuum --help`` stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from continuum.bench.draft_cost import DraftCostConfig
from continuum.bench.prefill import PrefillConfig
from continuum.bench.semantic_verified import VerifiedConfig
from continuum.bench.settings import BenchSettings
from continuum.bench.speculative import SpeculativeConfig
from continuum.cli.bench_agents import bench_agents_paused, bench_park_return
from continuum.cli.bench_fleet import bench_fleet
from continuum.cli.bench_http import (
    bench_agent,
    bench_codex,
    bench_concurrent,
    bench_http,
    bench_sweep,
)
from continuum.cli.bench_server import bench_interference, bench_memory
from continuum.cli.common import (
    Output,
    emit,
    json_opt,
    llama_server_opt,
    model_opt,
    out_opt,
    parse_sizes,
    reps_opt,
    stderr_progress,
    threads_opt,
)
from continuum.cli.settings_options import options, settings_from
from continuum.errors import ContinuumError
from continuum.settings import Names, Settings, setting


@click.group("bench")
def bench() -> None:
    """Benchmarks that print tables (and write JSON with --json/--out)."""


class EvaOutput(Output):
    out: Path | None = setting(None, "Write eva.json into this folder.", directory=True)


class EvaSettings(BenchSettings):
    """What ``bench eva`` can be told; the command makes its :class:`EvaConfig`."""

    system_tokens: int = setting(
        0, "Use a long system prompt of about N tokens (0: the short one).", ge=0
    )
    max_tokens: int = setting(48, "Most tokens in a reply.", ge=1)
    turns: int = setting(16, "User turns of the conversation.", ge=2, le=16)
    modes: Names = setting(("stateful", "prefix", "cold", "raw"), "Modes to run, comma-separated.")
    exact: bool = setting(
        False,
        "The stateful session runs exact (WorkerConfig.exact): each reply's KV is decoded "
        "again in one batch before it is reused, so every reply equals cold recompute's.",
    )
    output: EvaOutput = EvaOutput()


@bench.command("eva")
@options(EvaSettings)
def bench_eva(**flags: Any) -> None:
    """Seed 000's experiment: a 16-turn conversation with 5 retention checks, run as stateful
    append, same-worker prefix reuse (llama-cpp-python), cold recompute and the raw floor.
    `bench sweep` runs it after system prompts of 0.5k-16k tokens, over HTTP as well."""
    from continuum.bench.eva import EvaConfig, format_table, run_eva

    s = settings_from(EvaSettings, flags)
    cfg = EvaConfig(
        model=s.model,
        reps=s.reps,
        system_tokens=s.system_tokens,
        max_tokens=s.max_tokens,
        n_threads=s.threads,
        turns=s.turns,
        modes=_eva_modes(s.modes),
        exact=s.exact,
    )
    with stderr_progress() as progress:
        result = run_eva(cfg, progress)
    emit(
        result,
        ("eva" if not s.system_tokens else f"eva-system{s.system_tokens}")
        + ("-exact.json" if s.exact else ".json"),
        s.output.out,
        s.output.as_json,
        format_table,
    )


def _eva_modes(chosen: tuple[str, ...]) -> tuple[str, ...]:
    """eva's --modes: known names only, and raw only with the stateful run it replays."""
    from continuum.bench.eva import MODES

    bad = [m for m in chosen if m not in MODES]
    if bad or not chosen:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if "raw" in chosen and "stateful" not in chosen:
        raise click.BadParameter("raw replays the stateful run's deltas: include stateful")
    return chosen


@bench.command("compaction")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--high-water",
    type=click.IntRange(64),
    default=300,
    show_default=True,
    help="The sessions' high-water mark, in tokens (a few turns).",
)
@click.option("--max-tokens", type=click.IntRange(1), default=40, show_default=True)
@click.option("--note-tokens", type=click.IntRange(8), default=96, show_default=True)
@json_opt
@out_opt
def bench_compaction(
    model: str | None,
    threads: int | None,
    reps: int,
    high_water: int,
    max_tokens: int,
    note_tokens: int,
    as_json: bool,
    out: str | None,
) -> None:
    """What summary compaction keeps and costs: retention checks on seed 000's conversation
    and a held-out set, windowed vs summarised, on a session that holds a few turns."""
    from continuum.bench.compaction import format_table, run_compaction

    with stderr_progress() as progress:
        result = run_compaction(
            model, reps, high_water, max_tokens, note_tokens, threads or 2, progress
        )
    emit(result, "compaction.json", out, as_json, format_table)


@bench.command("residency")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--sizes",
    default="512,1024,2048,4096",
    show_default=True,
    help="Resident lengths in tokens, comma-separated.",
)
@json_opt
@out_opt
def bench_residency(
    model: str | None, threads: int | None, reps: int, sizes: str, as_json: bool, out: str | None
) -> None:
    """Cost of switching sessions: park/restore a KV snapshot vs prefilling again."""
    from continuum.bench.residency import format_table, run_residency

    parsed = parse_sizes(sizes)
    with stderr_progress() as progress:
        result = run_residency(model, parsed, reps, threads, progress)
    emit(result, "residency.json", out, as_json, format_table)


@bench.command("tiers")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--sizes",
    default="512,1024,2048,4096",
    show_default=True,
    help="Prompt lengths (tokens) for the layer-KV restore experiment.",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Run the stack as `serve --exact` does (EngineConfig.exact): reuse only KV a cold "
    "prefill would have given, and prefix slots in KV streams of their own.",
)
@json_opt
@out_opt
def bench_tiers(
    model: str | None,
    threads: int | None,
    reps: int,
    sizes: str,
    exact: bool,
    as_json: bool,
    out: str | None,
) -> None:
    """Seed 003's per-tier measurements: shared prefix, memo, a 20-step workflow, layer-KV
    restore vs re-prefill, and the reuse layer's own overhead."""
    from continuum.bench.tiers import format_table, run_tiers

    parsed = parse_sizes(sizes)
    with stderr_progress() as progress:
        result = run_tiers(model, reps, threads, parsed, progress, exact=exact)
    emit(result, "tiers-exact.json" if exact else "tiers.json", out, as_json, format_table)


@bench.command("semantic")
@reps_opt
@click.option(
    "--sizes",
    default="1000,10000,100000",
    show_default=True,
    help="Semantic index sizes (entries) for the lookup-latency rows, comma-separated.",
)
@click.option("--queries", type=click.IntRange(1), default=500, show_default=True)
@click.option(
    "--judge/--no-judge",
    default=True,
    show_default=True,
    help="Also put every pair at the threshold to the verifier (the default model as a judge: "
    "a few minutes) and time it against a cold answer.",
)
@threads_opt
@json_opt
@out_opt
def bench_semantic(
    reps: int,
    sizes: str,
    queries: int,
    judge: bool,
    threads: int | None,
    as_json: bool,
    out: str | None,
) -> None:
    """The semantic tier's threshold sweep on the labelled pairs (paraphrase hit rate and false
    hits, with and without the guard), the judge's verdicts and cost, and the lookup latency
    at 1k-100k entries."""
    from continuum.bench.semantic import format_table, run_semantic
    from continuum.tiers.verifier import JudgeVerifier

    parsed = parse_sizes(sizes)
    verifier = JudgeVerifier.open(threads=threads) if judge else None
    try:
        with stderr_progress() as progress:
            result = run_semantic(
                reps=reps, sizes=parsed, queries=queries, judge=verifier, progress=progress
            )
    finally:
        if verifier is not None:
            verifier.close()
    emit(result, "semantic.json", out, as_json, format_table)


class PrefillCommand(Settings):
    """``bench prefill``'s command line: the run's config, and where its result goes."""

    run: PrefillConfig = PrefillConfig()
    output: Output = Output()


@bench.command("prefill")
@options(PrefillCommand)
def bench_prefill(**flags: Any) -> None:
    """TTFT after the end of input by message length: whole-message append, eager glue, and
    prefill on arrival, each after the same idle gap; with --llama-server, llama-server sent
    the whole message, and pre-warmed with the partial message as it arrives."""
    from continuum.bench.prefill import format_table, run_prefill

    s = settings_from(PrefillCommand, flags)
    with stderr_progress() as progress:
        result = run_prefill(s.run, progress)
    emit(result, "prefill.json", s.output.out, s.output.as_json, format_table)


class DraftCostCommand(Settings):
    """``bench draft-cost``'s command line: the run's config, and where its result goes."""

    run: DraftCostConfig = DraftCostConfig()
    output: Output = Output()


@bench.command("draft-cost")
@options(DraftCostCommand)
def bench_draft_cost(**flags: Any) -> None:
    """What verifying a draft of k tokens in one call costs against k decoding steps, per
    model and resident context length (where speculative decoding could pay on this CPU)."""
    from continuum.bench.draft_cost import format_table, run_draft_cost

    s = settings_from(DraftCostCommand, flags)
    with stderr_progress() as progress:
        result = run_draft_cost(s.run, progress)
    emit(result, "draft-cost.json", s.output.out, s.output.as_json, format_table)


class VerifiedCommand(Settings):
    """``bench semantic-verified``'s command line: the run's config, and where its result goes."""

    run: VerifiedConfig = VerifiedConfig()
    output: Output = Output()


@bench.command("semantic-verified")
@options(VerifiedCommand)
def bench_semantic_verified(**flags: Any) -> None:
    """The semantic tier's judges (0.5B and 1.5B, on the requests or on their answers) and its
    verified mode (thresholds learned within delta, pooled and per answer, judgments off the
    request path, promotion) on the held-out sets: paraphrase and false hits."""
    from continuum.bench.semantic_verified import run_verified
    from continuum.bench.semantic_verified_report import format_table

    s = settings_from(VerifiedCommand, flags)
    with stderr_progress() as progress:
        result = run_verified(s.run, progress)
    emit(result, "semantic-verified.json", s.output.out, s.output.as_json, format_table)


class SpeculativeCommand(Settings):
    """``bench speculative``'s command line: the run's config, and where its result goes."""

    run: SpeculativeConfig = SpeculativeConfig()
    output: Output = Output()


@bench.command("speculative")
@options(SpeculativeCommand)
def bench_speculative(**flags: Any) -> None:
    """Replies that quote their context (edit a file, copy tool arguments, re-emit JSON) and
    free prose, greedy or sampled, with drafts from the context and without: decode tokens/s,
    drafted tokens kept, and whether the replies are the same tokens."""
    from continuum.bench import speculative, speculative_batched
    from continuum.bench.speculative import result_name, run_speculative

    s = settings_from(SpeculativeCommand, flags)
    if s.run.batched and s.run.llama_server:
        raise click.UsageError("--llama-server runs with --agents 1 only (one reply at a time)")
    with stderr_progress() as progress:
        result = run_speculative(s.run, progress)
    name = result_name(s.run.temperature, s.run.batched)
    table = speculative_batched.format_table if s.run.batched else speculative.format_table
    emit(result, name, s.output.out, s.output.as_json, table)


class SharedPrefixSettings(BenchSettings):
    """What ``bench shared-prefix`` can be told."""

    sessions: int = setting(8, "Sessions opening with the system prompt.", ge=1, le=64)
    system_tokens: int = setting(4000, "The system prompt, in tokens (about).", ge=16)
    max_tokens: int = setting(8, "Most tokens in a reply.", ge=1)
    n_ctx: int = setting(8192, "Context size.", ge=256)
    lanes: int = setting(
        4,
        "Lanes of the one context (serve's --parallel; 1: no lane holds a parked one's).",
        ge=1,
        le=16,
    )
    output: Output = Output()


@bench.command("shared-prefix")
@options(SharedPrefixSettings)
def bench_shared_prefix(**flags: Any) -> None:
    """Sessions of one agent opening with one long system prompt: prompt tokens decoded and
    first TTFT per session, against a cold prefill of the prompt."""
    from continuum.backends.llamacpp import default_threads
    from continuum.bench.shared_prefix import LANES, run_shared_prefix, shared_prefix_table

    s = settings_from(SharedPrefixSettings, flags)
    plan = {
        "sessions": s.sessions,
        "system_tokens": s.system_tokens,
        "max_tokens": s.max_tokens,
        "n_ctx": s.n_ctx,
        "lanes": s.lanes,
    }
    threads = s.threads or default_threads()
    with stderr_progress() as progress:
        result = run_shared_prefix(s.model, s.reps, threads, plan, progress)
    name = "shared_prefix.json" if s.lanes == LANES else f"shared_prefix-lanes{s.lanes}.json"
    emit(result, name, s.output.out, s.output.as_json, shared_prefix_table)


@bench.command("restore")
@model_opt
@threads_opt
@reps_opt
@click.option("--sizes", default="512,1024,2048,4096,8192", show_default=True)
@json_opt
@out_opt
def bench_restore(
    model: str | None, threads: int | None, reps: int, sizes: str, as_json: bool, out: str | None
) -> None:
    """Layer-KV restore from RAM and from disk vs re-prefill, end to end, by prompt length."""
    from continuum.bench.tiers import restore_table, run_restore

    parsed = parse_sizes(sizes)
    with stderr_progress() as progress:
        result = run_restore(model, reps, threads, parsed, progress)
    emit(result, "restore.json", out, as_json, restore_table)


@bench.command("overhead")
@model_opt
@threads_opt
@click.option(
    "--sizes", default="1000,10000,100000", show_default=True, help="Semantic index sizes."
)
@json_opt
@out_opt
def bench_overhead(
    model: str | None, threads: int | None, sizes: str, as_json: bool, out: str | None
) -> None:
    """The reuse layer's own cost: memo hit, prefix lookup, semantic lookup, and memory per
    resident session against its KV bytes."""
    from continuum.bench.overhead import format_table, run_overhead

    parsed = parse_sizes(sizes)
    with stderr_progress() as progress:
        result = run_overhead(model, threads, parsed, progress=progress)
    emit(result, "overhead.json", out, as_json, format_table)


@bench.command("all")
@model_opt
@threads_opt
@reps_opt
@llama_server_opt
@click.option("--tiny", is_flag=True, help="Toy sizes: a smoke test of the whole suite.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-results", show_default=True)
def bench_all(
    model: str | None,
    threads: int | None,
    reps: int,
    llama_server: str | None,
    tiny: bool,
    out: str,
) -> None:
    """Every experiment into one results folder, then its plots and benchmarks.md."""
    from continuum.bench.suite import run_all

    run_all(
        out,
        model=model,
        threads=threads,
        reps=reps,
        llama_server=llama_server,
        tiny=tiny,
        progress=stderr_progress,
        echo=lambda line: click.echo(line, err=True),
    )
    click.echo(f"results, plots and benchmarks.md in {out}")


@bench.command("plot")
@click.option(
    "--results",
    type=click.Path(file_okay=False),
    default="docs/results",
    show_default=True,
    help="Folder of bench JSON files.",
)
@click.option("--out", type=click.Path(file_okay=False), default="docs", show_default=True)
def bench_plot(results: str, out: str) -> None:
    """Draw PNG plots from benchmark JSON (needs matplotlib: pip install 'continuum[plots]')."""
    from continuum.bench.plots import plot_all

    for path in plot_all(results, out):
        click.echo(str(path))


@bench.command("report")
@click.option(
    "--results",
    type=click.Path(file_okay=False),
    default="docs/results",
    show_default=True,
    help="Folder of bench JSON files.",
)
@click.option(
    "--out", type=click.Path(dir_okay=False), default="docs/benchmarks.md", show_default=True
)
def bench_report(results: str, out: str) -> None:
    """Write docs/benchmarks.md from a results folder (and draw its plots when matplotlib is
    installed)."""
    from continuum.bench.report import render_report

    text = render_report(results)
    try:
        from continuum.bench.plots import plot_all

        plot_all(results, Path(out).parent)
    except ContinuumError as e:  # matplotlib missing: the page still renders
        click.echo(f"plots skipped: {e}", err=True)
    Path(out).write_text(text)
    click.echo(out)


bench.add_command(bench_sweep)
bench.add_command(bench_http)
bench.add_command(bench_agent)
bench.add_command(bench_concurrent)
bench.add_command(bench_agents_paused)
bench.add_command(bench_park_return)
bench.add_command(bench_codex)
bench.add_command(bench_fleet)
bench.add_command(bench_memory)
bench.add_command(bench_interference)
