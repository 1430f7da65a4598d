"""Stateful sessions: ``POST /v1/sessions`` (create + wake), ``POST /v1/sessions/{id}/messages``
(send only the new messages), ``POST /v1/sessions/{id}/input`` (prefill on arrival),
``GET /v1/sessions/{id}`` (history + metrics) and ``DELETE /v1/sessions/{id}``;
``GET /v1/sessions/{id}/bundle`` and ``POST /v1/sessions/import`` move a session to another
worker as one checksummed bundle (format: :mod:`continuum.store.bundle_format`).

A session belongs to the namespace that created it; to any other it does not exist (``404``).
An imported session belongs to the importing namespace, which must be the bundle's own: a
bundle naming another tenant is refused (``403``), never re-owned
(:mod:`continuum.stateful.bundle` says why).
"""

from __future__ import annotations

import codecs
import contextlib
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from continuum.errors import Draining, InvalidRequest, SessionNotFound
from continuum.results import Result
from continuum.server.deps import (
    HINT_PREFIX,
    SessionJob,
    State,
    check_owner,
    invalid,
    new_session,
    own_session,
    parse_body,
    prefetch,
    read_body,
    run,
    tenant,
)
from continuum.server.errors import BodyTooLarge
from continuum.server.schemas import InputParams, SessionCreate, SessionMessages, result_usage
from continuum.server.sse import OnText, respond
from continuum.server.state import ServerState
from continuum.stateful.session import ChatSession
from continuum.store.bundle_format import MEDIA_TYPE, decode_bundle

router = APIRouter()
IMPORT_PATH = "/v1/sessions/import"
BUNDLE_TYPES = (MEDIA_TYPE, "application/octet-stream")  # what an import's body may be sent as


@router.post("/v1/sessions", status_code=201)
async def create_session(request: Request, state: State) -> JSONResponse:
    req = await parse_body(state, request, SessionCreate)
    ns = tenant(state, request)

    def make() -> dict[str, Any]:
        s = new_session(
            state,
            ns,
            req.system,
            continuity=req.continuity,
            session_id=req.session_id,
            compaction=req.compaction,
        )
        return {
            "id": s.id,
            "object": "session",
            "wake_tokens": len(s.transcript.wake or ()),
            "model": state.model_id,
        }

    if req.session_id is not None and not req.session_id.strip():
        raise InvalidRequest("session_id must not be empty")
    if req.session_id is not None and req.session_id.startswith(HINT_PREFIX):
        raise InvalidRequest(
            f"session ids starting with {HINT_PREFIX!r} are the server's own (sessions made "
            "from a client's X-Session-ID or prompt_cache_key): choose another"
        )
    return JSONResponse(await run(state, make), 201)


@router.post("/v1/sessions/{session_id}/messages", response_model=None)
async def session_messages(session_id: str, request: Request, state: State) -> Response:
    prefetch(state, request, session_id)  # its KV comes back while the body is read
    req = await parse_body(state, request, SessionMessages)
    params = req.params(state.config.request_defaults)
    ns = tenant(state, request)
    if req.stream:
        await check_owner(state, session_id, ns)

    def turn(on_text: OnText | None) -> Result:
        with state.sessions().claim():  # the lookup and the turn: one wait for the context
            session = own_session(state, session_id, ns)
            return session.append(req.messages, params, on_text=on_text)

    job = SessionJob(turn, session_id)
    return await respond(
        state, job, req, "chat.completion", lambda r: result_usage(r, session_id), request=request
    )


@router.post("/v1/sessions/{session_id}/input", response_model=None)
async def session_input(session_id: str, request: Request, state: State) -> Response:
    """Prefill on arrival: the request body is the new message's text, read as it arrives
    (send it chunked) and decoded while it streams in; the reply follows the end of the
    body (SSE with ?stream=true). Sampling parameters and role/name/tool_call_id go in the
    query string. A client that disconnects before the body ends commits nothing."""
    try:
        req = InputParams.model_validate(dict(request.query_params))
    except ValidationError as e:
        raise invalid(e) from None
    params = req.params(state.config.request_defaults)
    if req.stream and req.stream_options is None:
        req.stream_options = {"include_usage": True}  # the turn's metrics end the stream
    ns = tenant(state, request)
    session = await run(state, lambda: own_session(state, session_id, ns))
    if (gone := await _feed_body(state, request, session, req)) is not None:
        return gone

    def commit(on_text: OnText | None) -> Result:
        return session.commit(params, on_text=on_text)

    return await respond(
        state,
        SessionJob(commit, session_id),
        req,
        "chat.completion",
        lambda r: result_usage(r, session_id),
        request=request,
    )


