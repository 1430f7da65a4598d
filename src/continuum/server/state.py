"""What a running server holds: its configuration, the job threads, the one engine it owns
(the backend, every tier and the stateful worker), metrics, and the optional embedder.

:func:`build_state` loads everything; :meth:`ServerState.close` tears it down in a bounded time,
work in flight or not. Handlers reach the state through
:func:`continuum.server.deps.get_state`, never a global.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any

from prometheus_client import CollectorRegistry

from continuum.backends.embedders import Embedder
from continuum.backends.models import ModelFile
from continuum.engine import Engine, EngineSettings, Session, compose
from continuum.errors import InvalidRequest
from continuum.server.auth import LOOPBACK_HOSTS, KeyRing
from continuum.server.metrics import ServerMetrics
from continuum.server.quota import SessionLimits, SessionQuota
from continuum.server.responses import ResponseStore
from continuum.server.responses_tools import HostedTools
from continuum.server.runtime import CLOSE_GRACE_S, Executor
from continuum.server.schemas import RequestDefaults
from continuum.stateful.lane_order import LaneOrder
from continuum.stateful.worker import Worker

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    """The HTTP front's own settings, and the engine's settings tree (what it composes)."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    keys: KeyRing = field(default_factory=KeyRing)  # API key -> tenant; empty: one tenant
    # Host names answered (DNS rebinding); None: any. Default: loopback, where serve binds
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    max_queue: int = 16
    max_body_bytes: int = 4 << 20
    default_max_tokens: int = 256
    # the sampling seed of requests that send none (None: a fresh one each); set, sampled
    # replies are reproducible, as llama-server's and vLLM's --seed
    seed: int | None = None
    sessions: SessionLimits = field(default_factory=SessionLimits)  # per-tenant quotas
    # the bearer key of the /admin routes (drain); None: they are refused
    admin_key: str | None = None
    # Responses tools only OpenAI's servers run (web_search, ...): "leave-out" of the prompt,
    # named in the response, or "refuse" with a 400
    hosted_tools: HostedTools = "leave-out"

    @classmethod
    def of(cls, **values: Any) -> ServerConfig:
        """A configuration from flat values: the front's fields by name, the rest leaves of the
        engine's tree (``ServerConfig.of(n_ctx=1024, parallel=1, max_queue=4)``)."""
        own = {f.name for f in fields(cls)} - {"engine"}
        front = {k: v for k, v in values.items() if k in own}
        rest = {k: v for k, v in values.items() if k not in own}
        return cls(engine=EngineSettings.of(**rest), **front)

    def __post_init__(self) -> None:
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 0):
            raise InvalidRequest(
                f"seed must be an int >= 0 (the sampling seed of requests that send none), or "
                f"None for a fresh seed per request; got {s!r}"
            )

    @property
    def request_defaults(self) -> RequestDefaults:
        return RequestDefaults(self.default_max_tokens, self.seed)


@dataclass(kw_only=True)
class ServerState:
    """``engine`` owns the model and every tier; ``ops`` is its namespace view for stateless
    routes (each request names its tenant); ``worker`` runs stateful sessions on the engine's
    context, or is None when the backend keeps no resident sequences (a remote upstream)."""

    config: ServerConfig
    executor: Executor
    engine: Engine
    ops: Session
    worker: Worker | None
    model_id: str
    metrics: ServerMetrics
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    embedder: Embedder | None = None
    responses: ResponseStore = field(default_factory=ResponseStore)  # for previous_response_id
    quota: SessionQuota = field(default_factory=lambda: SessionQuota(SessionLimits()))
    draining: bool = False  # POST /admin/drain: no new sessions, /health answers 503

    def sessions(self) -> Worker:
        """The stateful worker, or a 400 naming why there is none."""
        if self.worker is None:
            raise InvalidRequest(
                f"this server's backend ({self.engine.backend_name}) keeps no resident sequences: "
                "stateful sessions need `continuum serve --backend llamacpp`"
            )
        return self.worker

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop within a bounded time, work in flight or not: queued jobs fail with a 503
        (:class:`~continuum.errors.ShuttingDown`); running ones get ``grace_s`` to finish, then
        the model stops them at their next decode and they get ``grace_s`` more; then the
        engine closes (sessions parked, the model freed). A job that still runs after that is
        stuck outside the model: the engine is left open for the process's exit to free,
        since closing it under that job could crash the process."""
        if not self.executor.stop(grace_s):
            self.engine.interrupt()
            stopped = self.executor.stop(grace_s)
            self.engine.resume()  # parking sessions below decodes again
            if not stopped:
                log.error(
                    "job threads still running %.0f s after the model stopped them: the "
                    "engine is left open for the process's exit",
                    2 * grace_s,
                )
                return
        self.engine.close()


def build_state(config: ServerConfig) -> ServerState:
    """Create the engine — one model load, one llama.cpp context for sessions and the reuse
    stack alike — on the executor thread, which owns it from then on."""
    lanes = config.engine.lanes
    order = LaneOrder.parse(lanes.lane_order)
    executor = Executor(config.max_queue, threads=lanes.parallel + 1, order=order)
    try:
        engine = executor.call(lambda: compose(config.engine))
    except BaseException:
        executor.close()
        raise
    # /v1/embeddings answers with the semantic tier's embedder
    embedder = engine.semantic.embedder if engine.semantic is not None else None
    ops = Session("default", engine=engine)
    worker = engine.worker() if engine.has_sessions else None
    if worker is not None:
        executor.programs = worker.program  # jobs of older programs first (lane_order)
    # stored responses outlive the process in the history store, when there is one
    responses = ResponseStore(log=worker.store if worker is not None else None)
    model = getattr(engine.backend, "model", None)
    model_id = model.path.stem if isinstance(model, ModelFile) else str(model)
    registry = CollectorRegistry()
    return ServerState(
        config=config,
        executor=executor,
        engine=engine,
        ops=ops,
        worker=worker,
        model_id=model_id,
        metrics=ServerMetrics(registry),
        registry=registry,
        embedder=embedder,
        responses=responses,
        quota=SessionQuota(config.sessions),
    )
