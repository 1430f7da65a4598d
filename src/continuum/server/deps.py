"""What every route needs: the server state, the caller's namespace, a validated body, and a
way onto the job threads.

Tenancy: the namespace is the tenant the caller's API key names (:mod:`continuum.server.auth`),
narrowed by the ``X-Continuum-Tenant`` header; sessions and caches never cross namespaces, and a
session of another namespace answers ``404`` exactly as a missing one does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from continuum.errors import (
    Draining,
    InvalidRequest,
    Overloaded,
    SessionNotFound,
    ShuttingDown,
    UnknownModel,
)
from continuum.params import GenerationParams
from continuum.results import Result
from continuum.server.auth import namespace
from continuum.server.errors import BodyTooLarge
from continuum.server.schemas import result_usage
from continuum.server.state import ServerState
from continuum.stateful.park_price import check_pause_hint
from continuum.stateful.session import ChatSession
from continuum.toolcalls import ToolParsing

SESSION_HEADER = "x-continuum-session"
TENANT_HEADER = "x-continuum-tenant"
HINT_HEADERS = ("x-session-id", "session-id")  # a client's own name for its conversation
# seconds until the conversation's next request (its reply calls a tool that takes this long)
PAUSE_HEADER = "x-continuum-pause"
HINT_PREFIX = "hint-"  # the ids of sessions made from hints; a client may not choose one

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def get_state(request: Request) -> ServerState:
    """The state :func:`continuum.server.app.create_app` was given."""
    state: ServerState = request.app.state.continuum
    return state


State = Annotated[ServerState, Depends(get_state)]


def tenant(state: ServerState, request: HTTPConnection) -> str:
    """The caller's namespace: the tenant its API key names (set by the guard in
    :mod:`continuum.server.app`, for a WebSocket at its handshake), narrowed by
    ``X-Continuum-Tenant``."""
    return namespace(request.state.tenant, request.headers.get(TENANT_HEADER))


def invalid(e: ValidationError) -> InvalidRequest:
    """A validation error, as one line naming the field (an unknown field first)."""
    errors = e.errors()
    unknown = [x for x in errors if x["type"] == "extra_forbidden"]
    first = (unknown or errors)[0]  # a misspelt field says so, not only that one is missing
    where = ".".join(str(p) for p in first["loc"])
    if first["type"] == "extra_forbidden":
        return InvalidRequest(f"unknown field {where!r}: this API does not take it; remove it")
    return InvalidRequest(f"{where}: {first['msg']}")


async def read_body(state: ServerState, request: Request) -> bytes:
    """The body, read chunk by chunk and refused (413) as soon as it passes the limit: a
    chunked body declares no length, and is never held whole past it."""
    limit, got = state.config.max_body_bytes, bytearray()
    async for chunk in request.stream():
        got += chunk
        if len(got) > limit:
            raise BodyTooLarge
    return bytes(got)


async def parse_body(state: ServerState, request: Request, schema: type[M]) -> M:
    """The JSON object body, validated by ``schema``; any failure is an ``InvalidRequest``."""
    return parse_object(await read_body(state, request), schema)


def parse_object(
    raw: bytes, schema: type[M], fixed: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> M:
    """``raw`` as one JSON object (``fixed`` first, when given), validated by ``schema``; any
    failure is an ``InvalidRequest``."""
    try:
        text = raw.decode("utf-8")  # strict: refuses surrogates sent as raw bytes
        data = json.loads(text)
        if "\\u" in text:  # an escape may encode a lone surrogate (\ud800): re-encode to see
            json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeError:
        raise InvalidRequest(
            "the body is not valid UTF-8, or holds a lone surrogate escape such as \\ud800"
        ) from None
    except RecursionError:
        raise InvalidRequest("the body's JSON is nested too deeply") from None
    except ValueError as e:
        raise InvalidRequest(f"the body is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    if fixed is not None:
        data = fixed(data)
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise invalid(e) from None


def check_model(state: ServerState, model: str) -> None:
    if model not in (state.model_id, state.engine.model_identity, "continuum"):
        raise UnknownModel(model, [state.model_id])


async def run(state: ServerState, fn: Callable[[], T], *, bounded: bool = True) -> T:
    """Run ``fn`` on a job thread; ``Overloaded`` (429) at once when the queue is full
    (never for a cleanup job, ``bounded=False``)."""
    result: T = await asyncio.wrap_future(state.executor.submit(fn, bounded=bounded))
    return result


def own_session(state: ServerState, session_id: str, ns: str) -> ChatSession:
    """Open (or find) a stored session on a job thread; 404 for another tenant's, decided
    from its store row before anything is opened, activated or rebuilt."""
    worker = state.sessions()
    with worker.claim():  # job threads run at once: the quota and lookups hold the worker
        if worker.store.session_tenant(session_id) != ns:
            raise SessionNotFound(session_id)
        return state.quota.use(ns, worker.open_session(session_id))


async def check_owner(state: ServerState, session_id: str, ns: str) -> None:
    """Before a streamed turn answers 200: another tenant's (or no) session is a 404 now,
    not an error event inside the stream."""

    def owner() -> None:
        if state.sessions().store.session_tenant(session_id) != ns:
            raise SessionNotFound(session_id)

    await run(state, owner)


def new_session(state: ServerState, ns: str, system: str | None, **kw: Any) -> ChatSession:
    """Create a session in ``ns`` on a job thread, within the tenant's quota."""
    worker = state.sessions()
    if state.draining:
        raise Draining()
    with worker.claim():
        state.quota.admit(worker, ns)
        return state.quota.use(ns, worker.create_session(system, tenant=ns, **kw))


