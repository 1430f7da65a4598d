"""The HTTP edge's data: pydantic request models and the ``usage`` objects of replies.

Request models are strict (a ``"5"`` is not a ``max_tokens``) and ignore unknown fields, as
OpenAI clients send many; messages themselves are validated by :mod:`continuum.messages`.

``usage.prompt_tokens_details.cached_tokens`` carries the tokens reused, so unmodified OpenAI
clients see their savings; ``usage.continuum`` carries the request's metrics (``hit_tier`` and
every tier's outcome), in one vocabulary whatever served it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from continuum.errors import InvalidRequest
from continuum.params import GenerationParams
from continuum.results import Result
from continuum.server.responses import chat_response_format, chat_tool_choice
from continuum.server.responses_tools import ResponsesTools


@dataclass(frozen=True)
class RequestDefaults:
    """What the server puts where a request leaves a field out: the reply's length, and the
    sampling seed (None: a fresh one per request; set, sampled replies are reproducible)."""

    max_tokens: int
    seed: int | None = None


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
    # output-changing fields not implemented: refused unless at their no-op values
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    repeat_penalty: float | None = None
    min_p: float | None = None
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    def refuse_unimplemented(self) -> None:
        """A field that would change the output and is not implemented is a 400 naming it,
        never silently ignored (the reply, and its cache key, would not be what was asked)."""
        if self.n not in (None, 1):
            raise InvalidRequest("n > 1 is not supported: send one request per choice")
        noop: dict[str, tuple[Any, ...]] = {
            "logit_bias": (None, {}),
            "logprobs": (None, False, 0),
            "top_logprobs": (None, 0),
            "presence_penalty": (None, 0),
            "frequency_penalty": (None, 0),
            "repetition_penalty": (None, 1),
            "repeat_penalty": (None, 1),
            "min_p": (None, 0),
            "best_of": (None, 1),
            "echo": (None, False),
            "suffix": (None, ""),
        }
        for name, allowed in noop.items():
            value = getattr(self, name)
            if value not in allowed:
                raise InvalidRequest(
                    f"{name}={value!r} is not implemented (it would change the output): "
                    f"remove {name}, or send it at its no-op value {allowed[-1]!r}"
                )

    def params(self, defaults: RequestDefaults) -> GenerationParams:
        self.refuse_unimplemented()
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        p = GenerationParams(
            max_tokens=next(
                (n for n in (self.max_completion_tokens, self.max_tokens) if n is not None),
                defaults.max_tokens,
            ),  # an explicit 0 is refused, not read as "unset"
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=defaults.seed if self.seed is None else self.seed,
            stop=stop,
        )
        p.validate()
        return p


class ChatRequest(SamplingFields):
    model: str
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    prompt_cache_key: str | None = None  # a session hint (Codex)
    user: str | None = None  # a session hint
    # accepted, never forwarded: an upstream's cache salt is the tenant's (backends/routing.py)
    cache_salt: str | None = None
    extra_key: str | None = None


class ResponsesRequest(_Strict):
    """``POST /v1/responses``; mapped onto a chat request (:mod:`continuum.server.responses`)."""

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    text: dict[str, Any] | None = None
    truncation: str | None = None
    metadata: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt_cache_key: str | None = None  # a session hint (Codex)
    user: str | None = None  # a session hint

    def refuse_unimplemented(self) -> None:
        if self.background:
            raise InvalidRequest("background responses are not supported: send background: false")
        if self.conversation is not None:
            raise InvalidRequest(
                "conversation objects are not supported: chain responses with previous_response_id"
            )
        if self.truncation not in (None, "disabled", "auto"):
            raise InvalidRequest(
                f"truncation must be 'auto' (the oldest turns dropped to fit) or 'disabled' "
                f"(a request that does not fit is a context_length_exceeded error), got "
                f"{self.truncation!r}"
            )

    def chat(self, messages: list[Any], tools: ResponsesTools) -> ChatRequest:
        """The chat request this response runs as, offering ``tools`` (this request's, read)."""
        return ChatRequest.model_validate(
            {
                "model": self.model,
                "messages": messages,
                "tools": tools.chat,
                "tool_choice": chat_tool_choice(self.tool_choice),
                "parallel_tool_calls": self.parallel_tool_calls,
                "response_format": chat_response_format(self.text),
                "max_tokens": self.max_output_tokens,
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_logprobs": self.top_logprobs,
            }
        )


class CompactRequest(_Strict):
    """``POST /v1/responses/compact``: the conversation (``previous_response_id``'s chain, then
    ``input``) to summarise into a compaction item."""

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None  # accepted; the summary runs through the reuse stack


class CompletionRequest(SamplingFields):
    model: str
    prompt: str
    user: str | None = None  # a session hint
    # accepted, never forwarded: an upstream's cache salt is the tenant's (backends/routing.py)
    cache_salt: str | None = None
    extra_key: str | None = None


class EmbeddingsRequest(_Strict):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    user: str | None = None


class InputParams(SamplingFields):
    """Query parameters of ``POST /v1/sessions/{id}/input`` (the body is the message text)."""

    model_config = ConfigDict(strict=False, extra="forbid")  # our own API: no unknown fields
    role: str = "user"
    name: str | None = None
    tool_call_id: str | None = None


class SessionCreate(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")  # our own API: no unknown fields
    system: str | None = None
    continuity: str | None = None
    session_id: str | None = None
    compaction: Literal["window", "summary"] | None = None  # None: the server's --compaction


class SessionMessages(SamplingFields):
    model_config = ConfigDict(strict=True, extra="forbid")  # our own API: no unknown fields
    messages: list[Any]


def usage(
    prompt: int, completion: int, cached: int | None, extra: dict[str, Any]
) -> dict[str, Any]:
    """OpenAI's usage object. ``cached`` None: the tokens reused are unknown (an upstream that
    does not report them), so ``prompt_tokens_details`` is null, as vLLM sends it without
    ``--enable-prompt-tokens-details`` — never a 0 that reads as "nothing reused"."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
        "continuum": extra,
    }


def cached_of(u: dict[str, Any]) -> int | None:
    """The tokens reused in a :func:`usage` object, None when unknown."""
    details = u["prompt_tokens_details"]
    return None if details is None else int(details["cached_tokens"])


def result_usage(
    r: Result, session_id: str | None = None, woke: tuple[int, float] = (0, 0.0)
) -> dict[str, Any]:
    """The usage of any request, in one vocabulary (:class:`~continuum.metrics.Metrics`): a
    stateless one, or a turn of session ``session_id``. ``woke``: the tokens and milliseconds
    of the session's wake phase when this request created it, charged to this turn (they
    were decoded for it, not reused)."""
    m = r.metrics
    extra: dict[str, Any] = {}
    if session_id is not None:
        extra.update(session=session_id, turn=r.turn)
    extra.update(m.to_dict())
    wake, wake_ms = woke
    if wake:
        extra["prompt_tokens_evaluated"] += wake
        extra["tokens_reused"] -= wake
        extra["ttft_ms"] += wake_ms
        extra["total_ms"] += wake_ms
        extra["wake_tokens"], extra["wake_ms"] = wake, wake_ms
    cached = extra["tokens_reused"] if m.reuse_known else None
    return usage(m.prompt_tokens, m.completion_tokens, cached, extra)
