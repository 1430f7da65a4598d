"""``continuum serve``: the OpenAI-compatible HTTP server on uvicorn.

The model loads after the address is announced on stderr; the server's state is closed when
uvicorn returns (Ctrl-C included).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

import click

from continuum.backends.registry import BackendRegistry
from continuum.cli.settings_options import options, settings_from
from continuum.server.settings import ServeSettings, server_config
from continuum.server.state import build_state

if TYPE_CHECKING:
    from continuum.server.auth import KeyRing
    from continuum.server.state import ServerState


# every registered backend's section, an installed package's included
TREE = ServeSettings.with_backends(BackendRegistry())


@click.command("serve")
@options(TREE)
def serve(**flags: Any) -> None:
    """OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/sessions, /metrics
    (and /v1/embeddings with --semantic)."""
    settings = settings_from(TREE, flags)
    config = server_config(settings)  # refused here, before anything loads, when malformed
    _say_tenants(config.keys)
    host, port = settings.http.host, settings.http.port
    click.echo(f"loading the model; serving on http://{host}:{port}", err=True)
    _serve_until_stopped(build_state(config), host, port)


def _serve_until_stopped(state: ServerState, host: str, port: int) -> None:
    """Serve ``state``'s app until the process is stopped, then close the state."""
    import uvicorn

    from continuum.server import listener
    from continuum.server.app import create_app

    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: with this handler
    # that ends in SystemExit, so state.close() still parks every session (a shared store then
    # holds them for the next worker) instead of the default action killing the process first
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.Server(listener.config(create_app(state), host, port)).run()
    finally:
        state.close()


def _say_tenants(keyring: KeyRing) -> None:
    """Which tenants the API keys name, on stderr."""
    if keyring.open:
        click.echo("no API key configured: every caller is the one tenant 'default'", err=True)
    else:
        click.echo(f"tenants by API key: {', '.join(keyring.tenants())}", err=True)


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