def session_hint(request: HTTPConnection, *body_hints: str | None) -> str | None:
    """The client's own name for its conversation, when it gives one: an ``X-Session-ID`` or
    ``session-id`` header (Codex's), or a body field (``prompt_cache_key``, as Codex sends,
    then ``user``)."""
    headers = (request.headers.get(h) for h in HINT_HEADERS)
    return next((h for h in (*headers, *body_hints) if h), None)


def hint_session_id(ns: str, hint: str) -> str:
    """The id of the session a hint names in tenant ``ns``."""
    return HINT_PREFIX + hashlib.sha256(f"{ns}\0{hint}".encode()).hexdigest()[:32]


def prefetch(state: ServerState, request: HTTPConnection, session_id: str | None = None) -> None:
    """A request naming a session before its body (``session_id`` from its path, an
    ``X-Continuum-Session`` or a hint header) is coming back: restore that session's KV on a
    job thread while the body is still read (:meth:`~continuum.stateful.worker.Worker.prefetch`).
    A guess, never an error: a session that is not open here, or another tenant's, is left
    alone."""
    worker = state.worker
    if worker is None or state.draining:
        return
    ns = tenant(state, request)
    sid = session_id or request.headers.get(SESSION_HEADER)
    if sid is None:
        hint = next((h for h in (request.headers.get(k) for k in HINT_HEADERS) if h), None)
        if hint is None:
            return
        sid = hint_session_id(ns, hint)
    with contextlib.suppress(ShuttingDown, Overloaded):
        state.executor.submit(lambda: worker.prefetch(sid, ns), bounded=False)


def pause_hint(request: HTTPConnection) -> float | None:
    """The client's expected pause after this turn (``X-Continuum-Pause``, seconds: its tool's
    running time), checked before any work: a bad value is a 400 naming the header."""
    value = request.headers.get(PAUSE_HEADER)
    return None if value is None else check_pause_hint(value, "the X-Continuum-Pause header")


@dataclass(frozen=True, slots=True)
class SessionJob:
    """A job that runs on the session ``program`` names (the sessions API's turns): the job
    queue orders it by that program (``--lane-order``)."""

    fn: Callable[[Callable[[str], None] | None], Result]
    program: str

    def __call__(self, on_text: Callable[[str], None] | None) -> Result:
        return self.fn(on_text)


@dataclass(frozen=True, slots=True)
class Served:
    """The session a turn ran on; when the request created it, what its wake phase decoded
    (``wake_tokens`` in ``wake_ms``): that is this request's prefill too, not a cache hit."""

    session: ChatSession
    wake_tokens: int = 0
    wake_ms: float = 0.0


@dataclass
class SessionTurn:
    """A chat-shaped turn of the session ``find`` returns, looked up on its job thread when
    the job runs; ``usage`` reports the session that served it (and a wake it paid for). The
    lookup and the turn's start hold the worker's claim as one: taken twice, each could wait
    for a decode call of the batch scheduler's step."""

    state: ServerState
    find: Callable[[], Served]
    messages: list[Any]
    params: GenerationParams
    tools: tuple[dict[str, Any], ...] | None
    parsing: ToolParsing | None
    pause: float | None = None  # the client's word for the pause after this turn
    served: Served | None = None
    program: str | None = None  # the session id it runs on, when known before it runs

    def __call__(self, on_text: Callable[[str], None] | None) -> Result:
        with self.state.sessions().claim():  # the lookup and the turn: one wait for the context
            self.served = self.find()
            session = self.served.session
            r = session.turn(
                self.messages, self.params, on_text, tools=self.tools, calls=self.parsing
            )
            if self.pause is not None:  # what parking it costs counts the client's word
                session.pauses.hint(self.pause)
            return r

    def usage(self, r: Result) -> dict[str, Any]:
        s = self.served
        assert s is not None
        return result_usage(r, s.session.id, (s.wake_tokens, s.wake_ms))


def hinted_session(
    state: ServerState,
    hint: str,
    ns: str,
    messages: list[Any],
    tools: Sequence[dict[str, Any]] | None = None,
) -> Served:
    """The resident session a hint names in this tenant, created on first use (its system
    prompt and tools those of the conversation, so its wake is the conversation's own). Every
    turn is verified by message identity, so a client that reuses a hint for another conversation
    gets correct replies (decoded from where it diverges), only slower."""
    sid = hint_session_id(ns, hint)
    worker = state.sessions()
    with worker.claim():  # a second request with the hint waits for the first's creation
        worker.wait_opening(sid)
        try:
            return Served(own_session(state, sid, ns))
        except SessionNotFound:
            pass
        first = messages[0] if messages and isinstance(messages[0], dict) else {}
        system = first.get("content") if first.get("role") == "system" else None
        system = system if isinstance(system, str) else None
        t0 = time.perf_counter()
        session = new_session(state, ns, system, session_id=sid, tools=tools)
        return Served(session, session.wake_decoded, (time.perf_counter() - t0) * 1000.0)
