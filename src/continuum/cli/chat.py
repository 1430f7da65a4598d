"""``continuum chat``: an interactive, streaming chat on one stateful session.

Replies stream to stdout; the session id, errors inside a turn and ``--metrics`` go to stderr.
A failed turn is reported and the chat goes on; a failure to start is a user error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import click

from continuum.backends.models import ModelSettings
from continuum.cli.common import open_chat_session, open_engine
from continuum.cli.settings_options import options, settings_from
from continuum.errors import ContinuumError, SessionNotFound
from continuum.params import GenerationParams
from continuum.settings import Settings, setting
from continuum.stateful.session import ChatSession
from continuum.store.stores import StoreAddress, StoreSettings


class ChatSettings(Settings):
    """What ``continuum chat`` can be told: the model, the store, and the chat's own."""

    model: ModelSettings = ModelSettings()
    system: str | None = setting(
        None, "System prompt (prefilled at wake).", flags=("--system", "-s")
    )
    session: str | None = setting(None, "Resume a stored session by id.")
    store: StoreSettings = StoreSettings()
    max_tokens: int = setting(256, "Most tokens in a reply.", ge=1)
    temperature: float = setting(0.0, "Sampling temperature (0: the most likely token).", ge=0)
    high_water: float = setting(
        0.9, "Rebuild from bounded history past this fraction of n_ctx (or token count).", gt=0
    )
    metrics: bool = setting(False, "Print each turn's metrics as JSON to stderr.")


@click.command("chat")
@options(ChatSettings)
def chat(**flags: Any) -> None:
    """Interactive, streaming chat on a stateful session. One line per message; /exit quits."""
    s = settings_from(ChatSettings, flags)
    params = GenerationParams(max_tokens=s.max_tokens, temperature=s.temperature)
    address = StoreAddress.parse(s.store.store)
    if s.session and not address.shared and not address.sqlite.exists():
        raise SessionNotFound(s.session)  # don't create an empty store for a typo
    m = s.model
    with open_engine(m.model, m.n_ctx, m.threads, m.chat_format, address, s.high_water) as engine:
        session = open_chat_session(engine, s.session, s.system)
        click.echo(f"session {session.id} (resume with --session {session.id})", err=True)
        for line in _messages(prompt="> " if sys.stdin.isatty() else ""):
            _turn(session, line, params, s.metrics)


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
