"""What several ``continuum`` commands share: options, parsers, output, and object construction.

Output follows one rule: data goes to stdout (:func:`emit`), progress to stderr
(:func:`stderr_progress`). The construction helpers at the bottom are the only places the CLI
builds a backend, a :class:`Worker`, a chat session or the server's state, so a change to how
those objects are made touches this module alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile, ModelSettings, resolve_model
from continuum.backends.progress import LineProgress
from continuum.backends.step_plan import PrefillShare
from continuum.bench.settings import LLAMA_SERVER_HELP
from continuum.cli.settings_options import field_option
from continuum.engine import Engine
from continuum.settings import Settings, setting, sizes_at_least
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import WorkerConfig
from continuum.store.stores import StoreAddress

if TYPE_CHECKING:
    pass

err = Console(stderr=True)


# -- options ----------------------------------------------------------------------------------
# the model's options, as its settings declare them (serve's tree)
model_opt = field_option(ModelSettings, "model")
threads_opt = field_option(ModelSettings, "threads")
ctx_opt = field_option(ModelSettings, "n_ctx")
llama_server_opt = click.option(
    "--llama-server",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=LLAMA_SERVER_HELP,
)
format_opt = field_option(ModelSettings, "chat_format")
reps_opt = click.option("--reps", type=click.IntRange(1), default=3, show_default=True)
json_opt = click.option("--json", "as_json", is_flag=True)
out_opt = click.option("--out", type=click.Path(file_okay=False), default=None)


class Output(Settings):
    """Where a bench command's result goes: a table (or JSON) on stdout, and its JSON file into
    a folder. A command whose ``--out`` writes more says so in a subclass."""

    as_json: bool = setting(False, "Print the full result as JSON.", flags=("--json",))
    out: Path | None = setting(
        None, "Write the result's JSON file into this folder.", directory=True
    )


# -- parsers ----------------------------------------------------------------------------------
def parse_modes(text: str) -> tuple[str, ...]:
    """A comma-separated --modes value as a tuple (empty items dropped)."""
    return tuple(m.strip() for m in text.split(",") if m.strip())


def parse_sizes(text: str, least: int = 2) -> tuple[int, ...]:
    """A comma-separated --sizes value as integers, each at least ``least`` (as a settings
    field of :data:`continuum.settings.Sizes` reads it)."""
    try:
        return sizes_at_least(least)(text)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


# -- output -----------------------------------------------------------------------------------
@contextmanager
def stderr_progress() -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback drawing one bar on stderr; when stderr is not a terminal (a log, CI),
    lines instead (:class:`LineProgress`: at a new step, every few seconds, at the end)."""
    if not err.is_terminal:
        yield LineProgress(err.file)
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def update(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total or None)

        yield update


def write_json(result: dict[str, Any], out: str | Path | None, name: str) -> None:
    """Write ``result`` as ``out/name`` (creating the folder); nothing when ``out`` is None."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(result, indent=2))


def emit(
    result: dict[str, Any],
    name: str,
    out: str | Path | None,
    as_json: bool,
    table: Callable[[dict[str, Any]], str],
) -> None:
    """Write the result as JSON into ``out`` (when given) and print it (table or JSON)."""
    write_json(result, out, name)
    click.echo(json.dumps(result, indent=2) if as_json else table(result))


# serve's --prefill-share, and bench concurrent's (which passes it to serve)
PREFILL_SHARES = click.Choice([p.value for p in PrefillShare])


# -- construction: the one place each engine object is built ---------------------------------
def load_model(model: str | None) -> ModelFile:
    """Resolve ``--model`` to a model file, with a progress bar while it is assembled."""
    with stderr_progress() as progress:
        return resolve_model(model, progress)


def llama_config(n_ctx: int, threads: int | None, chat_format: str | None) -> LlamaConfig:
    """The llama.cpp settings from the shared options (one thread count for decode and batch)."""
    return LlamaConfig(
        n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, chat_format=chat_format
    )


def open_backend(
    mf: ModelFile, n_ctx: int, threads: int | None, chat_format: str | None
) -> LlamaCppBackend:
    """A bare llama.cpp context on ``mf``; the caller closes it."""
    return LlamaCppBackend(mf, llama_config(n_ctx, threads, chat_format))


def open_engine(
    model: str | None,
    n_ctx: int,
    threads: int | None,
    chat_format: str | None,
    store: StoreAddress | str | None,
    high_water: float,
) -> Engine:
    """An engine for an interactive chat (its turns walk the reuse stack); the caller closes
    it."""
    cfg = WorkerConfig(
        high_water=high_water,
        eager_glue=True,  # a person reads each reply: the next turn's template goes in then
    )
    return Engine.open(
        model=load_model(model),
        n_ctx=n_ctx,
        n_threads=threads,
        chat_format=chat_format,
        worker=cfg,
        store=store,
    )


def open_chat_session(engine: Engine, session_id: str | None, system: str | None) -> ChatSession:
    """Resume ``session_id`` (whose system prompt cannot change) or create a new session."""
    if not session_id:
        return engine.create_session(system)
    session = engine.open_session(session_id)
    if system is not None and system != session.system:
        raise click.UsageError("--system cannot change a resumed session's prompt")
    return session
