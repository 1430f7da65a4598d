"""What a running server holds: its configuration, the job threads, the one engine it owns
(the backend, every tier and the stateful worker), metrics, and the optional embedder.

:func:`build_state` loads everything; :meth:`ServerState.close` tears it down in a bounded time,
work in flight or not. Handlers reach the state through
:func:`continuum.server.deps.get_state`, never a global.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from continuum.backends.embedders import Embedder
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.backends.models import ModelFile
from continuum.backends.registry import BackendRegistry
from continuum.backends.routing import UpstreamRouting
from continuum.backends.step_plan import ITL_BUDGET
from continuum.engine import Engine, EngineConfig, Session
from continuum.errors import InvalidRequest, UnknownBackend
from continuum.server.auth import LOOPBACK_HOSTS, KeyRing
from continuum.server.metrics import ServerMetrics
from continuum.server.quota import SessionLimits, SessionQuota
from continuum.server.responses import ResponseStore
from continuum.server.responses_tools import HostedTools
from continuum.server.runtime import CLOSE_GRACE_S, Executor
from continuum.server.schemas import RequestDefaults
from continuum.stateful.compaction import CompactionMode
from continuum.stateful.worker import Worker, WorkerConfig
from continuum.store.stores import StoreAddress
from continuum.tiers.memory_graph import MemoryGraph
from continuum.tiers.semantic import SemanticTier
from continuum.tiers.verifier import JudgeVerifier

log = logging.getLogger(__name__)


@dataclass
class ServerConfig:
    model: str | None = None
    n_ctx: int = 8192
    threads: int | None = None
    keys: KeyRing = field(default_factory=KeyRing)  # API key -> tenant; empty: one tenant
    # Host names answered (DNS rebinding); None: any. Default: loopback, where serve binds
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    max_queue: int = 16
    # sessions resident at once, decoded together (continuous batching); requests run on
    # parallel + 1 job threads
    parallel: int = 4
    # how a batch step's room goes to prefills that do not fit whole: "oldest" or "equal"
    prefill_share: str = "oldest"
    itl_budget: float | None = ITL_BUDGET
    max_body_bytes: int = 4 << 20
    default_max_tokens: int = 256
    # the sampling seed of requests that send none (None: a fresh one each); set, sampled
    # replies are reproducible, as llama-server's and vLLM's --seed
    seed: int | None = None
    store: StoreAddress | Path | str | None = None  # a SQLite file, or a redis:// URL (a fleet's)
    snapshot_dir: Path | None = None
    n_slots: int = 7
    # the semantic tier on /v1/chat/completions and /v1/completions, and /v1/embeddings, with
    # the default embedder (needs the `semantic` extra)
    semantic: bool = False
    # what accepts a semantic candidate: "judge" (the instruct model, tiers/verifier.py) or
    # "guard" (the word-rule guard alone: measured to serve different questions, see README)
    semantic_verifier: str = "judge"
    graph: StoreAddress | Path | str | None = None  # a memory graph: SQLite or redis://
    eager_glue: bool = True  # sessions decode the next turn's template tokens while idle
    # every reuse gives exactly the cold answer: replies' KV is decoded again in whole batches
    # before it is reused (EngineConfig.exact, WorkerConfig.exact)
    exact: bool = False
    # the backend, by registry name: llamacpp (in process) or openai_http (a remote
    # OpenAI-compatible server at `upstream`, the tiers in front; no stateful sessions)
    backend: str = "llamacpp"
    upstream: str | None = None
    upstream_model: str | None = None
    upstream_api_key: str | None = None
    # the tenant's cache salt and the conversation's affinity key on every upstream request
    upstream_routing: UpstreamRouting = field(default_factory=UpstreamRouting)
    # sessions (and hinted sessions) at their high-water mark: "window" or "summary"
    compaction: CompactionMode = "window"
    sessions: SessionLimits = field(default_factory=SessionLimits)  # per-tenant quotas
    # the bearer key of the /admin routes (drain); None: they are refused
    admin_key: str | None = None
    # Responses tools only OpenAI's servers run (web_search, ...): "leave-out" of the prompt,
    # named in the response, or "refuse" with a 400
    hosted_tools: HostedTools = "leave-out"

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
                f"this server's backend ({self.config.backend}) keeps no resident sequences: "
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


def _backend_options(config: ServerConfig) -> dict[str, Any]:
    known = BackendRegistry().names()
    if config.backend not in known:
        raise UnknownBackend(config.backend, known)
    if config.backend == "llamacpp":
        from continuum.backends.models import resolve_model

        return {
            "model": resolve_model(config.model),
            "n_ctx": config.n_ctx,
            "n_threads": config.threads,
            "n_slots": config.n_slots,
        }
    if config.upstream is None:
        raise InvalidRequest(f"--backend {config.backend} needs --upstream URL")
    return {
        "base_url": config.upstream,
        "model": config.upstream_model or config.model or "default",
        "api_key": config.upstream_api_key,
        "routing": config.upstream_routing,
    }


def judge_for(engine: Engine, threads: int | None) -> JudgeVerifier:
    """The semantic tier's judge: on the engine's own weights when it runs the default model."""
    llama = getattr(engine.backend, "llama", None)
    share = llama if isinstance(llama, LlamaCppBackend) else None
    return JudgeVerifier.open(share=share, threads=threads)


def build_state(config: ServerConfig) -> ServerState:
    """Create the engine — one model load, one llama.cpp context for sessions and the reuse
    stack alike — on the executor thread, which owns it from then on."""
    lanes = config.parallel if config.backend == "llamacpp" else 1
    executor = Executor(config.max_queue, threads=lanes + 1)
    embedder: Embedder | None = None
    if config.semantic:
        from continuum.backends.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()

    def make() -> Engine:
        options = _backend_options(config)
        engine = Engine(
            backend=config.backend,
            config=EngineConfig(snapshot_dir=config.snapshot_dir, exact=config.exact),
            semantic=SemanticTier(embedder) if embedder is not None else None,
            graph=MemoryGraph(config.graph, embedder=embedder) if config.graph else None,
            worker=WorkerConfig(
                eager_glue=config.eager_glue,
                compaction=config.compaction,
                parallel=lanes,
                prefill_share=config.prefill_share,
                itl_budget=config.itl_budget,
            ),
            store=config.store,
            **options,
        )
        if engine.semantic is not None and config.semantic_verifier == "judge":
            engine.semantic.verifier = judge_for(engine, config.threads)
        if engine.has_sessions:
            engine.worker()  # open the history store now, on this thread
        return engine

    try:
        engine = executor.call(make)
    except BaseException:
        executor.close()
        raise
    ops = Session("default", engine=engine)
    worker = engine.worker() if engine.has_sessions else None
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