async def _feed_body(
    state: ServerState, request: Request, session: ChatSession, req: InputParams
) -> Response | None:
    """Feed the body to ``session`` as it arrives; on any failure drop what arrived. Returns
    the ``499`` to answer when the client went away, else ``None``."""
    utf8 = codecs.getincrementaldecoder("utf-8")("strict")
    pending = Coalescer()

    def feed(text: str) -> int:
        return int(session.feed(text, role=req.role, name=req.name, tool_call_id=req.tool_call_id))

    async def drop() -> None:  # never refused by a full queue: the session must not keep it
        with contextlib.suppress(Exception):
            await run(state, session.abandon, bounded=False)

    try:
        async for raw in request.stream():
            if pending.add(utf8.decode(raw), len(raw)) > state.config.max_body_bytes:
                raise BodyTooLarge
            if (text := pending.take()) is not None:
                await run(state, lambda text=text: feed(text))  # type: ignore[misc]
        tail = pending.flush() + utf8.decode(b"", final=True)
    except UnicodeDecodeError:
        await drop()
        raise InvalidRequest("the body is not valid UTF-8 text") from None
    except ClientDisconnect:
        await drop()
        return Response(status_code=499)
    except BaseException:  # e.g. the queue was full: drop what arrived, then report it
        await drop()
        raise
    if tail or session.arriving is None:
        try:
            await run(state, lambda: feed(tail))
        except BaseException:
            await drop()
            raise
    return None


def _session_body(state: ServerState, s: ChatSession) -> dict[str, Any]:
    return {
        "id": s.id,
        "object": "session",
        "history": s.history,
        "turns": state.sessions().store.turns(s.id),
        "resets": state.sessions().store.resets(s.id),
    }


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request, state: State) -> dict[str, Any]:
    ns = tenant(state, request)
    return await run(state, lambda: _session_body(state, own_session(state, session_id, ns)))


@router.get("/v1/sessions/{session_id}/bundle", response_model=None)
async def export_bundle(
    session_id: str, request: Request, state: State, kv: bool = True
) -> Response:
    """The session as one bundle: its history and, with ``kv`` (the default), its KV snapshot
    (an open session is parked first). ``?kv=false`` leaves the KV out: a smaller bundle, and
    the importer rebuilds the session from its history."""
    ns = tenant(state, request)

    def export() -> bytes:
        worker = state.sessions()
        with worker.claim():
            if worker.store.session_tenant(session_id) != ns:
                raise SessionNotFound(session_id)
            return state.engine.export_session(session_id, kv=kv)

    return Response(await run(state, export), media_type=MEDIA_TYPE)


@router.post(IMPORT_PATH, status_code=201)
async def import_bundle(request: Request, state: State) -> JSONResponse:
    """Create the session a bundle holds, with its id, in the caller's namespace (which must be
    the bundle's); answers as ``GET /v1/sessions/{id}`` does, with what became of its KV."""
    data = await read_body(state, request)  # 413 past --max-body-bytes, as any body
    ns = tenant(state, request)

    def make() -> dict[str, Any]:
        bundle = decode_bundle(data)  # every check that needs no worker, before any lookup
        if bundle.record.id.startswith(HINT_PREFIX):
            raise InvalidRequest(
                f"session {bundle.record.id!r} was made from a client's session hint and "
                "cannot be imported: the client's next request, which resends the "
                "conversation, rebuilds it on this worker"
            )
        if state.draining:
            raise Draining()
        worker = state.sessions()
        with worker.claim():
            state.quota.admit(worker, ns)
            done = state.engine.import_session(bundle, tenant=ns)
            state.quota.use(ns, done.session)
            body = _session_body(state, done.session)
        return {**body, "kv": {"outcome": done.kv, "detail": done.detail}}

    return JSONResponse(await run(state, make), 201)


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request, state: State) -> dict[str, Any]:
    ns = tenant(state, request)

    def delete() -> dict[str, Any]:
        own_session(state, session_id, ns)
        state.sessions().delete_session(session_id)
        return {"id": session_id, "object": "session", "deleted": True}

    return await run(state, delete)


class Coalescer:
    """Text read from a body, handed to a job thread in pieces that grow with the message
    (at least ``MIN_CHARS``, and an eighth of what was fed before), or whatever arrived once
    ``QUIET_S`` passed since the last feed: each feed re-tokenises the message's tail, so a
    body sent a byte at a time costs a bounded number of feeds (at most one per ``QUIET_S``
    beyond the geometric ones), not one per byte, while a slow stream is still fed as it
    arrives."""

    MIN_CHARS = 32
    QUIET_S = 0.05

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.buffered = 0
        self.fed = 0
        self.received = 0  # bytes
        self.last = time.monotonic()

    def add(self, text: str, n_bytes: int) -> int:
        self.received += n_bytes
        if text:
            self.buffer.append(text)
            self.buffered += len(text)
        return self.received

    def take(self) -> str | None:
        due = self.buffered >= max(self.MIN_CHARS, self.fed // 8)
        if not due and not (self.buffered and time.monotonic() - self.last >= self.QUIET_S):
            return None
        return self.flush()

    def flush(self) -> str:
        text = "".join(self.buffer)
        self.buffer, self.buffered = [], 0
        self.fed += len(text)
        self.last = time.monotonic()
        return text
