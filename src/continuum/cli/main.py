"""The ``continuum`` command: chat, info and benchmarks.

Data goes to stdout; progress, metrics and diagnostics to stderr. A user error (missing model,
bad input, unknown session) exits with status 2 and one clear line, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from continuum.backends.llamacpp import LlamaConfig, default_threads
from continuum.backends.models import resolve_model
from continuum.errors import ContinuumError, SessionNotFound
from continuum.stateful.params import GenerationParams
from continuum.stateful.worker import Worker, WorkerConfig, default_store_path

F = TypeVar("F", bound=Callable[..., Any])
err = Console(stderr=True)


def _user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ContinuumError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@contextmanager
def _progress() -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback drawing one bar on stderr (hidden when stderr is not a terminal)."""
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total or None)
            if not err.is_terminal and what:
                click.echo(f"[{done}/{total}] {what}", err=True)

        yield update


def _worker(
    model: str | None,
    n_ctx: int,
    threads: int | None,
    chat_format: str | None,
    store: str | None,
    high_water: float,
) -> Worker:
    with _progress() as progress:
        mf = resolve_model(model, progress)
    cfg = WorkerConfig(
        llama=LlamaConfig(
            n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, chat_format=chat_format
        ),
        high_water=high_water,
        eager_glue=True,  # a person reads each reply: the next turn's template goes in then
    )
    return Worker(mf, cfg, store=store)


model_opt = click.option(
    "--model",
    "-m",
    default=None,
    envvar="CONTINUUM_MODEL",
    help="GGUF path or alias (gemma3-270m, smollm2-135m). Default: the bundled Gemma 3 270M.",
)
llama_server_opt = click.option(
    "--llama-server",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A llama-server binary to compare against as well (same model file and threads).",
)
threads_opt = click.option(
    "--threads",
    "-t",
    type=int,
    default=None,
    help="Threads for decode and prompt processing (default: all visible cores).",
)
ctx_opt = click.option("--n-ctx", type=int, default=8192, show_default=True, help="Context size.")
format_opt = click.option(
    "--chat-format",
    default=None,
    help="Built-in chat format (gemma, chatml, llama3) instead of the GGUF's own template.",
)


@click.group()
@click.version_option(package_name="continuum")
def main() -> None:
    """continuum: stateful llama.cpp sessions that decode only what changed."""


@main.command()
@model_opt
@ctx_opt
@threads_opt
@format_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_user_errors
def info(
    model: str | None, n_ctx: int, threads: int | None, chat_format: str | None, as_json: bool
) -> None:
    """Model path, digest, size, chat format, context and threads."""
    from continuum.backends.llamacpp import LlamaCppBackend

    with _progress() as progress:
        mf = resolve_model(model, progress)
    cfg = LlamaConfig(
        n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, chat_format=chat_format
    )
    with LlamaCppBackend(mf, cfg) as b:
        data = {
            "model_path": str(mf.path),
            "model_name": mf.name,
            "digest": mf.digest,
            "size_bytes": mf.info.size,
            "architecture": mf.info.architecture,
            "chat_format": b.chat_format.name,
            "chat_template_in_gguf": mf.info.chat_template is not None,
            "n_ctx": b.n_ctx,
            "n_ctx_train": mf.info.metadata.get(f"{mf.info.architecture}.context_length"),
            "n_threads": b.n_threads,
            "n_threads_batch": b.n_threads_batch,
            "cores_visible": default_threads(),
        }
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        for k, v in data.items():
            click.echo(f"{k:22} {v}")


