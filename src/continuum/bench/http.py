"""``continuum bench http``: seed 000's conversation over HTTP, against real servers.

Modes, each a 16-turn greedy conversation over loopback with streaming replies:

``delta``        continuum serve's session API: each turn sends only the new user message.
``resend``       continuum serve, the full transcript re-sent each turn with the session header
                 (what an unmodified OpenAI client does): verified, only the suffix decoded.
``llama-cpp-python``  the full transcript rendered to text and re-sent each turn to
                 llama-cpp-python's own server (``/v1/completions``), which reuses its longest
                 common prefix.
``llama-server`` the same against llama.cpp's ``llama-server`` when ``--llama-server PATH``
                 is given, at its fastest flags here (``-fa off --swa-full``, prompt cache on).
``input``        continuum serve's input stream (``POST /v1/sessions/{id}/input``): the user
                 message is sent as a chunked body at ``--rate`` tokens/s (about 4 characters
                 per token; 4 tokens/s is about 3 words/s, speech) and decoded while it
                 arrives (prefill on arrival); the body ends ``--end-delay-ms`` after the last
                 piece (the Enter key, a voice detector's silence).

Every mode waits the same ``--idle-ms`` between a reply and the next message (a person reading,
a tool running); continuum's eager glue runs in that gap, and the peers get the same gap.
TTFT is measured at the client from the end of input — the request sent, or for ``input`` the
last body byte written — to the first streamed content byte.
Wire bytes are the request bodies sent. Evaluated prompt tokens come from each server's own
report (continuum's usage, llama-server's ``timings.prompt_n``); llama-cpp-python's server
reports none, so they are shown as unknown. Modes alternate run by run; medians reported.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.llamacpp import LlamaConfig, choose_chat_format
from continuum.backends.models import resolve_model
from continuum.bench.conversation import SYSTEM, TURNS, long_system_prompt, n_ctx_for

Progress = Callable[[str, int, int], None]
MODES = ("delta", "resend", "input", "llama-cpp-python", "llama-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout:.0f} s")


def _sse(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, str, dict[str, Any]]:
    """POST a streaming request; return (TTFT ms, text, the last event with usage/timings).
    A keep-alive connection the server already closed (llama-server closes one after a few
    requests) is retried once on a fresh connection, and timed from the retry."""
    try:
        return _sse_once(client, url, body)
    except httpx.RemoteProtocolError:
        return _sse_once(client, url, body)


def _sse_once(
    client: httpx.Client, url: str, body: dict[str, Any]
) -> tuple[float, str, dict[str, Any]]:
    raw = json.dumps(body)
    t0 = time.perf_counter()
    with client.stream("POST", url, content=raw, headers={"content-type": "application/json"}) as r:
        return _read_sse(r, lambda: t0)


def _read_sse(r: httpx.Response, start: Callable[[], float]) -> tuple[float, str, dict[str, Any]]:
    """Read a streamed completion: (ms from ``start()`` to the first content byte, the text,
    the last event carrying usage or timings)."""
    r.raise_for_status()
    ttft = None
    text = ""
    last: dict[str, Any] = {}
    for line in r.iter_lines():
        if not line.startswith("data:") or line.endswith("[DONE]"):
            continue
        event = json.loads(line[5:])
        for choice in event.get("choices") or ():
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if piece and ttft is None:
                ttft = (time.perf_counter() - start()) * 1000
            text += piece
        if event.get("usage") or event.get("timings"):
            last = event
    return (ttft if ttft is not None else float("nan")), text, last


@contextmanager
def _continuum(model: str | None, n_ctx: int, threads: int | None) -> Iterator[str]:
    import uvicorn

    from continuum.server.app import ServerConfig, build_state, create_app

    with tempfile.TemporaryDirectory() as tmp:
        state = build_state(
            ServerConfig(
                model=model,
                n_ctx=n_ctx,
                threads=threads,
                store=Path(tmp) / "h.db",
                snapshot_dir=Path(tmp) / "snaps",
            )
        )
        port = _free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            _wait(f"http://127.0.0.1:{port}/health")
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            state.close()


@contextmanager
def _process(args: list[str], health: str) -> Iterator[None]:
    with tempfile.TemporaryFile() as log:
        # its own session and no stdin: llama-server shuts down when its stdin or terminal goes
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
        try:
            _wait(health, proc)
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def run_http(
    model: str | None = None,
    reps: int = 3,
    threads: int | None = None,
    max_tokens: int = 48,
    system_tokens: int = 0,
    llama_server: str | None = None,
    turns: int = len(TURNS),
    progress: Progress | None = None,
    idle_ms: int = 0,
    modes: tuple[str, ...] | None = None,
    rate_tps: float = 200.0,
    end_delay_ms: int = 0,
    n_ctx: int | None = None,
) -> dict[str, Any]:
    mf = resolve_model(model)
    cfg = LlamaConfig(n_threads=threads)
    n_threads = cfg.threads()[0]
    system = long_system_prompt(system_tokens) if system_tokens else SYSTEM
    n_ctx = n_ctx or n_ctx_for(system_tokens, turns, max_tokens)  # the same for every server
    bos = "<bos>" if mf.info.architecture.startswith("gemma") else ""
    fmt = choose_chat_format(mf, None, bos, "<eos>")
    default = ["delta", "resend", "llama-cpp-python"] + (["llama-server"] if llama_server else [])
    modes_ = list(modes) if modes else default
    unknown = [m for m in modes_ if m not in MODES]
    if unknown or ("llama-server" in modes_ and not llama_server):
        raise ValueError(f"modes must be among {MODES} (llama-server needs its path): {unknown}")
    modes = tuple(modes_)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    idle = idle_ms / 1000
    ports = {"lcp": _free_port(), "ls": _free_port()}
    lcp_args = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(mf.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(ports["lcp"]),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--flash_attn",
        "false",
    ]
    ls_args = [
        str(llama_server),
        "-m",
        str(mf.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(ports["ls"]),
        "-c",
        str(n_ctx),
        "-t",
        str(n_threads),
        "-tb",
        str(n_threads),
        "-fa",
        "off",
        "--swa-full",
        "-np",
        "1",
    ]
    total = reps * len(modes)
    done = 0
    ours = any(m in ("delta", "resend", "input") for m in modes)
    with (
        _continuum(model, n_ctx, threads) if ours else nullcontext("") as cont,
        httpx.Client(timeout=600) as client,
    ):
        for rep in range(reps):
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                if progress:
                    progress(f"run {rep + 1}/{reps}: {mode}", done, total)
                if mode in ("delta", "resend", "input"):
                    runs[mode].append(
                        _continuum_run(
                            client,
                            cont,
                            mode,
                            system,
                            turns,
                            max_tokens,
                            idle,
                            rate_tps,
                            end_delay_ms / 1000,
                        )
                    )
                elif mode == "llama-cpp-python":
                    with _process(lcp_args, f"http://127.0.0.1:{ports['lcp']}/v1/models"):
                        runs[mode].append(
                            _text_run(
                                client,
                                f"http://127.0.0.1:{ports['lcp']}",
                                fmt,
                                bos,
                                system,
                                turns,
                                max_tokens,
                                idle,
                            )
                        )
                else:
                    with _process(ls_args, f"http://127.0.0.1:{ports['ls']}/health"):
                        runs[mode].append(
                            _text_run(
                                client,
                                f"http://127.0.0.1:{ports['ls']}",
                                fmt,
                                bos,
                                system,
                                turns,
                                max_tokens,
                                idle,
                            )
                        )
                done += 1
    if progress:
        progress("done", total, total)
    rows = []
    for mode, rs in runs.items():
        means = [statistics.fmean(r["ttft_ms"][1:]) for r in rs]  # turns 2-16
        ev = rs[0]["evaluated"]
        rows.append(
            {
                "mode": mode,
                "mean_ttft_ms_turns_2_16": statistics.median(means),
                "ttft_spread_ms": [min(means), max(means)],
                "ttft_ms_per_turn": [
                    statistics.median(x) for x in zip(*(r["ttft_ms"] for r in rs), strict=True)
                ],
                "wire_bytes": sum(rs[0]["wire_bytes"]),
                "evaluated_prompt_tokens": None if None in ev else sum(ev),
            }
        )
    return {
        "experiment": "http",
        "model_digest": mf.digest,
        "n_threads": n_threads,
        "n_ctx": n_ctx,
        "reps": reps,
        "turns": turns,
        "max_tokens": max_tokens,
        "system_tokens": system_tokens,
        "system_chars": len(system),
        "idle_ms": idle_ms,
        "rate_tps": rate_tps if "input" in modes else None,
        "end_delay_ms": end_delay_ms if "input" in modes else None,
        "rows": rows,
        "runs": runs,
    }


def _input_stream(
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
        return _read_sse(r, lambda: ended[0])  # timed from the end of the body


def _continuum_run(
    client: httpx.Client,
    url: str,
    mode: str,
    system: str,
    turns: int,
    max_tokens: int,
    idle: float = 0.0,
    rate_tps: float = 200.0,
    end_delay: float = 0.0,
) -> dict[str, Any]:
    out: dict[str, list[Any]] = {"ttft_ms": [], "wire_bytes": [], "evaluated": []}
    created_body = {"system": system}
    created = client.post(f"{url}/v1/sessions", json=created_body).json()
    sid = created["id"]
    # the session's creation crossed the wire and prefilled the system prompt: count both
    out["wire_bytes"].append(len(json.dumps(created_body)))
    out["evaluated"].append(created["wake_tokens"])
    out["decoded_early"] = [0]
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn in TURNS[:turns]:
        msg = {"role": "user", "content": turn.content}
        common = {
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if idle and turn is not TURNS[0]:
            time.sleep(idle)  # a person reading the reply: idle work may run now
        if mode == "input":
            query = {"max_tokens": max_tokens, "temperature": 0, "stream": "true"}
            ttft, text, last = _input_stream(
                client, f"{url}/v1/sessions/{sid}/input", turn.content, query, rate_tps, end_delay
            )
            history += [msg, {"role": "assistant", "content": text}]
            out["ttft_ms"].append(ttft)
            out["wire_bytes"].append(len(turn.content.encode()))
            _count(out, last)
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
            else httpx.Client(timeout=300, headers={"X-Continuum-Session": sid})
        )
        ttft, text, last = _sse(hdr_client, target, body)
        if hdr_client is not client:
            hdr_client.close()
        history += [msg, {"role": "assistant", "content": text}]
        out["ttft_ms"].append(ttft)
        out["wire_bytes"].append(len(json.dumps(body)))
        _count(out, last)
    return out


def _count(out: dict[str, list[Any]], last: dict[str, Any]) -> None:
    """Record a turn's evaluated prompt tokens from continuum's usage: those decoded after the
    end of input, and those decoded ahead of it (eager glue, kept or discarded, and a message
    fed as it arrived)."""
    u = last.get("usage", {}).get("continuum", {})
    out["evaluated"].append(u.get("prompt_tokens_evaluated"))
    early = ("fed_tokens", "eager_tokens_used", "eager_tokens_discarded")
    out.setdefault("decoded_early", []).append(sum(u.get(k) or 0 for k in early))


def _text_run(
    client: httpx.Client,
    url: str,
    fmt: Any,
    bos: str,
    system: str,
    turns: int,
    max_tokens: int,
    idle: float = 0.0,
) -> dict[str, Any]:
    out: dict[str, list[Any]] = {"ttft_ms": [], "wire_bytes": [], "evaluated": []}
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    for turn in TURNS[:turns]:
        if idle and turn is not TURNS[0]:
            time.sleep(idle)
        history.append({"role": "user", "content": turn.content})
        prompt = fmt.render(history, add_generation_prompt=True)
        prompt = prompt[len(bos) :] if bos and prompt.startswith(bos) else prompt
        body = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "cache_prompt": True,
            "stream_options": {"include_usage": True},
        }
        ttft, text, last = _sse(client, f"{url}/v1/completions", body)
        history.append({"role": "assistant", "content": text})
        out["ttft_ms"].append(ttft)
        out["wire_bytes"].append(len(json.dumps(body)))
        out["evaluated"].append((last.get("timings") or {}).get("prompt_n"))
    return out


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"http · {r['turns']} turns · {r['system_chars']:,}-char system prompt · "
        f"{r['n_threads']} threads · n_ctx {r['n_ctx']} · median of {r['reps']} · "
        f"idle gap {r.get('idle_ms', 0)} ms",
        "",
        "| mode | mean TTFT turns 2–16 | spread | wire bytes | evaluated prompt tokens |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        ev = row["evaluated_prompt_tokens"]
        lines.append(
            f"| {row['mode']} | {row['mean_ttft_ms_turns_2_16']:.1f} ms | "
            f"{row['ttft_spread_ms'][0]:.1f}–{row['ttft_spread_ms'][1]:.1f} | "
            f"{row['wire_bytes']:,} | {'unknown' if ev is None else f'{ev:,}'} |"
        )
    by = {row["mode"]: row for row in r["rows"]}
    for ours in ("delta", "input"):
        for peer in ("llama-cpp-python", "llama-server"):
            if peer in by and ours in by:
                d, p = by[ours], by[peer]
                speed = p["mean_ttft_ms_turns_2_16"] / d["mean_ttft_ms_turns_2_16"]
                fewer = 100 * (1 - d["wire_bytes"] / p["wire_bytes"])
                lines.append(f"{ours} vs {peer}: {speed:.2f}x TTFT, {fewer:.1f}% fewer wire bytes")
    lines.append("")
    lines.append(
        "TTFT per turn (ms): "
        + "; ".join(
            f"{row['mode']}: " + ", ".join(f"{x:.0f}" for x in row["ttft_ms_per_turn"])
            for row in r["rows"]
        )
    )
    return "\n".join(lines)
