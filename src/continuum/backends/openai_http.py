"""The ``openai_http`` backend: any OpenAI-compatible server, and OpenAI / Azure OpenAI.

It always sends the full request — a stateless server needs it (DESIGN.md §4) — and never
"approximates" savings by sending a suffix the model then does not see. What it saves is what
the *server* reports: ``usage.prompt_tokens_details.cached_tokens`` becomes ``tokens_saved``;
when a server does not report it, the saving is ``unknown`` (``reused_known=False``), not zero.

Where the server supports them it passes an affinity key (a header a KV-aware router such as
vLLM's production stack or llm-d can route on) and a cache salt (vLLM's ``cache_salt``, which
partitions its prefix cache per tenant).

Keys need tokens. In order of preference: the server's own tokenizer (``/tokenize`` as vLLM and
llama-server serve it, or llama-cpp-python's ``/extras/tokenize``), else a local GGUF tokenizer
for the same model, else the canonical text's code points. The mode is part of
:attr:`model_identity`, so entries made under different modes never mix.

Retries: 429, 5xx and connection errors are retried with exponential backoff, honouring
``Retry-After``; a streaming request is retried only before its first byte arrives.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx

from continuum.backends.base import Capabilities, Generation
from continuum.errors import BackendError, InvalidRequest
from continuum.hashing import canonical_json
from continuum.messages import Message
from continuum.params import GenerationParams

log = logging.getLogger(__name__)

RETRY_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIHTTPBackend:
    name = "openai_http"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        azure_api_version: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        affinity_key: str | None = None,
        affinity_header: str = "X-Session-ID",
        cache_salt: str | None = None,
        tokenizer: str = "auto",
        local_model: Any = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise InvalidRequest(f"base_url must be an http(s) URL, got {base_url!r}")
        if tokenizer not in ("auto", "server", "local", "text"):
            raise InvalidRequest("tokenizer must be 'auto', 'server', 'local' or 'text'")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.azure_api_version = azure_api_version
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.affinity_key = affinity_key
        self.affinity_header = affinity_header
        self.cache_salt = cache_salt
        headers = {}
        if api_key:
            headers = (
                {"api-key": api_key}
                if azure_api_version
                else {"Authorization": f"Bearer {api_key}"}
            )
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=10.0), headers=headers, transport=transport
        )
        self._local: Any = None
        self.tokenizer_mode = self._choose_tokenizer(tokenizer, local_model)
        self.model_identity = f"{self.base_url}|{model}|tok={self.tokenizer_mode}"
        self.capabilities = Capabilities(
            server_prefix_cache=True, tokenizer=self.tokenizer_mode != "text"
        )
        self.requests = 0  # HTTP requests sent, retries included
        self.seen: list[dict[str, Any]] = []  # request bodies sent (the last 256)

    def close(self) -> None:
        self._http.close()
        if self._local is not None:
            self._local.close()

    # -- URLs ----------------------------------------------------------------------------------
    def _url(self, endpoint: str) -> str:
        url = f"{self.base_url}/{endpoint}"
        if self.azure_api_version:
            url += f"?api-version={self.azure_api_version}"
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
    ) -> Generation:
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
        if self.cache_salt:
            body["cache_salt"] = self.cache_salt
        headers = {self.affinity_header: self.affinity_key} if self.affinity_key else {}
        self.seen = [*self.seen[-255:], body]
        text, finish, usage, ttft = "", "stop", None, None
        for event in self._stream(
            self._url("chat/completions" if chat else "completions"), body, headers
        ):
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
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        known = isinstance(cached, int)
        reused = cached if isinstance(cached, int) else 0
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
            reused_known=known,
        )

    def _stream(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Iterator[Any]:
        attempt = 0
        yielded = False
        while True:
            self.requests += 1
            try:
                with self._http.stream("POST", url, json=body, headers=headers) as r:
                    if r.status_code in RETRY_STATUSES and attempt < self.max_retries:
                        r.read()
                        self._sleep(attempt, r.headers.get("retry-after"))
                        attempt += 1
                        continue
                    if r.status_code >= 400:
                        r.read()
                        raise BackendError(f"{url} answered {r.status_code}: {r.text[:300]}")
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
                if yielded or attempt >= self.max_retries:  # never replay a half-read stream
                    raise BackendError(f"{url}: {e} (after {attempt + 1} attempts)") from None
                self._sleep(attempt, None)
                attempt += 1

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff_s * (2**attempt)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(retry_after))
        time.sleep(min(delay, 60.0))