@main.command()
@model_opt
@ctx_opt
@threads_opt
@format_opt
@click.option("--system", "-s", default=None, help="System prompt (prefilled at wake).")
@click.option("--session", "session_id", default=None, help="Resume a stored session by id.")
@click.option("--store", default=None, help=f"History database (default {default_store_path()}).")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option(
    "--high-water",
    type=float,
    default=0.9,
    show_default=True,
    help="Rebuild from bounded history past this fraction of n_ctx (or token count).",
)
@click.option("--metrics", is_flag=True, help="Print each turn's metrics as JSON to stderr.")
@_user_errors
def chat(
    model: str | None,
    n_ctx: int,
    threads: int | None,
    chat_format: str | None,
    system: str | None,
    session_id: str | None,
    store: str | None,
    max_tokens: int,
    temperature: float,
    high_water: float,
    metrics: bool,
) -> None:
    """Interactive, streaming chat on a stateful session. One line per message; /exit quits."""
    params = GenerationParams(max_tokens=max_tokens, temperature=temperature)
    if session_id and not Path(store or default_store_path()).exists():
        raise SessionNotFound(session_id)  # don't create an empty store for a typo
    with _worker(model, n_ctx, threads, chat_format, store, high_water) as worker:
        if session_id:
            session = worker.open_session(session_id)
            if system is not None and system != session.system:
                raise click.UsageError("--system cannot change a resumed session's prompt")
        else:
            session = worker.create_session(system)
        click.echo(f"session {session.id} (resume with --session {session.id})", err=True)
        interactive = sys.stdin.isatty()
        while True:
            try:
                line = input("> " if interactive else "")
            except EOFError:
                break
            if line.strip() in ("/exit", "/quit"):
                break
            if not line.strip():
                continue

            def show(piece: str) -> None:
                click.echo(piece, nl=False)
                sys.stdout.flush()

            try:
                r = session.append([{"role": "user", "content": line}], params, on_text=show)
            except ContinuumError as e:
                click.echo(f"\nerror: {e}", err=True)
                continue
            click.echo()
            if metrics:
                click.echo(json.dumps({"turn": r.turn, **r.metrics.to_dict()}), err=True)


def _emit(
    result: dict[str, Any],
    name: str,
    out: str | None,
    as_json: bool,
    table: Callable[[dict[str, Any]], str],
) -> None:
    """Write the result as JSON into ``out`` (when given) and print it (table or JSON)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(result, indent=2))
    click.echo(json.dumps(result, indent=2) if as_json else table(result))


@main.group()
def bench() -> None:
    """Benchmarks that print tables (and write JSON with --json/--out)."""


@bench.command("eva")
@model_opt
@threads_opt
@click.option("--reps", type=int, default=3, show_default=True, help="Runs per mode.")
@click.option(
    "--system-tokens",
    type=int,
    default=0,
    help="Use a long system prompt of about N tokens (0: the short one).",
)
@click.option("--max-tokens", type=int, default=48, show_default=True)
@click.option("--turns", type=click.IntRange(2, 16), default=16, show_default=True)
@click.option("--modes", default="stateful,prefix,cold,raw", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option(
    "--out", type=click.Path(file_okay=False), default=None, help="Write eva.json into this folder."
)
@_user_errors
def bench_eva(
    model: str | None,
    threads: int | None,
    reps: int,
    system_tokens: int,
    max_tokens: int,
    turns: int,
    modes: str,
    as_json: bool,
    out: str | None,
) -> None:
    """Seed 000's experiment: a 16-turn conversation with 5 retention checks, run as stateful
    append, same-worker prefix reuse (llama-cpp-python), cold recompute and the raw floor.
    `bench sweep` runs it after system prompts of 0.5k-16k tokens, over HTTP as well."""
    from continuum.bench.eva import MODES, EvaConfig, format_table, run_eva

    chosen = _modes(modes)
    bad = [m for m in chosen if m not in MODES]
    if bad or not chosen:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if "raw" in chosen and "stateful" not in chosen:
        raise click.BadParameter("raw replays the stateful run's deltas: include stateful")
    if reps < 1:
        raise click.BadParameter("--reps must be >= 1")
    cfg = EvaConfig(
        model=model,
        reps=reps,
        system_tokens=system_tokens,
        max_tokens=max_tokens,
        n_threads=threads,
        turns=turns,
        modes=chosen,
    )
    with _progress() as progress:
        result = run_eva(cfg, progress)
    _emit(
        result,
        "eva.json" if not system_tokens else f"eva-system{system_tokens}.json",
        out,
        as_json,
        format_table,
    )


@bench.command("sweep")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
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
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write sweep.json into this folder (rewritten after every size).",
)
@_user_errors
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
    from continuum.bench.sweep import MODES, SweepConfig, format_table, run_sweep

    chosen = _modes(modes) if modes else None
    if chosen is None:
        chosen = MODES if llama_server else tuple(m for m in MODES if m != "llama-server")
    cfg = SweepConfig(
        model=model,
        sizes=_sizes(sizes),
        reps=reps,
        n_threads=threads,
        max_tokens=max_tokens,
        turns=turns,
        modes=chosen,
        llama_server=llama_server,
        idle_ms=idle_ms,
        cold_full_upto=cold_full_upto,
        cold_all_reps_upto=cold_all_reps_upto,
    )
    try:
        cfg.validate()
    except ValueError as e:
        raise click.BadParameter(str(e)) from None

    def save(partial: dict[str, Any]) -> None:
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "sweep.json").write_text(json.dumps(partial, indent=2))

    with _progress() as progress:
        try:
            result = run_sweep(cfg, progress, on_point=save)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    _emit(result, "sweep.json", out, as_json, format_table)


@bench.command("residency")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--sizes",
    default="512,1024,2048,4096",
    show_default=True,
    help="Resident lengths in tokens, comma-separated.",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_residency(
    model: str | None, threads: int | None, reps: int, sizes: str, as_json: bool, out: str | None
) -> None:
    """Cost of switching sessions: park/restore a KV snapshot vs prefilling again."""
    from continuum.bench.residency import format_table, run_residency

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_residency(model, parsed, reps, threads, progress)
    _emit(result, "residency.json", out, as_json, format_table)


@bench.command("tiers")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--sizes",
    default="512,1024,2048,4096",
    show_default=True,
    help="Prompt lengths (tokens) for the layer-KV restore experiment.",
)
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_tiers(
    model: str | None, threads: int | None, reps: int, sizes: str, as_json: bool, out: str | None
) -> None:
    """Seed 003's per-tier measurements: shared prefix, memo, a 20-step workflow, layer-KV
    restore vs re-prefill, and the reuse layer's own overhead."""
    from continuum.bench.tiers import format_table, run_tiers

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_tiers(model, reps, threads, parsed, progress)
    _emit(result, "tiers.json", out, as_json, format_table)


