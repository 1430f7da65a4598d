"""The ``continuum`` command: chat, info, serve, keys and benchmarks.

Data goes to stdout; progress, metrics and diagnostics to stderr. A user error (missing model,
bad input, unknown session) exits with status 2 and one clear line, never a traceback: the
group below catches :class:`ContinuumError` for every subcommand, so commands just raise.

The commands live in their own modules (``chat``, ``serve``, ``bench``) and are registered
here; ``continuum = "continuum.cli.main:main"`` is the console script.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from continuum.backends.llamacpp import default_threads
from continuum.cli.bench import bench
from continuum.cli.chat import chat
from continuum.cli.common import (
    ctx_opt,
    format_opt,
    load_model,
    model_opt,
    open_backend,
    threads_opt,
)
from continuum.cli.fleet import fleet
from continuum.cli.keys import keys
from continuum.cli.serve import serve
from continuum.errors import ContinuumError


class _UserErrors(click.Group):
    """A group that turns a :class:`ContinuumError` from any command under it into one
    ``error: ...`` line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ContinuumError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=_UserErrors)
@click.version_option(package_name="continuum")
def main() -> None:
    """continuum: stateful llama.cpp sessions that decode only what changed."""


@main.command()
@model_opt
@ctx_opt
@threads_opt
@format_opt
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def info(
    model: str | None, n_ctx: int, threads: int | None, chat_format: str | None, as_json: bool
) -> None:
    """Model path, digest, size, chat format, context and threads."""
    mf = load_model(model)
    with open_backend(mf, n_ctx, threads, chat_format) as b:
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


main.add_command(chat)
main.add_command(serve)
main.add_command(bench)
main.add_command(keys)
main.add_command(fleet)
