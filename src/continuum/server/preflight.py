"""What a request alone decides, checked before any work.

A request's messages, roles, tools and decode parameters, and whether its prompt can fit the
context at all, are known the moment it is parsed. Every route checks them here, in the handler,
before a job is submitted: a bad request is a 4xx with a JSON body — streamed or not — and
never a ``200`` stream that ends in an ``error`` event after a prefill (an agent client retries
those, paying the prefill each time), nor a session created for a request that is then refused.

The context check counts tokens only when the text might not fit (a token is at least one byte
of UTF-8): short requests cost no tokenization.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from continuum.errors import ContextOverflow, InvalidRequest
from continuum.messages import Message, normalize_messages
from continuum.params import GenerationParams
from continuum.server.state import ServerState

MAX_SYSTEM_MESSAGES = 16  # system/developer messages in one request


def chat_messages(
    state: ServerState,
    raw: object,
    tools: Sequence[dict[str, Any]] | None,
    params: GenerationParams,
    *,
    windowed: bool,
) -> list[Message]:
    """The request's messages, validated and as the model's template takes them (system
    messages folded where it cannot render them after others); ``ContextOverflow`` when they
    cannot fit. ``windowed``: a session turn, which drops the oldest turns to fit, so only its
    system prompt, tools and last message must fit with ``max_tokens``."""
    msgs = normalize_messages(raw)
    systems = sum(m["role"] == "system" for m in msgs)
    if systems > MAX_SYSTEM_MESSAGES:
        raise InvalidRequest(
            f"{systems} system/developer messages in one request; send at most "
            f"{MAX_SYSTEM_MESSAGES} (join instructions that belong together into one message)"
        )
    fmt = getattr(state.engine.backend, "chat_format", None)
    if fmt is not None:
        msgs = fmt.fit_systems(msgs)
        fmt.check_systems(msgs[1:] if msgs[0]["role"] == "system" else msgs)
    needed = msgs
    if windowed:  # the system prompt and the last message, at least, are always sent
        needed = [msgs[0], msgs[-1]] if len(msgs) > 1 and msgs[0]["role"] == "system" else msgs[-1:]
    fits(state, needed, tools, params.max_tokens, what="the request")
    return msgs


def fits(
    state: ServerState,
    messages: list[Message] | None,
    tools: Sequence[dict[str, Any]] | None,
    max_tokens: int,
    *,
    prompt: str | None = None,
    what: str = "the request",
) -> None:
    """``ContextOverflow`` unless the prompt (``messages`` with ``tools``, or ``prompt``) and
    ``max_tokens`` fit the context."""
    n_ctx = state.engine.n_ctx
    if n_ctx is None:  # a remote backend: its server decides
        return
    if max_tokens >= n_ctx:
        raise ContextOverflow(max_tokens + 1, n_ctx, f"max_tokens ({max_tokens}) alone")
    room = n_ctx - max_tokens
    text = prompt if prompt is not None else json.dumps([messages, tools])
    # a token is at least one byte; JSON may escape a character as six; a template adds a few
    # tokens a message: below this, the prompt fits without counting
    if len(text.encode()) + 8 * len(messages or ()) + 64 < room:
        return
    n = len(state.engine.backend.prompt_tokens(messages, prompt, tools=tools))
    if n + max_tokens >= n_ctx:
        raise ContextOverflow(n + max_tokens, n_ctx, what)


__all__ = ["MAX_SYSTEM_MESSAGES", "chat_messages", "fits"]
