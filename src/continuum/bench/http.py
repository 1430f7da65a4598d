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
a tool running); continuum's eager glue runs in that gap, and the peers get the same gap;
``--idle-ms 0`` is an agent loop that sends the next request at once. Each server runs alone,
started for its run and stopped after it.
TTFT is measured at the client from the end of input — the request sent, or for ``input`` the
last body byte written — to the first streamed content byte.
Wire bytes are the request bodies sent. Evaluated prompt tokens come from each server's own
report (continuum's usage, llama-server's ``timings.prompt_n``); llama-cpp-python's server
reports none, so they are shown as unknown. Tokens continuum decoded before the end of input
(eager glue, a message fed as it arrived) have their own column: work moved earlier is not
work saved. Modes alternate run by run; medians reported.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.chat_format import ChatFormat
from continuum.backends.llama_process import llama_cpp_server_argv
from continuum.backends.llamacpp import LlamaConfig, choose_chat_format
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench import http_client
from continuum.bench.conversation import SYSTEM, TURNS, long_system_prompt, n_ctx_for
from continuum.bench.http_client import Conversation
from continuum.bench.settings import PeerSettings
from continuum.settings import Names, setting

MODES = ("delta", "resend", "input", "llama-cpp-python", "llama-server")
_OURS = ("delta", "resend", "input")  # the modes continuum serve answers


# `continuum` of this interpreter, as a process of its own
CONTINUUM = (sys.executable, "-c", "from continuum.cli.main import main; main()")


def serve_command(
    model: str | Path | None,
    port: int,
    threads: int | str,
    n_ctx: int,
    store: str | Path,
    *extra: str,
) -> list[str]:
    """``continuum serve`` as a benchmark starts it: ``model`` (a file, an alias, or None for
    the default), bound to ``port``, ``threads`` threads, ``n_ctx``, the history in ``store``,
    then ``extra`` options."""
    chosen = ["-m", str(model)] if model is not None else []
    head = [*CONTINUUM, "serve", *chosen, "--port", str(port), "-t", str(threads)]
    return [*head, "--n-ctx", str(n_ctx), "--store", str(store), *extra]


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


@contextmanager
def _continuum(model: str | None, n_ctx: int, threads: int | None) -> Iterator[str]:
    import uvicorn

    from continuum.server import listener
    from continuum.server.app import ServerConfig, build_state, create_app

    with tempfile.TemporaryDirectory() as tmp:
        state = build_state(
            ServerConfig.of(
                model=model,
                n_ctx=n_ctx,
                threads=threads,
                store=str(Path(tmp) / "h.db"),
                snapshot_dir=Path(tmp) / "snaps",
            )
        )
        port = _free_port()
        server = uvicorn.Server(listener.config(create_app(state), "127.0.0.1", port))
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
def _process(args: list[str], health: str) -> Iterator[subprocess.Popen[bytes]]:
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
            yield proc
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@dataclass(frozen=True, slots=True)
class _Peer:
    """A peer server's command line, started afresh for each of its runs and stopped after."""

    args: list[str]
    health: str  # polled until it answers 200
    url: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """What every run of one ``run_http`` call shares: the conversation and the peers."""

    talk: Conversation
    fmt: ChatFormat
    bos: str
    peers: dict[str, _Peer]  # by mode


class HttpConfig(PeerSettings):
    """What a ``bench http`` run is told (its command line is generated from it)."""

    max_tokens: int = setting(48, "Most tokens in a reply.", ge=1)
    system_tokens: int = setting(
        0, "A long system prompt of about N tokens (0: the short one).", ge=0
    )
    turns: int = setting(len(TURNS), "User turns of the conversation.", ge=2, le=len(TURNS))
    modes: Names | None = setting(
        None,
        "Comma-separated: delta, resend, input, llama-cpp-python, llama-server "
        "(default: delta, resend, llama-cpp-python, and llama-server when given).",
    )
    idle_ms: int = setting(
        0, "Pause between a reply and the next message, the same for every mode.", ge=0
    )
    rate: float = setting(
        200.0,
        "input mode: tokens per second the message arrives at (4 characters a token).",
        ge=1,
    )
    end_delay_ms: int = setting(
        0,
        "input mode: time between the last piece and the end of the message (Enter key).",
        ge=0,
    )


def _modes(modes: tuple[str, ...] | None, llama_server: str | None) -> tuple[str, ...]:
    """The modes to run: those asked for, or every one available here."""
    default = ["delta", "resend", "llama-cpp-python"] + (["llama-server"] if llama_server else [])
    modes_ = list(modes) if modes else default
    unknown = [m for m in modes_ if m not in MODES]
    if unknown or ("llama-server" in modes_ and not llama_server):
        raise ValueError(f"modes must be among {MODES} (llama-server needs its path): {unknown}")
    return tuple(modes_)


