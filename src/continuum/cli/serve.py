"""``continuum serve``: the OpenAI-compatible HTTP server on uvicorn.

The model loads after the address is announced on stderr; the server's state is closed when
uvicorn returns (Ctrl-C included).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import click

from continuum.backends.routing import SALT_FIELDS, UpstreamRouting
from continuum.backends.step_plan import ITL_BUDGET
from continuum.cli.common import (
    PREFILL_SHARES,
    build_server_state,
    ctx_opt,
    model_opt,
    store_opt,
    threads_opt,
)
from continuum.server.quota import SessionLimits
from continuum.server.responses_tools import HOSTED_MODES

if TYPE_CHECKING:
    from continuum.server.auth import KeyRing
    from continuum.server.state import ServerState

DEFAULTS = SessionLimits()


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
    "api_keys",
    multiple=True,
    envvar="CONTINUUM_API_KEY",
    help="TENANT=KEY (repeatable): 'Authorization: Bearer KEY' is tenant TENANT on every "
    "route but /health; a bare KEY is tenant 'default'. None: one unauthenticated tenant.",
)
@click.option(
    "--api-keys",
    "keys_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="Keys file of 'TENANT sha256:HEX' lines, as `continuum keys add` writes it.",
)
@click.option(
    "--admin-key",
    envvar="CONTINUUM_ADMIN_KEY",
    default=None,
    help="Bearer key of the admin routes (POST /admin/drain parks every session for another "
    "worker and turns /health to 503). None: they are refused.",
)
@click.option(
    "--allowed-host",
    multiple=True,
    help="A Host name the server answers to, besides the loopback names on loopback "
    "(repeatable). Bound elsewhere without one, any Host is answered.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 32),
    default=4,
    show_default=True,
    help="Sessions resident at once, decoded together in each batch step (continuous "
    "batching); the others are parked as KV snapshots. 1: one turn at a time.",
)
@click.option(
    "--prefill-share",
    type=PREFILL_SHARES,
    default="oldest",
    show_default=True,
    help="With --parallel > 1, how a step's room goes to prefills too long for it: the oldest "
    "request first (lowest time to first token), equal shares (agents that start together "
    "run in lockstep: lower inter-token latency, more tokens/s, a later first token), or las: "
    "the program with the least attained service first (the shortest conversation so far).",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Every reuse hit answers exactly as a cold prefill of the whole prompt (greedy "
    "replies token for token): KV is reused only where it was decoded in whole prompt batches, "
    "so a reply's KV is decoded again (while the session is idle, else in the next turn's "
    "prefill) before it is reused. Off: replies' KV is reused as decoded, and a near-tie can "
    "flip an answer.",
)
@click.option(
    "--itl-budget",
    type=click.FloatRange(0),
    default=ITL_BUDGET,
    show_default=True,
    help="With --parallel > 1, while replies stream, a stateless request's prompt may make a "
    "step at most this many times as long as the replies' tokens alone (a long stateless "
    "prompt then no longer stalls the streams; its first token comes later). 0: no budget.",
)
@click.option(
    "--seed",
    type=click.IntRange(0),
    default=None,
    help="The sampling seed of requests that send none: sampled replies (temperature > 0) "
    "become reproducible, and the result memo may answer them. Default: a fresh seed each.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(1),
    default=16,
    show_default=True,
    help="Requests waiting for the model before new ones get 429.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(1024),
    default=4 << 20,
    show_default=True,
    help="Largest request body accepted (413 past it). A session bundle with its KV "
    "(POST /v1/sessions/import) takes about 6-12 KB per resident token: raise it to move "
    "long sessions with their KV.",
)
@store_opt
@click.option(
    "--max-sessions",
    type=click.IntRange(1),
    default=DEFAULTS.max_stored,
    show_default=True,
    help="Sessions one tenant may store; past it, creating one is refused (429).",
)
@click.option(
    "--max-open-sessions",
    type=click.IntRange(1),
    default=DEFAULTS.max_open,
    show_default=True,
    help="Sessions one tenant holds open; opening one more closes its least recently used "
    "(history kept: reopened from the log on its next request).",
)
@click.option(
    "--idle-close",
    type=click.FloatRange(0, min_open=True),
    default=DEFAULTS.idle_close_s,
    show_default=True,
    help="Seconds after which an unused open session is closed (history kept).",
)
@click.option(
    "--semantic",
    is_flag=True,
    help="Semantic tier on completions, and /v1/embeddings (needs continuum[semantic]).",
)
@click.option(
    "--semantic-verifier",
    type=click.Choice(["judge", "guard"]),
    default="judge",
    show_default=True,
    help="What accepts a semantic candidate: the instruct model as a judge, or the word-rule "
    "guard alone (faster, and measured to serve different questions: see the README).",
)
@click.option(
    "--graph",
    type=click.Path(dir_okay=False),
    default=None,
    help="Memory graph for the reuse stack: a SQLite file, or redis://host:port[/db][?prefix=]"
    " for one graph every worker of a fleet shares.",
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
    "--upstream-salt-field",
    default="none",
    show_default=True,
    help=f"Where each request carries its tenant's cache salt (a digest of the tenant): "
    f"{', '.join(SALT_FIELDS)}. cache_salt for vLLM >= 0.9, extra_key for SGLang; none for "
    "OpenAI (it refuses unknown fields) and servers without a salt (llama-server).",
)
@click.option(
    "--upstream-salt-secret",
    envvar="CONTINUUM_UPSTREAM_SALT_SECRET",
    default=None,
    help="Secret mixed into every salt and affinity key, so they cannot be computed from "
    "tenant names (env CONTINUUM_UPSTREAM_SALT_SECRET).",
)
@click.option(
    "--upstream-affinity-header",
    default="X-Session-ID",
    show_default=True,
    help="Header carrying the conversation's affinity key for the router in front of the "
    "upstream: X-Session-ID (vLLM router), x-user-id (production-stack session routing), "
    "X-SMG-Routing-Key (SGLang gateway), or 'none'.",
)
@click.option(
    "--upstream-prompt-cache-key",
    is_flag=True,
    help="Also send the affinity key as prompt_cache_key (OpenAI's cache routing hint).",
)
@click.option(
    "--compaction",
    type=click.Choice(["window", "summary"]),
    default="window",
    show_default=True,
    help="At a session's high-water mark: drop the oldest turns from its window, or have "
    "the model summarise them into a continuity note.",
)
@click.option(
    "--hosted-tools",
    type=click.Choice(HOSTED_MODES),
    default="leave-out",
    show_default=True,
    help="Responses tools only OpenAI's servers run (web_search, file_search, ...), which "
    "agent clients such as Codex send on every request: leave them out of the prompt (named "
    "in the response's continuum.left_out and logged), or refuse the request with a 400.",
)
def serve(
    model: str | None,
    n_ctx: int,
    threads: int | None,
    host: str,
    port: int,
    api_keys: tuple[str, ...],
    keys_file: str | None,
    admin_key: str | None,
    allowed_host: tuple[str, ...],
    parallel: int,
    prefill_share: str,
    itl_budget: float,
    exact: bool,
    seed: int | None,
    max_queue: int,
    max_body_bytes: int,
    store: str | None,
    max_sessions: int,
    max_open_sessions: int,
    idle_close: float,
    semantic: bool,
    semantic_verifier: str,
    graph: str | None,
    backend: str,
    upstream: str | None,
    upstream_model: str | None,
    upstream_salt_field: str,
    upstream_salt_secret: str | None,
    upstream_affinity_header: str,
    upstream_prompt_cache_key: bool,
    compaction: str,
    hosted_tools: str,
) -> None:
    """OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/sessions, /metrics
    (and /v1/embeddings with --semantic)."""
    from continuum.server.auth import allowed_hosts_for

    routing = upstream_routing(  # refused here, before anything loads, when malformed
        upstream_salt_field,
        upstream_salt_secret,
        upstream_affinity_header,
        upstream_prompt_cache_key,
    )
    keyring = _keyring(api_keys, keys_file)
    click.echo(f"loading the model; serving on http://{host}:{port}", err=True)
    state = build_server_state(
        model=model,
        n_ctx=n_ctx,
        threads=threads,
        keys=keyring,
        allowed_hosts=allowed_hosts_for(host, allowed_host),
        max_queue=max_queue,
        parallel=parallel,
        prefill_share=prefill_share,
        itl_budget=itl_budget or None,
        seed=seed,
        store=store,
        semantic=semantic,
        semantic_verifier=semantic_verifier,
        graph=graph,
        backend=backend,
        upstream=upstream,
        upstream_model=upstream_model,
        upstream_routing=routing,
        compaction=compaction,
        sessions=SessionLimits(max_sessions, max_open_sessions, idle_close),
        admin_key=admin_key,
        max_body_bytes=max_body_bytes,
        hosted_tools=hosted_tools,
        exact=exact,
    )
    _serve_until_stopped(state, host, port)


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


def _keyring(api_keys: tuple[str, ...], keys_file: str | None) -> KeyRing:
    """The API keys given, read; which tenants they name is said on stderr."""
    from continuum.server.auth import KeyRing

    keyring = KeyRing.parse(api_keys, [keys_file] if keys_file else [])
    if keyring.open:
        click.echo("no API key configured: every caller is the one tenant 'default'", err=True)
    else:
        click.echo(f"tenants by API key: {', '.join(keyring.tenants())}", err=True)
    return keyring


def upstream_routing(
    salt_field: str, salt_secret: str | None, affinity_header: str, prompt_cache_key: bool
) -> UpstreamRouting:
    """The ``--upstream-*`` options as routing settings (``--upstream-affinity-header none``:
    no header); a malformed one is a :class:`~continuum.errors.BackendConfigError`."""
    return UpstreamRouting(
        salt_field=salt_field,
        salt_secret=salt_secret,
        affinity_header=None if affinity_header.lower() == "none" else affinity_header,
        prompt_cache_key=prompt_cache_key,
    )


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)
