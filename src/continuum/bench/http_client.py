"""The client side of ``continuum bench http``: one conversation over HTTP, timed at the
client — streamed replies read as they arrive, a message sent as a chunked body at a typing
rate, and each server's own report of what it evaluated."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from continuum.bench.conversation import TURNS


@dataclass(frozen=True, slots=True)
class Conversation:
    """What a run sends, whatever the server: the system prompt, the first ``turns`` of seed
    000's user turns, the reply length, and the pacing."""

    system: str
    turns: int
    max_tokens: int
    idle: float = 0.0  # seconds between a reply and the next message
    rate_tps: float = 200.0  # input mode: tokens per second the message arrives at
    end_delay: float = 0.0  # input mode: seconds between the last piece and the end of input


def sse(
    client: httpx.Client, url: str, body: dict[str, Any], stamps: list[float] | None = None
) -> tuple[float, str, dict[str, Any]]:
    """POST a streaming request; return (TTFT ms, text, the last event with usage/timings);
    ``stamps`` receives the arrival time of every content piece. A keep-alive connection the
    server already closed (llama-server closes one after a few requests) is retried once on a
    fresh connection, and timed from the retry."""
    try:
        return sse_once(client, url, body, stamps)
    except httpx.RemoteProtocolError:
        if stamps is not None:
            stamps.clear()
        return sse_once(client, url, body, stamps)


def sse_once(
    client: httpx.Client, url: str, body: dict[str, Any], stamps: list[float] | None = None
) -> tuple[float, str, dict[str, Any]]:
    raw = json.dumps(body)
    t0 = time.perf_counter()
    with client.stream("POST", url, content=raw, headers={"content-type": "application/json"}) as r:
        return _readsse(r, lambda: t0, stamps)


def _readsse(
    r: httpx.Response, start: Callable[[], float], stamps: list[float] | None = None
) -> tuple[float, str, dict[str, Any]]:
    """Read a streamed completion: (ms from ``start()`` to the first content byte, the text,
    the last event carrying usage or timings, with the choice's ``finish_reason`` added)."""
    r.raise_for_status()
    ttft = None
    text = ""
    last: dict[str, Any] = {}
    finish = None
    for line in r.iter_lines():
        if not line.startswith("data:") or line.endswith("[DONE]"):
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece and stamps is not None:
                stamps.append(time.perf_counter())
            if piece and ttft is None:
                ttft = (time.perf_counter() - start()) * 1000
            text += piece
            finish = choice.get("finish_reason") or finish
        if event.get("usage") or event.get("timings"):
            last = event
    last = {**last, "finish_reason": finish}
    return (ttft if ttft is not None else float("nan")), text, last


def input_stream(
    client: httpx.Client,
    url: str,
    text: str,
    query: dict[str, Any],
    rate_tps: float,
    end_delay: float = 0.0,
) -> tuple[float, str, dict[str, Any]]:
    """Send ``text`` as a chunked body at ``rate_tps`` tokens/s (4 characters a token), end the
    body ``end_delay`` seconds after the last piece (the Enter key after the last keystroke, a
    voice detector's silence); return (TTFT from the end of the body, reply, usage event)."""
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    ended = [0.0]

    def body() -> Iterator[bytes]:
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            wait = t0 + i / rate_tps - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            yield piece.encode()
        if end_delay:
            time.sleep(end_delay)
        ended[0] = time.perf_counter()

    with client.stream("POST", url, params=query, content=body()) as r:
        return _readsse(r, lambda: ended[0])  # timed from the end of the body


def continuum_run(client: httpx.Client, url: str, mode: str, talk: Conversation) -> dict[str, Any]:
    out: dict[str, list[Any]] = {"ttft_ms": [], "wire_bytes": [], "evaluated": []}
    # every run is its own tenant: a repeated greedy conversation would otherwise be served
    # from the memo (session turns walk the result tiers), and this measures the KV path
    tenant = {"X-Continuum-Tenant": f"bench-{uuid.uuid4().hex[:12]}"}
    with httpx.Client(timeout=client.timeout, headers=tenant) as own:
        return continuum_turns(own, url, mode, talk, tenant, out)