@bench.command("semantic")
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--sizes",
    default="1000,10000,100000",
    show_default=True,
    help="Semantic index sizes (entries) for the lookup-latency rows, comma-separated.",
)
@click.option("--queries", type=click.IntRange(1), default=500, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_semantic(reps: int, sizes: str, queries: int, as_json: bool, out: str | None) -> None:
    """The semantic tier's threshold sweep on the labelled pairs (paraphrase hit rate and false
    hits, with and without the guard) and its lookup latency at 1k-100k entries."""
    from continuum.bench.semantic import format_table, run_semantic

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_semantic(reps=reps, sizes=parsed, queries=queries, progress=progress)
    _emit(result, "semantic.json", out, as_json, format_table)


def _modes(text: str) -> tuple[str, ...]:
    """A comma-separated --modes value as a tuple (empty items dropped)."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _sizes(text: str) -> tuple[int, ...]:
    try:
        parsed = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"sizes must be integers, got {text!r}") from None
    if not parsed or min(parsed) < 2:
        raise click.BadParameter("sizes needs at least one size >= 2")
    return parsed


@bench.command("plot")
@click.option(
    "--results",
    type=click.Path(file_okay=False),
    default="docs/results",
    show_default=True,
    help="Folder of bench JSON files.",
)
@click.option("--out", type=click.Path(file_okay=False), default="docs", show_default=True)
@_user_errors
def bench_plot(results: str, out: str) -> None:
    """Draw PNG plots from benchmark JSON (needs matplotlib: pip install 'continuum[plots]')."""
    from continuum.bench.plots import plot_all

    for path in plot_all(results, out):
        click.echo(str(path))


@main.command()
@model_opt
@ctx_opt
@threads_opt
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind (127.0.0.1: this machine only).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--api-key",
    envvar="CONTINUUM_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on every route but /health.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Requests waiting for the model before new ones get 429.",
)
@click.option("--store", default=None, help=f"History database (default {default_store_path()}).")
@click.option(
    "--semantic",
    is_flag=True,
    help="Semantic tier on completions, and /v1/embeddings (needs continuum[semantic]).",
)
@click.option(
    "--graph",
    type=click.Path(dir_okay=False),
    default=None,
    help="Memory graph database (SQLite) for the reuse stack.",
)
@_user_errors
def serve(
    model: str | None,
    n_ctx: int,
    threads: int | None,
    host: str,
    port: int,
    api_key: str | None,
    max_queue: int,
    store: str | None,
    semantic: bool,
    graph: str | None,
) -> None:
    """OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/sessions, /metrics
    (and /v1/embeddings with --semantic)."""
    import uvicorn

    from continuum.server.app import ServerConfig, build_state, create_app

    cfg = ServerConfig(
        model=model,
        n_ctx=n_ctx,
        threads=threads,
        api_key=api_key,
        max_queue=max_queue,
        store=Path(store) if store else None,
        semantic=semantic,
        graph=Path(graph) if graph else None,
    )
    click.echo(f"loading the model; serving on http://{host}:{port}", err=True)
    state = build_state(cfg)
    try:
        uvicorn.run(create_app(state), host=host, port=port, log_level="warning")
    finally:
        state.close()


@bench.command("http")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
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
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
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
    from continuum.bench.http import MODES, format_table, run_http

    chosen = _modes(modes) if modes else None
    bad = [m for m in chosen or () if m not in MODES]
    if bad:
        raise click.BadParameter(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
    if chosen and "llama-server" in chosen and not llama_server:
        raise click.BadParameter("llama-server mode needs --llama-server PATH")
    with _progress() as progress:
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
    _emit(result, name or default, out, as_json, format_table)


@bench.command("prefill")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@click.option("--sizes", default="10,100,1000", show_default=True, help="Message lengths.")
@click.option("--idle-ms", type=click.IntRange(0), default=500, show_default=True)
@click.option("--rate", type=click.FloatRange(1), default=200.0, show_default=True,
              help="arrival mode: tokens per second the message arrives at.")  # fmt: skip
@click.option("--max-tokens", type=click.IntRange(1), default=8, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_prefill(
    model: str | None,
    threads: int | None,
    reps: int,
    sizes: str,
    idle_ms: int,
    rate: float,
    max_tokens: int,
    as_json: bool,
    out: str | None,
) -> None:
    """TTFT after the end of input by message length: whole-message append, eager glue, and
    prefill on arrival, each after the same idle gap."""
    from continuum.bench.prefill import format_table, run_prefill

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_prefill(
            model, reps, threads, parsed, idle_ms, rate, max_tokens, progress=progress
        )
    _emit(result, "prefill.json", out, as_json, format_table)


@bench.command("restore")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@click.option("--sizes", default="512,1024,2048,4096,8192", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_restore(
    model: str | None, threads: int | None, reps: int, sizes: str, as_json: bool, out: str | None
) -> None:
    """Layer-KV restore from RAM and from disk vs re-prefill, end to end, by prompt length."""
    from continuum.bench.tiers import restore_table, run_restore

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_restore(model, reps, threads, parsed, progress)
    _emit(result, "restore.json", out, as_json, restore_table)


@bench.command("overhead")
@model_opt
@threads_opt
@click.option("--sizes", default="1000,10000,100000", show_default=True,
              help="Semantic index sizes.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", type=click.Path(file_okay=False), default=None)
@_user_errors
def bench_overhead(
    model: str | None, threads: int | None, sizes: str, as_json: bool, out: str | None
) -> None:
    """The reuse layer's own cost: memo hit, prefix lookup, semantic lookup, and memory per
    resident session against its KV bytes."""
    from continuum.bench.overhead import format_table, run_overhead

    parsed = _sizes(sizes)
    with _progress() as progress:
        result = run_overhead(model, threads, parsed, progress=progress)
    _emit(result, "overhead.json", out, as_json, format_table)


@bench.command("all")
@model_opt
@threads_opt
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
@llama_server_opt
@click.option("--tiny", is_flag=True, help="Toy sizes: a smoke test of the whole suite.")
@click.option("--out", type=click.Path(file_okay=False), default="bench-results", show_default=True)
@_user_errors
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
        progress=_progress,
        echo=lambda line: click.echo(line, err=True),
    )
    click.echo(f"results, plots and benchmarks.md in {out}")


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
@_user_errors
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
