"""The ``openai_http`` backend: any OpenAI-compatible server, and OpenAI / Azure OpenAI.

It always sends the full request — a stateless server needs it (DESIGN.md §4) — and never
"approximates" savings by sending a suffix the model then does not see. What it saves is what
the *server* reports: ``usage.prompt_tokens_details.cached_tokens`` becomes ``tokens_reused``;
when a server does not report it, the saving is ``unknown`` (``reused_known=False``), not zero.

For the fleet behind it (:mod:`continuum.backends.routing`, configured by
:class:`~continuum.backends.routing.UpstreamRouting`), every request carries its tenant's cache
salt (vLLM's ``cache_salt``, SGLang's ``extra_key``) and its conversation's affinity key (the
header a KV-aware router hashes on, or OpenAI's ``prompt_cache_key``), and a router's session
token (llm-d) goes back on that conversation's next request. The client's own cookie jar is off:
a cookie one conversation got must never ride on another's requests.

Keys need tokens. In order of preference: the server's own tokenizer (``/tokenize`` as vLLM and
llama-server serve it, or llama-cpp-python's ``/extras/tokenize``), else a local GGUF tokenizer
for the same model, else the canonical text's code points. The mode is part of
:attr:`model_identity`, so entries made under different modes never mix.

Retries: 429, 5xx and connection errors are retried with exponential backoff, honouring
``Retry-After``; a streaming request is retried only before its first byte arrives.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx

from continuum.backends.base import Capabilities, Generation, RequestRoute
from continuum.backends.routing import (
    SESSION_TOKEN_HEADER,
    SessionTokens,
    UpstreamRouting,
    routing_from,
)
from continuum.errors import BackendError, InvalidRequest
from continuum.hashing import canonical_json
from continuum.messages import Message
from continuum.params import GenerationParams

log = logging.getLogger(__name__)

RETRY_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}


@dataclass(frozen=True, slots=True)
class Upstream:
    """The OpenAI-compatible server a backend sends to, and how to reach it: its base URL
    (``…/v1``, or an Azure deployment's URL with ``azure_api_version``), the model to ask for,
    the key (a bearer token, or Azure's ``api-key``), the timeout in seconds (connecting: 10),
    and how many times a failed request is retried, ``backoff_s`` doubling between tries."""

    base_url: str
    model: str
    api_key: str | None = None
    azure_api_version: str | None = None
    timeout: float = 120.0
    max_retries: int = 4
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        url = self.base_url
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidRequest(f"base_url must be an http(s) URL, got {url!r}")

    def auth_headers(self) -> dict[str, str]:
        if not self.api_key:
            return {}
        if self.azure_api_version:
            return {"api-key": self.api_key}
        return {"Authorization": f"Bearer {self.api_key}"}


class OpenAIHTTPBackend:
    name = "openai_http"

    def __init__(
        self,
        upstream: Upstream,
        *,
        routing: UpstreamRouting | dict[str, Any] | None = None,
        tokenizer: str = "auto",
        local_model: Any = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``upstream``: the server and how to reach it. ``tokenizer``: how keys get tokens —
        ``auto``, ``server``, ``local`` (needs ``local_model``, a GGUF path or alias) or
        ``text``. ``transport``: httpx's, for tests that record the wire."""
        if tokenizer not in ("auto", "server", "local", "text"):
            raise InvalidRequest("tokenizer must be 'auto', 'server', 'local' or 'text'")
        self.upstream = upstream
        self.base_url = upstream.base_url.rstrip("/")
        self.model = upstream.model
        self.routing = routing_from(routing)
        self.session_tokens = SessionTokens(self.routing.max_sessions)
        self._http = httpx.Client(
            timeout=httpx.Timeout(upstream.timeout, connect=10.0),
            headers=upstream.auth_headers(),
            transport=transport,
        )
        # no shared cookie jar: a router's cookie belongs to one conversation (SessionTokens)
        self._http.cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
        self._local: Any = None
        self.tokenizer_mode = self._choose_tokenizer(tokenizer, local_model)
        self.model_identity = f"{self.base_url}|{self.model}|tok={self.tokenizer_mode}"
        self.capabilities = Capabilities(
            server_prefix_cache=True, tokenizer=self.tokenizer_mode != "text", routed=True
        )
        self.requests = 0  # HTTP requests sent, retries included

    @classmethod
    def from_options(cls, **options: Any) -> OpenAIHTTPBackend:
        """The backend from the registry's flat keyword options
        (``Engine.open(backend="openai_http", base_url=..., model=...)``): :class:`Upstream`'s
        fields make its ``upstream``."""
        names = [f.name for f in fields(Upstream)]
        flat = {name: options.pop(name) for name in names if name in options}
        return cls(Upstream(**flat), **options) if flat else cls(**options)

    def close(self) -> None:
        self._http.close()
        if self._local is not None:
            self._local.close()

    # -- URLs ----------------------------------------------------------------------------------
    def _url(self, endpoint: str) -> str:
        url = f"{self.base_url}/{endpoint}"
        if self.upstream.azure_api_version:
            url += f"?api-version={self.upstream.azure_api_version}"
        return url

    def _root(self) -> str:
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    # -- tokenization for keys -------------------------------------------------------------------
    def _choose_tokenizer(self, mode: str, local_model: Any) -> str:
        if mode in ("auto", "server") and self._server_tokenize("probe") is not None:
            return "server"
        if mode == "server":
            raise BackendError(f"{self.base_url} has no tokenize endpoint")
        if mode in ("auto", "local") and local_model is not None:
            from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
            from continuum.backends.models import ModelFile, resolve_model

            mf = local_model if isinstance(local_model, ModelFile) else resolve_model(local_model)
            self._local = LlamaCppBackend(mf, LlamaConfig(n_ctx=256))
            return f"local:{mf.digest}"
        if mode == "local":
            raise InvalidRequest("tokenizer='local' needs local_model= (a GGUF path or alias)")
        return "text"

    def _server_tokenize(self, text: str) -> list[int] | None:
        attempts = [
            (f"{self._root()}/tokenize", {"model": self.model, "prompt": text, "content": text}),
            (f"{self._root()}/extras/tokenize", {"model": self.model, "input": text}),
        ]
        for url, body in attempts:
            try:
                r = self._http.post(url, json=body)
            except httpx.HTTPError:
                return None
            if r.status_code == 200:
                tokens = r.json().get("tokens")
                if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
                    self._tokenize_url, self._tokenize_field = url, body
                    return tokens
        return None

    def prompt_tokens(
        self,
        messages: Sequence[Message] | None,
        prompt: str | None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        text = prompt if prompt is not None else canonical_json(list(messages or ())).decode()
        if self.tokenizer_mode == "server":
            tokens = self._server_tokenize(text)
            if tokens is None:
                raise BackendError(f"{self.base_url}: tokenize failed")
            return tokens
        if self._local is not None:
            return list(self._local.tokenize(text, special=False))
        return [ord(c) for c in text]

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        reuse: int = 0,
        on_text: Callable[[str], None] | None = None,
        messages: Sequence[Message] | None = None,
        prompt: str | None = None,
        route: RequestRoute | None = None,
    ) -> Generation:
        """Stream the whole request to the server. ``route`` (the engine's: the op's tenant and
        conversation) sets the salt and affinity key; without one, the empty namespace's salt
        and no affinity key."""
        t0 = time.perf_counter()
        chat = messages is not None
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = list(messages or ())
        else:
            body["prompt"] = prompt if prompt is not None else ""
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if params.top_k:
            body["top_k"] = params.top_k
        headers: dict[str, str] = {}
        key = self.routing.stamp(body, headers, route or RequestRoute(), self.session_tokens)
        text, finish, usage, ttft = "", "stop", None, None
        url = self._url("chat/completions" if chat else "completions")
        for event in self._stream(url, body, headers, key):
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    text += piece
                    if on_text is not None:
                        on_text(piece)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        prompt_tokens = int((usage or {}).get("prompt_tokens") or len(tokens))
        cached = reported_cached_tokens(usage, prompt_tokens)
        reused = cached or 0  # unknown is reported as reused_known=False, never as a saving
        completion = int((usage or {}).get("completion_tokens") or 0)
        return Generation(
            text=text,
            tokens=tuple(range(completion)),  # the server's token ids are not returned
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            evaluated=prompt_tokens - reused,
            reused=reused,
            ttft_ms=ttft if ttft is not None else (time.perf_counter() - t0) * 1000,
            total_ms=(time.perf_counter() - t0) * 1000,
            reused_known=cached is not None,
        )

    def _stream(
        self, url: str, body: dict[str, Any], headers: dict[str, str], key: str | None
    ) -> Iterator[Any]:
        """The server's SSE events; a router's session token in the answer is kept for
        ``key``'s next request."""
        attempt = 0
        yielded = False
        while True:
            self.requests += 1
            try:
                with self._http.stream("POST", url, json=body, headers=headers) as r:
                    if r.status_code in RETRY_STATUSES and attempt < self.upstream.max_retries:
                        r.read()
                        self._sleep(attempt, r.headers.get("retry-after"))
                        attempt += 1
                        continue
                    if r.status_code >= 400:
                        r.read()
                        raise BackendError(f"{url} answered {r.status_code}: {r.text[:300]}")
                    if key is not None:
                        self.session_tokens.record(
                            key,
                            r.headers.get(SESSION_TOKEN_HEADER),
                            r.headers.get_list("set-cookie"),
                        )
                    for line in r.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        event = json.loads(data)
                        if isinstance(event, dict) and "error" in event:
                            raise BackendError(f"{url} streamed an error: {event['error']}")
                        yielded = True
                        yield event
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as e:
                if (
                    yielded or attempt >= self.upstream.max_retries
                ):  # never replay a half-read stream
                    raise BackendError(f"{url}: {e} (after {attempt + 1} attempts)") from None
                self._sleep(attempt, None)
                attempt += 1

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.upstream.backoff_s * (2**attempt)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(retry_after))
        time.sleep(min(delay, 60.0))


def reported_cached_tokens(usage: Any, prompt_tokens: int) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` when the server reported a count it could
    have meant, else None (unknown). Never a guess: a missing field, a null, a string, a bool,
    a negative count or one above the prompt's tokens is unknown, not 0 and not clamped."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, bool) or not isinstance(cached, int):
        return None
    if not 0 <= cached <= prompt_tokens:
        log.warning("ignoring cached_tokens=%d for a %d-token prompt", cached, prompt_tokens)
        return None
    return cached