def continuum_turns(
    client: httpx.Client,
    url: str,
    mode: str,
    talk: Conversation,
    tenant: dict[str, str],
    out: dict[str, list[Any]],
) -> dict[str, Any]:
    system, max_tokens = talk.system, talk.max_tokens
    created_body = {"system": system}
    created = client.post(f"{url}/v1/sessions", json=created_body).json()
    sid = created["id"]
    # the session's creation crossed the wire and prefilled the system prompt: count both
    out["wire_bytes"].append(len(json.dumps(created_body)))
    out["evaluated"].append(created["wake_tokens"])
    out["decoded_early"] = [0]
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn in TURNS[: talk.turns]:
        msg = {"role": "user", "content": turn.content}
        common = {
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if talk.idle and turn is not TURNS[0]:
            time.sleep(talk.idle)  # a person reading the reply: idle work may run now
        if mode == "input":
            query = {"max_tokens": max_tokens, "temperature": 0, "stream": "true"}
            ttft, text, last = input_stream(
                client,
                f"{url}/v1/sessions/{sid}/input",
                turn.content,
                query,
                talk.rate_tps,
                talk.end_delay,
            )
            history += [msg, {"role": "assistant", "content": text}]
            out["ttft_ms"].append(ttft)
            out["wire_bytes"].append(len(turn.content.encode()))
            count_turn(out, last)
            continue
        if mode == "delta":
            body = {"messages": [msg], **common}
            target = f"{url}/v1/sessions/{sid}/messages"
        else:
            body = {"model": "continuum", "messages": [*history, msg], **common}
            target = f"{url}/v1/chat/completions"
        hdr_client = (
            client
            if mode == "delta"
            else httpx.Client(timeout=300, headers={**tenant, "X-Continuum-Session": sid})
        )
        ttft, text, last = sse(hdr_client, target, body)
        if hdr_client is not client:
            hdr_client.close()
        history += [msg, {"role": "assistant", "content": text}]
        out["ttft_ms"].append(ttft)
        out["wire_bytes"].append(len(json.dumps(body)))
        count_turn(out, last)
    return out


def count_turn(out: dict[str, list[Any]], last: dict[str, Any]) -> None:
    """Record a turn's evaluated prompt tokens from continuum's usage: those decoded after the
    end of input, and those decoded ahead of it (eager glue, kept or discarded, and a message
    fed as it arrived)."""
    u = last.get("usage", {}).get("continuum", {})
    out["evaluated"].append(u.get("prompt_tokens_evaluated"))
    early = ("fed_tokens", "eager_tokens_used", "eager_tokens_discarded")
    out.setdefault("decoded_early", []).append(sum(u.get(k) or 0 for k in early))


def text_run(
    client: httpx.Client, url: str, fmt: Any, bos: str, talk: Conversation
) -> dict[str, Any]:
    """The conversation as rendered text, the whole transcript each turn (a peer server's
    ``/v1/completions``), its prompt cache on."""
    out: dict[str, list[Any]] = {"ttft_ms": [], "wire_bytes": [], "evaluated": []}
    history: list[dict[str, str]] = [{"role": "system", "content": talk.system}]
    for turn in TURNS[: talk.turns]:
        if talk.idle and turn is not TURNS[0]:
            time.sleep(talk.idle)
        history.append({"role": "user", "content": turn.content})
        prompt = fmt.render(history, add_generation_prompt=True)
        prompt = prompt[len(bos) :] if bos and prompt.startswith(bos) else prompt
        body = {
            "prompt": prompt,
            "max_tokens": talk.max_tokens,
            "temperature": 0,
            "stream": True,
            "cache_prompt": True,
            "stream_options": {"include_usage": True},
        }
        ttft, text, last = sse(client, f"{url}/v1/completions", body)
        history.append({"role": "assistant", "content": text})
        out["ttft_ms"].append(ttft)
        out["wire_bytes"].append(len(json.dumps(body)))
        out["evaluated"].append((last.get("timings") or {}).get("prompt_n"))
    return out
