"""``continuum serve``: an OpenAI-compatible server over stateful sessions and the reuse stack.

Routes:

- ``POST /v1/chat/completions`` (streaming SSE or not) and ``POST /v1/completions``: every
  request runs through the reuse stack (memo -> prefix KV -> layer KV -> cold). With the header
  ``X-Continuum-Session: <id>`` a chat request is instead a turn of that stateful session: the
  full transcript is verified against the resident prefix and only the suffix is decoded.
- ``POST /v1/sessions`` (create + wake), ``POST /v1/sessions/{id}/messages`` (send only the new
  messages), ``GET /v1/sessions/{id}`` (history + metrics), ``DELETE /v1/sessions/{id}``.
- ``GET /v1/models``, ``GET /metrics`` (Prometheus), ``GET /health``.

``usage.prompt_tokens_details.cached_tokens`` carries the tokens reused, so unmodified OpenAI
clients see their savings; ``usage.continuum`` carries the per-turn metrics and ``hit_tier``.

Tenancy: the namespace is the ``X-Continuum-Tenant`` header (default ``default``), prefixed by
the API key's hash when a key is configured; sessions and caches never cross namespaces.

Disconnects: if a streaming client goes away before the reply is complete, nothing of that turn
is committed — neither its new messages nor the partial reply — and the session's resident KV
is verified on its next turn as always. A reply that finished before the disconnect was noticed
is committed.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import ClientDisconnect

from continuum.backends.embedders import Embedder
from continuum.engine import EngineConfig, OpResult, Session
from continuum.errors import (
    BackendError,
    ChatTemplateError,
    ContextOverflow,
    ContinuumError,
    EmbeddingError,
    InvalidRequest,
    MissingExtra,
    ModelFileError,
    Overloaded,
    SessionBusy,
    SessionClosed,
    SessionNotFound,
    SnapshotError,
    StoreError,
    UnknownModel,
)
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.server.metrics import ServerMetrics
from continuum.server.runtime import Executor
from continuum.stateful.params import TurnResult
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker
from continuum.tiers.memory_graph import MemoryGraph
from continuum.tiers.semantic import SemanticTier

SESSION_HEADER = "x-continuum-session"
TENANT_HEADER = "x-continuum-tenant"

# exception type -> (HTTP status, OpenAI error type, code); matched by type, never by message
ERROR_TABLE: list[tuple[type[BaseException], int, str, str]] = [
    (Overloaded, 429, "rate_limit_error", "queue_full"),
    (UnknownModel, 404, "invalid_request_error", "model_not_found"),
    (SessionNotFound, 404, "invalid_request_error", "session_not_found"),
    (SessionBusy, 409, "invalid_request_error", "session_busy"),
    (SessionClosed, 409, "invalid_request_error", "session_closed"),
    (ContextOverflow, 400, "invalid_request_error", "context_length_exceeded"),
    (ChatTemplateError, 400, "invalid_request_error", "chat_template_error"),
    (InvalidRequest, 400, "invalid_request_error", "invalid_request"),
    (EmbeddingError, 400, "invalid_request_error", "embedding_error"),
    (MissingExtra, 501, "server_error", "missing_extra"),
    (ModelFileError, 500, "server_error", "model_file_error"),
    (SnapshotError, 500, "server_error", "snapshot_error"),
    (StoreError, 500, "server_error", "store_error"),
    (BackendError, 500, "server_error", "backend_error"),
    (ContinuumError, 500, "server_error", "internal_error"),
]


class _Gone(ContinuumError):
    """Raised inside generation when the streaming client has disconnected."""


class _TooLargeError(ContinuumError):
    """The request body is larger than the configured limit."""


def error_body(message: str, etype: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": etype, "param": param, "code": code}}


def error_response(exc: BaseException) -> JSONResponse:
    for etype_, status, etype, code in ERROR_TABLE:
        if isinstance(exc, etype_):
            headers = {}
            if isinstance(exc, Overloaded):
                headers["Retry-After"] = str(exc.retry_after_s)
            return JSONResponse(error_body(str(exc), etype, code), status, headers=headers)
    return JSONResponse(error_body("internal server error", "server_error", "internal_error"), 500)


# -- request schemas (pydantic at the edge; messages are validated by continuum.messages) --------
class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class SamplingFields(_Strict):
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int | None = None

    def params(self, default_max: int) -> GenerationParams:
        if self.n not in (None, 1):
            raise InvalidRequest("n > 1 is not supported: send one request per choice")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        p = GenerationParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=stop,
        )
        p.validate()
        return p


class ChatRequest(SamplingFields):
    model: str
    messages: list[Any]
    tools: list[Any] | None = None


class CompletionRequest(SamplingFields):
    model: str
    prompt: str


class EmbeddingsRequest(_Strict):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    user: str | None = None


class InputParams(SamplingFields):
    """Query parameters of ``POST /v1/sessions/{id}/input`` (the body is the message text)."""

    model_config = ConfigDict(strict=False, extra="ignore")
    role: str = "user"
    name: str | None = None
    tool_call_id: str | None = None


class SessionCreate(_Strict):
    system: str | None = None
    continuity: str | None = None
    session_id: str | None = None


class SessionMessages(SamplingFields):
    messages: list[Any]


@dataclass
class ServerConfig:
    model: str | None = None
    n_ctx: int = 8192
    threads: int | None = None
    api_key: str | None = None
    max_queue: int = 16
    max_body_bytes: int = 4 << 20
    default_max_tokens: int = 256
    store: Path | None = None
    snapshot_dir: Path | None = None
    n_slots: int = 7
    # the semantic tier on /v1/chat/completions and /v1/completions, and /v1/embeddings, with
    # the default embedder (needs the `semantic` extra)
    semantic: bool = False
    graph: Path | None = None  # a memory graph (SQLite) for the reuse stack
    eager_glue: bool = True  # sessions decode the next turn's template tokens while idle


@dataclass
class ServerState:
    config: ServerConfig
    executor: Executor
    worker: Worker
    ops: Session
    model_id: str
    metrics: ServerMetrics
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    embedder: Embedder | None = None

    def close(self) -> None:
        self.executor.call(self.ops.close)
        self.executor.call(self.worker.close)
        self.executor.close()


def build_state(config: ServerConfig) -> ServerState:
    """Load the model twice — one context for stateful sessions, one for the reuse stack — on
    the executor thread, which owns both from then on."""
    from continuum.backends.models import resolve_model

    executor = Executor(config.max_queue)
    mf = resolve_model(config.model)
    embedder: Embedder | None = None
    if config.semantic:
        from continuum.backends.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()

    def make() -> tuple[Worker, Session]:
        from continuum.backends.llamacpp import LlamaConfig
        from continuum.stateful.worker import WorkerConfig

        worker = Worker(
            mf,
            WorkerConfig(
                llama=LlamaConfig(
                    n_ctx=config.n_ctx, n_threads=config.threads, n_threads_batch=config.threads
                ),
                snapshot_dir=config.snapshot_dir,
                eager_glue=config.eager_glue,
            ),
            store=config.store,
        )
        ops = Session(
            "default",
            model=mf,
            n_ctx=config.n_ctx,
            n_threads=config.threads,
            n_slots=config.n_slots,
            config=EngineConfig(snapshot_dir=config.snapshot_dir and config.snapshot_dir / "layer"),
            semantic=SemanticTier(embedder) if embedder is not None else None,
            graph=MemoryGraph(config.graph, embedder=embedder) if config.graph else None,
        )
        ops.backend  # load now, on this thread  # noqa: B018
        return worker, ops

    try:
        worker, ops = executor.call(make)
    except BaseException:
        executor.close()
        raise
    registry = CollectorRegistry()
    return ServerState(
        config, executor, worker, ops, mf.path.stem, ServerMetrics(registry), registry, embedder
    )


def _usage(prompt: int, completion: int, cached: int, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "continuum": extra,
    }


def _op_usage(r: OpResult) -> dict[str, Any]:
    m = r.metrics
    extra: dict[str, Any] = {
        "hit_tier": m.hit_tier,
        "tokens_sent": m.tokens_sent,
        "tokens_saved": m.tokens_saved if m.tokens_saved_known else "unknown",
        "ttft_ms": m.ttft_ms,
        "total_ms": m.total_ms,
        "lookup_ms": m.lookup_ms,
    }
    if m.semantic:
        extra["semantic"] = m.semantic
        extra["semantic_score"] = m.semantic_score
    if m.graph or m.graph_surfaced:
        extra["memory_graph"] = m.graph
        extra["graph_surfaced"] = m.graph_surfaced
    return _usage(m.prompt_tokens, len(r.tokens), m.tokens_saved, extra)


def _turn_usage(r: TurnResult, session_id: str) -> dict[str, Any]:
    m = r.metrics
    extra = {
        "hit_tier": "prefix_kv" if m.tokens_reused else "cold",
        "session": session_id,
        "turn": r.turn,
        **m.to_dict(),
    }
    return _usage(
        m.tokens_reused + m.prompt_tokens_evaluated, m.completion_tokens, m.tokens_reused, extra
    )


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="continuum", version="0.1.0")
    app.state.continuum = state
    cfg = state.config
    key_tag = hashlib.sha256(cfg.api_key.encode()).hexdigest()[:12] + ":" if cfg.api_key else ""

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Any]) -> Response:
        if cfg.api_key and request.url.path != "/health":
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {cfg.api_key}":
                return JSONResponse(
                    error_body(
                        "missing or invalid API key: send Authorization: Bearer <key>",
                        "invalid_request_error",
                        "invalid_api_key",
                    ),
                    401,
                )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return JSONResponse(
                error_body(
                    f"request body over {cfg.max_body_bytes} bytes",
                    "invalid_request_error",
                    "body_too_large",
                ),
                413,
            )
        response: Response = await call_next(request)
        return response

    def tenant(request: Request) -> str:
        t = request.headers.get(TENANT_HEADER, "default").strip() or "default"
        return key_tag + t

    async def body(request: Request, schema: type[BaseModel]) -> Any:
        raw = await request.body()
        if len(raw) > cfg.max_body_bytes:
            raise _TooLargeError
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise InvalidRequest(f"the body is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise InvalidRequest("the body must be a JSON object")
        try:
            return schema.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidRequest(f"{where}: {first['msg']}") from None

    def check_model(model: str) -> None:
        if model not in (state.model_id, state.worker.model.digest, "continuum"):
            raise UnknownModel(model, [state.model_id])

    async def run(fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(state.executor.submit(fn))

    def own_session(session_id: str, ns: str) -> ChatSession:
        """Open (or find) a stored session on the model thread; 404 for another tenant's."""
        s = state.worker.open_session(session_id)
        if s.tenant != ns:
            raise SessionNotFound(session_id)
        return s

    @app.exception_handler(ContinuumError)
    async def on_error(request: Request, exc: ContinuumError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(_TooLargeError)
    async def on_too_large(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            error_body(
                f"request body over {cfg.max_body_bytes} bytes",
                "invalid_request_error",
                "body_too_large",
            ),
            413,
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": state.model_id, "queue_depth": state.executor.depth}

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.observe_state(state)
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "continuum",
                    "continuum": {
                        "digest": state.worker.model.digest,
                        "path": str(state.worker.model.path),
                    },
                }
            ],
        }

    # -- stateless completions through the reuse stack ---------------------------------------
    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        req = await body(request, ChatRequest)
        check_model(req.model)
        if req.tools:
            raise InvalidRequest(
                "tools are not supported yet: send the tool schema in the system message"
            )
        params = req.params(cfg.default_max_tokens)
        ns = tenant(request)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id:

            def turn(on_text: Callable[[str], None] | None) -> Any:
                return own_session(session_id, ns).turn(req.messages, params, on_text=on_text)

            return await respond(turn, req, "chat.completion", lambda r: _turn_usage(r, session_id))
        op = TokenOp("chat.completions", messages=tuple(req.messages), params=params)
        return await respond(
            lambda cb: state.ops.run(op, cb, namespace=ns), req, "chat.completion", _op_usage
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        req = await body(request, CompletionRequest)
        check_model(req.model)
        op = TokenOp("completions", prompt=req.prompt, params=req.params(cfg.default_max_tokens))
        ns = tenant(request)
        return await respond(
            lambda cb: state.ops.run(op, cb, namespace=ns), req, "text_completion", _op_usage
        )

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        req = await body(request, EmbeddingsRequest)
        embedder = state.embedder
        if embedder is None:
            raise InvalidRequest(
                "this server has no embedder; start it with `continuum serve --semantic`"
            )
        if req.model not in (embedder.name, embedder.identity, "continuum"):
            raise UnknownModel(req.model, [embedder.name])
        if req.encoding_format not in ("float", "base64"):
            raise InvalidRequest("encoding_format must be 'float' or 'base64'")
        texts = [req.input] if isinstance(req.input, str) else req.input
        vectors = await run(lambda: embedder.embed(texts))

        def encode(v: Any) -> Any:
            if req.encoding_format == "base64":  # little-endian float32, as OpenAI sends it
                return base64.b64encode(v.astype("<f4").tobytes()).decode()
            return [float(x) for x in v]

        return {
            "object": "list",
            "model": embedder.name,
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(v)}
                for i, v in enumerate(vectors)
            ],
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    # -- stateful sessions --------------------------------------------------------------------
    @app.post("/v1/sessions", status_code=201)
    async def create_session(request: Request) -> JSONResponse:
        req = await body(request, SessionCreate)
        ns = tenant(request)

        def make() -> dict[str, Any]:
            s = state.worker.create_session(
                req.system, continuity=req.continuity, session_id=req.session_id, tenant=ns
            )
            return {
                "id": s.id,
                "object": "session",
                "wake_tokens": len(state.worker.backend.tokens),
                "model": state.model_id,
            }

        if req.session_id is not None and not req.session_id.strip():
            raise InvalidRequest("session_id must not be empty")
        return JSONResponse(await run(make), 201)

    @app.post("/v1/sessions/{session_id}/messages", response_model=None)
    async def session_messages(session_id: str, request: Request) -> Response:
        req = await body(request, SessionMessages)
        params = req.params(cfg.default_max_tokens)
        ns = tenant(request)

        def turn(on_text: Callable[[str], None] | None) -> Any:
            return own_session(session_id, ns).append(req.messages, params, on_text=on_text)

        return await respond(turn, req, "chat.completion", lambda r: _turn_usage(r, session_id))

    @app.post("/v1/sessions/{session_id}/input", response_model=None)
    async def session_input(session_id: str, request: Request) -> Response:
        """Prefill on arrival: the request body is the new message's text, read as it arrives
        (send it chunked) and decoded while it streams in; the reply follows the end of the
        body (SSE with ?stream=true). Sampling parameters and role/name/tool_call_id go in the
        query string. A client that disconnects before the body ends commits nothing."""
        try:
            req = InputParams.model_validate(dict(request.query_params))
        except ValidationError as e:
            first = e.errors()[0]
            raise InvalidRequest(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
        params = req.params(cfg.default_max_tokens)
        if req.stream and req.stream_options is None:
            req.stream_options = {"include_usage": True}  # the turn's metrics end the stream
        ns = tenant(request)
        session = await run(lambda: own_session(session_id, ns))
        utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        received = 0

        def feed(text: str) -> int:
            return int(
                session.feed(text, role=req.role, name=req.name, tool_call_id=req.tool_call_id)
            )

        try:
            async for raw in request.stream():
                received += len(raw)
                if received > cfg.max_body_bytes:
                    await run(session.abandon)
                    raise _TooLargeError
                text = utf8.decode(raw)
                if text:
                    await run(lambda text=text: feed(text))  # type: ignore[misc]
            tail = utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            await run(session.abandon)
            raise InvalidRequest("the body is not valid UTF-8 text") from None
        except ClientDisconnect:
            await run(session.abandon)
            return Response(status_code=499)
        except BaseException:  # e.g. the queue was full: drop what arrived, then report it
            with contextlib.suppress(Exception):
                await run(session.abandon)
            raise
        if tail or session.arriving is None:
            await run(lambda: feed(tail))

        def commit(on_text: Callable[[str], None] | None) -> Any:
            return session.commit(params, on_text=on_text)

        return await respond(commit, req, "chat.completion", lambda r: _turn_usage(r, session_id))

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> dict[str, Any]:
        ns = tenant(request)

        def read() -> dict[str, Any]:
            s = own_session(session_id, ns)
            return {
                "id": s.id,
                "object": "session",
                "history": s.history,
                "turns": state.worker.store.turns(s.id),
                "resets": state.worker.store.resets(s.id),
            }

        result: dict[str, Any] = await run(read)
        return result

    @app.delete("/v1/sessions/{session_id}")
    async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
        ns = tenant(request)

        def delete() -> dict[str, Any]:
            own_session(session_id, ns)
            state.worker.delete_session(session_id)
            return {"id": session_id, "object": "session", "deleted": True}

        result: dict[str, Any] = await run(delete)
        return result

    # -- shared response path -----------------------------------------------------------------
    async def respond(
        job: Callable[[Callable[[str], None] | None], Any],
        req: SamplingFields,
        kind: str,
        usage_of: Callable[[Any], dict[str, Any]],
    ) -> Response:
        rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model = state.model_id
        if not req.stream:
            result = await run(lambda: job(None))
            state.metrics.observe(result)
            text, finish = result.text, result.finish_reason
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if kind == "chat.completion":
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return JSONResponse(
                {
                    "id": rid,
                    "object": kind,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage_of(result),
                }
            )
        return await stream(job, req, kind, rid, created, usage_of)

    async def stream(
        job: Callable[[Callable[[str], None] | None], Any],
        req: SamplingFields,
        kind: str,
        rid: str,
        created: int,
        usage_of: Callable[[Any], dict[str, Any]],
    ) -> Response:
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        gone = threading.Event()

        def on_text(piece: str) -> None:
            if gone.is_set():
                raise _Gone
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        def run_job() -> Any:
            try:
                return job(on_text)
            finally:
                loop.call_soon_threadsafe(pieces.put_nowait, None)

        future = asyncio.wrap_future(state.executor.submit(run_job))  # 429 before headers
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, always
        chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"
        include_usage = bool((req.stream_options or {}).get("include_usage"))

        def chunk(delta: dict[str, Any] | str | None, finish: str | None) -> str:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chunk_kind == "chat.completion.chunk":
                choice["delta"] = delta if isinstance(delta, dict) else {}
            else:
                choice["text"] = delta if isinstance(delta, str) else ""
            body_ = {
                "id": rid,
                "object": chunk_kind,
                "created": created,
                "model": state.model_id,
                "choices": [choice],
            }
            return f"data: {json.dumps(body_)}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                if chunk_kind == "chat.completion.chunk":
                    yield chunk({"role": "assistant", "content": ""}, None)
                while (piece := await pieces.get()) is not None:
                    yield chunk(
                        {"content": piece} if chunk_kind.startswith("chat") else piece, None
                    )
                try:
                    result = await future
                except ContinuumError as e:
                    resp = error_response(e)
                    yield f"data: {bytes(resp.body).decode()}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                state.metrics.observe(result)
                yield (
                    chunk({}, result.finish_reason)
                    if chunk_kind.startswith("chat")
                    else chunk("", result.finish_reason)
                )
                if include_usage:
                    body_ = {
                        "id": rid,
                        "object": chunk_kind,
                        "created": created,
                        "model": state.model_id,
                        "choices": [],
                        "usage": usage_of(result),
                    }
                    yield f"data: {json.dumps(body_)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                gone.set()  # a disconnect lands here: the model thread stops at the next token

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
