"""The one reply path of every generating route: a JSON completion, or Server-Sent Events.

A route hands :func:`respond` a *job* — a callable run on a job thread that takes an
``on_text`` callback (``None`` when not streaming) and returns the reply — and how to build the
reply's ``usage``. The queue-full ``429`` is raised before any header is sent, streaming or not.

Streaming follows OpenAI's chunk shapes: for chat, a first chunk with the assistant role, one
chunk per piece of text, a chunk with the ``finish_reason``, a usage chunk (empty ``choices``)
when ``stream_options.include_usage`` is set, then ``data: [DONE]``. An error after the headers
went out is sent as one ``data:`` event with the OpenAI error body, then ``[DONE]``.

Disconnects: if a streaming client goes away before the reply is complete, nothing of that turn
is committed — neither its new messages nor the partial reply: the next ``on_text`` raises
:class:`~continuum.server.errors.ClientGone` on its job thread. The session's resident KV is
verified on its next turn as always. A reply that finished before the disconnect was noticed is
committed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from continuum.results import Result
from continuum.server.errors import ClientGone, error_response
from continuum.server.schemas import SamplingFields
from continuum.server.state import ServerState
from continuum.toolcalls import ToolCall, ToolParsing, unsent

R = TypeVar("R", bound=Result)
R_in = TypeVar("R_in", contravariant=True)
OnText = Callable[[str], None]
Job = Callable[[OnText | None], R]
"""Runs on a job thread; streams text through ``on_text`` when one is given."""
UsageOf = Callable[[R], dict[str, Any]]

CHAT = "chat.completion"


def split_reply(tools: ToolParsing | None, result: Result) -> Split:
    """(content, calls, finish_reason) of a reply; without ``tools`` its text as it is. A
    session turn parsed its calls itself and keeps them in its history: their ids are the ones
    a client must send back."""
    if tools is None:
        return result.text, [], result.finish_reason
    content, calls, finish = tools.split(result.text, result.finish_reason)
    if result.calls is not None:
        calls = list(result.calls)
    return content, calls, finish


def event(body: dict[str, Any] | str) -> str:
    """One SSE ``data:`` event; a dict is sent as JSON, a string as it is."""
    data = body if isinstance(body, str) else json.dumps(body)
    return f"data: {data}\n\n"


DONE = event("[DONE]")


@dataclass(frozen=True, slots=True)
class Chunks:
    """The chunks of one streamed reply (they share its id, kind, creation time and model)."""

    rid: str
    kind: str  # "chat.completion.chunk" | "text_completion"
    created: int
    model: str

    @property
    def chat(self) -> bool:
        return self.kind == "chat.completion.chunk"

    def _body(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": self.kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def choice(self, delta: dict[str, Any] | str | None, finish: str | None) -> str:
        c: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.chat:
            c["delta"] = delta if isinstance(delta, dict) else {}
        else:
            c["text"] = delta if isinstance(delta, str) else ""
        return event(self._body([c]))

    def text(self, piece: str) -> str:
        return self.choice({"content": piece} if self.chat else piece, None)

    def finish(self, reason: str) -> str:
        return self.choice({} if self.chat else "", reason)

    def usage(self, usage: dict[str, Any]) -> str:
        return event({**self._body([]), "usage": usage})

    def tool_calls(self, calls: list[ToolCall]) -> list[str]:
        """Each call as the openai SDK's accumulators expect it: id, type and name first (with
        empty arguments), then the arguments."""
        out = []
        for i, c in enumerate(calls):
            first = {"index": i, "id": c.id, "type": "function"}
            first["function"] = {"name": c.name, "arguments": ""}
            rest = {"index": i, "function": {"arguments": c.arguments}}
            out.append(self.choice({"tool_calls": [first]}, None))
            out.append(self.choice({"tool_calls": [rest]}, None))
        return out


async def respond(
    state: ServerState,
    job: Job[R],
    req: SamplingFields,
    kind: str,
    usage_of: UsageOf[R],
    tools: ToolParsing | None = None,
    request: Request | None = None,
) -> Response:
    """Run ``job`` and answer as OpenAI does for ``kind`` (``chat.completion`` or
    ``text_completion``): one JSON object, or SSE when ``req.stream``. With ``tools`` the reply
    is checked for tool calls; streamed, only its text that no call can start in goes out as
    it comes, the rest once the reply is complete (a call cannot be told from text before)."""
    rid = ("chatcmpl-" if kind == CHAT else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model = state.model_id
    if not req.stream:
        result = await run_watched(state, job, request)
        state.metrics.observe(result)
        text, finish = result.text, result.finish_reason
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if kind == CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tools is not None:
                content, calls, choice["finish_reason"] = split_reply(tools, result)
                message["content"] = content
                if calls:
                    message["tool_calls"] = [c.to_openai() for c in calls]
            choice["message"] = message
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
    chunk_kind = "chat.completion.chunk" if kind == CHAT else "text_completion"
    chunks = Chunks(rid, chunk_kind, created, state.model_id)
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    return stream(state, job, chunks, usage_of if include_usage else None, tools)


class Encoder(Protocol[R_in]):
    """How one streamed reply is written: its opening events, one per piece of text, the
    closing events once the result is in (``split``: the content still to send — None when
    it was streamed as it came —, the tool calls found, the finish reason), or an error."""

    def opening(self) -> list[str]: ...
    def piece(self, text: str) -> list[str]: ...
    def closing(self, result: R_in, split: Split) -> list[str]: ...
    def failure(self, error: Exception) -> list[str]: ...


Split = tuple[str | None, list[ToolCall], str]  # content, calls, finish_reason


@dataclass(frozen=True, slots=True)
class ChatEncoder:
    """Chat and text completion chunks (see the module docstring)."""

    chunks: Chunks
    usage_of: UsageOf[Any] | None  # None: the client did not ask for the usage chunk

    def opening(self) -> list[str]:
        if not self.chunks.chat:  # text completions open with their first piece
            return []
        return [self.chunks.choice({"role": "assistant", "content": ""}, None)]

    def piece(self, text: str) -> list[str]:
        return [self.chunks.text(text)]

    def closing(self, result: Any, split: Split) -> list[str]:
        content, calls, finish = split
        out = [self.chunks.text(content)] if content else []
        out += self.chunks.tool_calls(calls)
        out.append(self.chunks.finish(finish))
        if self.usage_of is not None:
            out.append(self.chunks.usage(self.usage_of(result)))
        return [*out, DONE]

    def failure(self, error: Exception) -> list[str]:
        return [event(bytes(error_response(error).body).decode()), DONE]


def stream(
    state: ServerState,
    job: Job[R],
    chunks: Chunks,
    usage_of: UsageOf[R] | None,
    tools: ToolParsing | None = None,
) -> StreamingResponse:
    """Submit ``job`` now (so a full queue is a ``429`` before any header) and stream its text;
    ``usage_of`` is ``None`` when the client did not ask for the usage chunk."""
    return stream_with(state, job, ChatEncoder(chunks, usage_of), tools)


async def run_watched(state: ServerState, job: Job[R], request: Request | None) -> R:
    """Run a non-streamed ``job`` on a job thread, watching its client: once the client
    has disconnected, the job's next piece of text raises :class:`ClientGone`, so decoding
    stops (and a session turn commits nothing) instead of running to ``max_tokens``."""
    program = getattr(job, "program", None)  # the session it runs on: the queue's order
    if request is None:
        fut = state.executor.submit(lambda: job(None), program=program)
        return await asyncio.wrap_future(fut)
    gone = threading.Event()

    def on_text(piece: str) -> None:
        if gone.is_set():
            raise ClientGone

    submitted = state.executor.submit(lambda: job(on_text), program=program)
    future: asyncio.Future[R] = asyncio.wrap_future(submitted)
    # a blocking receive: Request.is_disconnected() never sees the disconnect behind a
    # BaseHTTPMiddleware (starlette discussion 2094; vLLM listens the same way)
    listener = asyncio.ensure_future(_disconnect(request))
    try:
        waits: set[asyncio.Future[Any]] = {future, listener}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not future.done():
            gone.set()
        return await future
    finally:
        listener.cancel()


async def _disconnect(request: Request) -> None:
    """Return when the client has gone (the body was read already, so nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def stream_with(
    state: ServerState, job: Job[R], encoder: Encoder[R], tools: ToolParsing | None = None
) -> StreamingResponse:
    """Stream ``job``'s reply through ``encoder`` as Server-Sent Events (see
    :func:`stream_events`)."""
    return StreamingResponse(
        stream_events(state, job, encoder, tools), media_type="text/event-stream"
    )


class _Held:
    """A streamed reply's text as it may go out: all of it as it comes without tools; with
    tools, only what no call can start in (:meth:`ToolParsing.streamable`), the rest once the
    reply is complete and its calls are told from its text."""

    def __init__(self, tools: ToolParsing | None) -> None:
        self.tools = tools
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str | None:
        """The text to send now, if any."""
        if self.tools is None:
            return piece
        self.text += piece
        n = self.tools.streamable(self.text)
        if n <= self.sent:
            return None
        out, self.sent = self.text.lstrip()[self.sent : n], n
        return out

    def rest(self, result: Result) -> Split:
        """The closing split: the content not yet sent (None when all of it went), the calls,
        the finish reason."""
        if self.tools is None:
            return None, [], result.finish_reason
        content, calls, finish = split_reply(self.tools, result)
        return unsent(content, self.text.lstrip()[: self.sent]), calls, finish


def stream_events(
    state: ServerState, job: Job[R], encoder: Encoder[R], tools: ToolParsing | None = None
) -> AsyncGenerator[str, None]:
    """Submit ``job`` now (so a full queue is a ``429`` before anything is sent) and return the
    events ``encoder`` writes of its reply. With ``tools``, text goes out as long as no call
    can start in it, the rest once the reply is complete (:class:`_Held`). Closing the
    iterator early (the client went) stops the job at its next token."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str | None] = asyncio.Queue()
    gone = threading.Event()
    held = _Held(tools)

    def on_text(piece: str) -> None:
        if gone.is_set():
            raise ClientGone
        if (out := held.feed(piece)) is not None:
            loop.call_soon_threadsafe(pieces.put_nowait, out)

    def run_job() -> R:
        try:
            return job(on_text)
        finally:
            loop.call_soon_threadsafe(pieces.put_nowait, None)

    program = getattr(job, "program", None)  # the session it runs on: the queue's order
    future = asyncio.wrap_future(state.executor.submit(run_job, program=program))  # 429 first
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, always

    async def events() -> AsyncGenerator[str, None]:
        try:
            for e in encoder.opening():
                yield e
            while (piece := await pieces.get()) is not None:
                for e in encoder.piece(piece):
                    yield e
            try:
                result: R = await future
            except Exception as err:  # a bug too ends the stream with an error event
                for e in encoder.failure(err):
                    yield e
                return
            state.metrics.observe(result)
            for e in encoder.closing(result, held.rest(result)):
                yield e
        finally:
            gone.set()  # a disconnect lands here: the job stops at the next token

    return events()
