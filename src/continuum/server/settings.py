"""``continuum serve``'s settings tree, assembled from what each component declares.

:class:`ServeSettings` holds the engine's tree (:class:`~continuum.engine.compose.EngineSettings`:
a section per backend, the lanes, the store, each tier), the session quotas, and the HTTP
front's own (:class:`HttpSettings`). ``continuum serve``'s options are generated from it
(:mod:`continuum.cli.settings_options`), and :func:`server_config` turns a tree into the
server's :class:`~continuum.server.state.ServerConfig`, refusing malformed values (a Redis URL, a
routing option, a keys file) before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import create_model

from continuum.backends.registry import BackendRegistry
from continuum.engine.compose import EngineSettings
from continuum.server.auth import KeyRing, allowed_hosts_for
from continuum.server.quota import SessionSettings
from continuum.server.state import ServerConfig
from continuum.settings import Settings, setting


class HttpSettings(Settings):
    """The HTTP front: where it listens, who may call it, and what it accepts."""

    host: str = setting("127.0.0.1", "Interface to bind (127.0.0.1: this machine only).")
    port: int = setting(8000, "Port to bind (0: any free one).", ge=0, le=65535)
    api_keys: tuple[str, ...] = setting(
        (),
        "TENANT=KEY (repeatable): 'Authorization: Bearer KEY' is tenant TENANT on every "
        "route but /health; a bare KEY is tenant 'default'. None: one unauthenticated tenant.",
        flags=("--api-key",),
        envvar="CONTINUUM_API_KEY",
        secret=True,
    )
    keys_file: Path | None = setting(
        None,
        "Keys file of 'TENANT sha256:HEX' lines, as `continuum keys add` writes it.",
        flags=("--api-keys",),
        exists=True,
    )
    admin_key: str | None = setting(
        None,
        "Bearer key of the admin routes (POST /admin/drain parks every session for another "
        "worker and turns /health to 503). None: they are refused.",
        envvar="CONTINUUM_ADMIN_KEY",
        secret=True,
    )
    allowed_host: tuple[str, ...] = setting(
        (),
        "A Host name the server answers to, besides the loopback names on loopback "
        "(repeatable). Bound elsewhere without one, any Host is answered.",
    )
    max_queue: int = setting(16, "Requests waiting for the model before new ones get 429.", ge=1)
    max_body_bytes: int = setting(
        4 << 20,
        "Largest request body accepted (413 past it). A session bundle with its KV "
        "(POST /v1/sessions/import) takes about 6-12 KB per resident token: raise it to move "
        "long sessions with their KV.",
        ge=1024,
    )
    seed: int | None = setting(
        None,
        "The sampling seed of requests that send none: sampled replies (temperature > 0) "
        "become reproducible, and the result memo may answer them. Default: a fresh seed each.",
        ge=0,
    )
    hosted_tools: Literal["leave-out", "refuse"] = setting(
        "leave-out",
        "Responses tools only OpenAI's servers run (web_search, file_search, ...), which "
        "agent clients such as Codex send on every request: leave them out of the prompt "
        "(named in the response's continuum.left_out and logged), or refuse the request with "
        "a 400.",
    )


class ServeSettings(Settings):
    """Everything ``continuum serve`` can be told (see the module docstring)."""

    engine: EngineSettings = EngineSettings()
    http: HttpSettings = HttpSettings()
    sessions: SessionSettings = SessionSettings()

    @classmethod
    def with_backends(cls, registry: BackendRegistry) -> type[ServeSettings]:
        """This tree with a section for every backend ``registry`` knows (an installed
        package's included), so the command line lists their options."""
        engine = EngineSettings.with_backends(registry)
        if engine is EngineSettings:
            return cls
        made = create_model(cls.__name__, __base__=cls, engine=(engine, engine()))
        return made


def server_config(settings: ServeSettings) -> ServerConfig:
    """The server's configuration from a settings tree; a malformed routing option
    (:class:`~continuum.errors.BackendConfigError`), Redis URL or keys file, or an unknown
    backend, is refused here, before anything loads."""
    http, engine = settings.http, settings.engine
    settings.check()
    return ServerConfig(
        engine=engine,
        admin_key=http.admin_key,
        keys=KeyRing.parse(http.api_keys, [http.keys_file] if http.keys_file else []),
        allowed_hosts=allowed_hosts_for(http.host, http.allowed_host),
        max_queue=http.max_queue,
        seed=http.seed,
        sessions=settings.sessions.limits(),
        max_body_bytes=http.max_body_bytes,
        hosted_tools=http.hosted_tools,
    )


__all__ = ["HttpSettings", "ServeSettings", "server_config"]
