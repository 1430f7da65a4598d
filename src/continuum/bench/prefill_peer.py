"""The peers of ``continuum bench prefill``: llama-server, as a careful user would drive it.

``llama-server``          the whole message is sent when it has arrived (``cache_prompt``: the
                          conversation before it is reused from the slot).
``llama-server-prewarm``  prefill on arrival done from the client: while the message arrives,
                          the transcript so far is sent with ``n_predict: 0`` and
                          ``cache_prompt: true`` whenever the previous such request has
                          finished (one in flight at a time, so the slot is never queued up),
                          and the whole request once the message has arrived. A request cannot
                          be interrupted, so the final one may wait for the last pre-warm.

The server (one slot, ``-fa off --swa-full``, the same model file and threads) is started for
each run and stopped after it, so it never runs beside continuum's worker. TTFT runs from the
end of input to the first streamed byte; "decoded after input" is the final request's
``timings.prompt_n``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from continuum.backends.chat_format import ChatFormat
from continuum.backends.models import ModelFile
from continuum.bench.http import _free_port, _process
from continuum.bench.http_client import sse

PEERS = ("llama-server", "llama-server-prewarm")


@dataclass(frozen=True, slots=True)
class PeerPlan:
    """What every llama-server run of one ``bench prefill`` shares: the server, as continuum's
    worker is set up (model file, threads, context), and the message's pacing."""

    server: str
    model_file: ModelFile
    threads: int
    n_ctx: int
    max_tokens: int
    idle_s: float  # the gap before the message, as every mode's
    rate: float  # tokens per second the message arrives at


def peer_run(
    mode: str,
    plan: PeerPlan,
    fmt: ChatFormat,
    script: tuple[str, str, str],
    pieces: Sequence[str],
) -> dict[str, Any]:
    """One run: (system, first message, the message) sent to a fresh llama-server."""
    system, first, text = script
    max_tokens, rate, threads, n_ctx = plan.max_tokens, plan.rate, plan.threads, plan.n_ctx
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        plan.server,
        "-m",
        str(plan.model_file.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(n_ctx),
        "-np",
        "1",
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-fa",
        "off",
        "--swa-full",
    ]
    bos = fmt.bos_token

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        out = fmt.render(messages, add_generation_prompt=gen)
        return out[len(bos) :] if bos and out.startswith(bos) else out

    def body(prompt: str, n: int, stream: bool) -> dict[str, Any]:
        """A generating request (OpenAI completions, streamed) or, with ``n`` 0, a pre-warm
        (the native endpoint: ``n_predict: 0`` evaluates the prompt into the slot)."""
        out = {"prompt": prompt, "temperature": 0, "cache_prompt": True, "id_slot": 0}
        return {**out, "n_predict": 0} if n == 0 else {**out, "max_tokens": n, "stream": stream}

    with _process(args, f"{url}/health"), httpx.Client(timeout=600) as client:
        history = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        first_body = body(render(history, True), max_tokens, True)
        _, reply, _ = sse(client, f"{url}/v1/completions", first_body)
        history.append({"role": "assistant", "content": reply})
        time.sleep(plan.idle_s)  # the same gap as every mode
        warm = _Prewarm(client, url, body, render, history) if mode.endswith("prewarm") else None
        arrived = ""
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            arrived += piece
            if warm is not None:
                warm.arrived(arrived)
        if warm is not None:
            warm.stop()
        final = render([*history, {"role": "user", "content": text}], True)
        ttft, out, last = sse(client, f"{url}/v1/completions", body(final, max_tokens, True))
        if warm is not None:
            warm.join()
    return {
        "ttft_ms": ttft,
        "evaluated_after_input": (last.get("timings") or {}).get("prompt_n"),
        "prewarm_requests": warm.sent if warm is not None else 0,
        "text": out,
    }


class _Prewarm:
    """Sends the transcript so far (``n_predict: 0``) whenever the previous one is done."""

    def __init__(
        self,
        client: httpx.Client,
        url: str,
        body: Callable[[str, int, bool], dict[str, Any]],
        render: Callable[[list[dict[str, str]], bool], str],
        history: list[dict[str, str]],
    ) -> None:
        self.client, self.url, self.body, self.render = client, url, body, render
        self.history = history
        self.latest = ""
        self.sent = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def arrived(self, text: str) -> None:
        self.latest = text

    def stop(self) -> None:
        self._done.set()

    def join(self) -> None:
        self._thread.join(timeout=600)

    def _prefix(self, partial: str) -> str:
        """The rendered transcript up to the end of ``partial``: a prefix of the final prompt."""
        full = self.render([*self.history, {"role": "user", "content": partial}], False)
        return full[: full.rindex(partial) + len(partial)]

    def _loop(self) -> None:
        warmed = ""
        while not self._done.is_set():
            partial = self.latest
            if not partial or partial == warmed:
                time.sleep(0.005)
                continue
            prompt = self._prefix(partial)
            self.client.post(f"{self.url}/completion", json=self.body(prompt, 0, False))
            self.sent += 1
            warmed = partial
