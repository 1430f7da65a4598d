"""``continuum chat``: an interactive, streaming chat on one stateful session.

Replies stream to stdout; the session id, errors inside a turn and ``--metrics`` go to stderr.
A failed turn is reported and the chat goes on; a failure to start is a user error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import click

from continuum.cli.common import (
    ctx_opt,
    format_opt,
    model_opt,
    open_chat_session,
    open_engine,
    store_opt,
    threads_opt,
)
from continuum.errors import ContinuumError, SessionNotFound
from continuum.stateful.params import GenerationParams
from continuum.stateful.session import ChatSession
from continuum.store.stores import StoreAddress


@click.command("chat")
@model_opt
@ctx_opt
@threads_opt
@format_opt
@click.option("--system", "-s", default=None, help="System prompt (prefilled at wake).")
@click.option("--session", "session_id", default=None, help="Resume a stored session by id.")
@store_opt
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
    address = StoreAddress.parse(store)
    if session_id and not address.shared and not address.sqlite.exists():
        raise SessionNotFound(session_id)  # don't create an empty store for a typo
    with open_engine(model, n_ctx, threads, chat_format, address, high_water) as engine:
        session = open_chat_session(engine, session_id, system)
        click.echo(f"session {session.id} (resume with --session {session.id})", err=True)
        for line in _messages(prompt="> " if sys.stdin.isatty() else ""):
            _turn(session, line, params, metrics)


def _messages(prompt: str) -> Iterator[str]:
    """The user's messages, one a line, until end of input or /exit (/quit); blank lines skipped."""
    while True:
        try:
            line = input(prompt)
        except EOFError:
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip():
            yield line


def _turn(session: ChatSession, line: str, params: GenerationParams, metrics: bool) -> None:
    """Stream one reply to stdout; an error in the turn is one line on stderr, not the end."""
    try:
        r = session.append([{"role": "user", "content": line}], params, on_text=_show)
    except ContinuumError as e:
        click.echo(f"\nerror: {e}", err=True)
        return
    click.echo()
    if metrics:
        click.echo(json.dumps({"turn": r.turn, **r.metrics.to_dict()}), err=True)


def _show(piece: str) -> None:
    click.echo(piece, nl=False)
    sys.stdout.flush()