def _llama_cpp_python(mf: ModelFile, port: int, n_ctx: int, n_threads: int) -> _Peer:
    args = [
        *llama_cpp_server_argv(),  # without weight repacking, which crashes on AMX CPUs
        "--model",
        str(mf.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        "--flash_attn",
        "false",
    ]
    return _Peer(args, f"http://127.0.0.1:{port}/v1/models", f"http://127.0.0.1:{port}")


def _llama_server(
    llama_server: str | None, mf: ModelFile, port: int, n_ctx: int, n_threads: int
) -> _Peer:
    args = [
        str(llama_server),
        "-m",
        str(mf.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
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
    return _Peer(args, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}")


def run_http(
    cfg: HttpConfig, progress: Progress | None = None, n_ctx: int | None = None
) -> dict[str, Any]:
    """``n_ctx``: every server's context (default: the conversation's, as it needs)."""
    mf = resolve_model(cfg.model)
    n_threads = LlamaConfig(n_threads=cfg.threads).threads()[0]
    turns, max_tokens, system_tokens = cfg.turns, cfg.max_tokens, cfg.system_tokens
    system = long_system_prompt(system_tokens) if system_tokens else SYSTEM
    n_ctx = n_ctx or n_ctx_for(system_tokens, turns, max_tokens)  # the same for every server
    bos = "<bos>" if mf.info.architecture.startswith("gemma") else ""
    fmt = choose_chat_format(mf, None, bos, "<eos>")
    modes = _modes(cfg.modes, cfg.llama_server)
    ports = {"lcp": _free_port(), "ls": _free_port()}
    peers = {
        "llama-cpp-python": _llama_cpp_python(mf, ports["lcp"], n_ctx, n_threads),
        "llama-server": _llama_server(cfg.llama_server, mf, ports["ls"], n_ctx, n_threads),
    }
    talk = Conversation(
        system, turns, max_tokens, cfg.idle_ms / 1000, cfg.rate, cfg.end_delay_ms / 1000
    )
    runs = _alternate(_Plan(talk, fmt, bos, peers), modes, cfg, n_ctx, progress)
    return {
        "experiment": "http",
        "model_digest": mf.digest,
        "n_threads": n_threads,
        "n_ctx": n_ctx,
        "reps": cfg.reps,
        "turns": turns,
        "max_tokens": max_tokens,
        "system_tokens": system_tokens,
        "system_chars": len(system),
        "idle_ms": cfg.idle_ms,
        "rate_tps": cfg.rate if "input" in modes else None,
        "end_delay_ms": cfg.end_delay_ms if "input" in modes else None,
        "rows": _rows(runs),
        "runs": runs,
    }


def _alternate(
    plan: _Plan,
    modes: tuple[str, ...],
    cfg: HttpConfig,
    n_ctx: int,
    progress: Progress | None,
) -> dict[str, list[dict[str, Any]]]:
    """``reps`` runs of every mode, the order rotated each repetition so drift hits all of
    them. Every server runs alone: continuum's is started for each of its runs and stopped
    after, as the peers are (an idle server's threads slow the one being measured)."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    reps = cfg.reps
    total = reps * len(modes)
    done = 0
    with httpx.Client(timeout=600) as client:
        for rep in range(reps):
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                if progress:
                    progress(f"run {rep + 1}/{reps}: {mode}", done, total)
                ours = mode in _OURS
                serving = _continuum(cfg.model, n_ctx, cfg.threads) if ours else nullcontext("")
                with serving as cont:
                    runs[mode].append(_run_mode(plan, client, cont, mode))
                done += 1
    if progress:
        progress("done", total, total)
    return runs


def _run_mode(plan: _Plan, client: httpx.Client, cont: str, mode: str) -> dict[str, Any]:
    if mode in _OURS:
        return http_client.continuum_run(client, cont, mode, plan.talk)
    return _peer_run(plan, client, plan.peers[mode])


def _peer_run(plan: _Plan, client: httpx.Client, peer: _Peer) -> dict[str, Any]:
    """One run against a peer server started for it, and stopped after it."""
    with _process(peer.args, peer.health):
        return http_client.text_run(client, peer.url, plan.fmt, plan.bos, plan.talk)


def _rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per mode: medians over its runs."""
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
                # decoded before the end of input (eager glue, a message fed as it arrived):
                # work moved earlier, not work saved; a peer decodes nothing ahead
                "decoded_early_tokens": sum(rs[0].get("decoded_early", [])),
            }
        )
    return rows


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"http · {r['turns']} turns · {r['system_chars']:,}-char system prompt · "
        f"{r['n_threads']} threads · n_ctx {r['n_ctx']} · median of {r['reps']} · "
        f"idle gap {r.get('idle_ms', 0)} ms",
        "",
        "| mode | mean TTFT turns 2–16 | spread | wire bytes | evaluated after input | "
        "decoded ahead of input |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        ev = row["evaluated_prompt_tokens"]
        lines.append(
            f"| {row['mode']} | {row['mean_ttft_ms_turns_2_16']:.1f} ms | "
            f"{row['ttft_spread_ms'][0]:.1f}–{row['ttft_spread_ms'][1]:.1f} | "
            f"{row['wire_bytes']:,} | {'unknown' if ev is None else f'{ev:,}'} | "
            f"{row.get('decoded_early_tokens', 0):,} |"
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
