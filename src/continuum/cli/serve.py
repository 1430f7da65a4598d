"""``continuum serve``: the OpenAI-compatible HTTP server on uvicorn.

The model loads after the address is announced on stderr; the server's state is closed when
uvicorn returns (Ctrl-C included).
"""

from __future__ import annotations

import click

from continuum.cli.common import build_server_state, ctx_opt, model_opt, store_opt, threads_opt


@click.command("serve")
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
@store_opt
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
@click.option(
    "--backend",
    default="llamacpp",
    show_default=True,
    help="Backend by registry name: llamacpp (in process) or openai_http (--upstream).",
)
@click.option(
    "--upstream",
    default=None,
    help="With --backend openai_http: the OpenAI-compatible server's base URL (…/v1); the "
    "reuse stack runs in front of it (API key from CONTINUUM_UPSTREAM_API_KEY).",
)
@click.option("--upstream-model", default=None, help="The upstream's model name.")
@click.option(
    "--compaction",
    type=click.Choice(["window", "summary"]),
    default="window",
    show_default=True,
    help="At a session's high-water mark: drop the oldest turns from its window, or have "
    "the model summarise them into a continuity note.",
)
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
    backend: str,
    upstream: str | None,
    upstream_model: str | None,
    compaction: str,
) -> None:
    """OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/sessions, /metrics
    (and /v1/embeddings with --semantic)."""
    import uvicorn

    from continuum.server.app import create_app

    click.echo(f"loading the model; serving on http://{host}:{port}", err=True)
    state = build_server_state(
        model=model,
        n_ctx=n_ctx,
        threads=threads,
        api_key=api_key,
        max_queue=max_queue,
        store=store,
        semantic=semantic,
        graph=graph,
        backend=backend,
        upstream=upstream,
        upstream_model=upstream_model,
        compaction=compaction,
    )
    try:
        uvicorn.run(create_app(state), host=host, port=port, log_level="warning")
    finally:
        state.close()
