"""``continuum bench codex``: the requests the Codex CLI sends, continuum vs llama-server.

The requests are a synthetic stand-in of Codex 0.169's, of the same shape and size
(:mod:`continuum.bench.codex_input`: ~20k characters of instructions in two developer messages,
Codex's 8 function tools, its ``multi_agent_v1`` namespace and hosted ``web_search``; ~8.4k
prompt tokens on Qwen2.5-Coder), streamed ``POST /v1/responses`` with ``prompt_cache_key`` and a
``session-id`` header, greedy, replies of at most ``max_output_tokens``. Two parts, on one
server run:

1. **The tool loop**: one session, ``steps`` requests; each after the first re-sends the whole
   input plus an ``exec_command`` ``function_call`` and its ``function_call_output`` (200-2,000
   characters), both constructed from the seed, so both servers get identical input whatever
   the model replied (a full resend, no ``previous_response_id``, as Codex does).
2. **New sessions with the same instructions**: after the loop (session 1 holds the
   instructions), sessions 2..N send their first request one at a time (a new uuid each, another
   task); then every session sends its next step at once.

Measured at the client per request: TTFT, from the request sent to the first event that carries
model output (``response.output_text.delta``, or ``response.output_item.added`` of a function
call; ``response.completed`` when neither came); and the prompt tokens the server says it
evaluated: continuum's ``usage.continuum.prompt_tokens_evaluated`` (a session's first request
includes the wake tokens it decoded), llama-server's ``timings.prompt_n``; unknown otherwise.
With tools offered, continuum holds what could still be a tool call (a bare JSON call, a
``<tool_call>`` block) until the reply is complete, so a held reply's TTFT at the client includes
its decode; the server's own time to its first token (continuum's ``usage.continuum.ttft_ms``,
llama-server's ``timings.prompt_ms``) is recorded beside it.

Servers, each started for its run and stopped after it (never two at once), modes alternated
run by run, medians of ``reps``; the same model file, thread count and context per session:

``continuum``     ``continuum serve`` with its defaults but ``--threads`` and ``--n-ctx`` (lanes:
                  its default 4, or one per session beyond that).
``llama-server``  ``--jinja``, one slot per session (``-np N``, ``-c`` N times the context per
                  session), at its fastest flags here (``-fa off --swa-full``); its prompt cache
                  and slot choice by prompt similarity as shipped. Its own ``/v1/responses`` when
                  it has one (a probe that does not answer 404), else ``/v1/chat/completions``
                  with the same messages and tools in chat form. Its Responses endpoint skips
                  tools that are not functions, so it is sent the namespace's 5 tools as plain
                  function tools (:func:`peer_body`): both servers offer the model the same 13
                  tools (``web_search`` is left out by both), so both prompts are of one size.

The tables, the losses and the report's section are in :mod:`continuum.bench.codex_report`.
"""

from __future__ import annotations

import json
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench import codex_input
from continuum.bench.codex_input import CodexShape
from continuum.bench.codex_report import MODES
from continuum.bench.concurrent import SERVE_LANES, run_clients
from continuum.bench.http import _free_port, _process, serve_command
from continuum.bench.settings import PeerSettings
from continuum.settings import setting

RESPONSES, CHAT = "/v1/responses", "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one run sends its requests."""

    url: str
    mode: str
    endpoint: str  # RESPONSES or CHAT


@dataclass(frozen=True, slots=True)
class Plan:
    model_file: ModelFile
    threads: int
    n_ctx: int  # per session
    steps: int
    sessions: int
    max_output_tokens: int
    shape: CodexShape
    llama_server: str | None
    llama_server_args: tuple[str, ...] = ()  # appended to its command line


class CodexConfig(PeerSettings):
    """What a ``bench codex`` run is told (its command line is generated from it)."""

    steps: int = setting(10, "Requests in session 1's tool loop.", ge=1, le=40)
    sessions: int = setting(
        4, "Sessions with the same instructions (session 1 runs the loop).", ge=1, le=8
    )
    max_output_tokens: int = setting(24, "Most tokens in a reply.", ge=1)
    n_ctx: int = setting(16384, "Context per session, on both servers.", ge=2048)
    llama_server_args: str = setting(
        "",
        "More llama-server flags, appended to its command line (e.g. '--no-repack' where "
        "its repacked weights crash); recorded in the results.",
    )


# -- one request ------------------------------------------------------------------------------
def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request in Chat Completions form: developer -> system, ``function_call`` ->
    an assistant message's ``tool_calls``, ``function_call_output`` -> a tool message; function
    tools and the namespace's tools as chat tools (hosted tools dropped)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    for item in body["input"]:
        if item.get("type") == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.get("type") == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            )
        else:
            role = "system" if item["role"] == "developer" else item["role"]
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": role, "content": text})
    tools = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        for t in flat_tools(body["tools"])
    ]
    return {
        "model": body["model"],
        "messages": messages,
        "tools": tools,
        "tool_choice": body["tool_choice"],
        "parallel_tool_calls": body["parallel_tool_calls"],
        "temperature": body["temperature"],
        "max_tokens": body["max_output_tokens"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def flat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function tools, a namespace's tools in its place as function tools of their own."""
    return [
        t for tool in tools for t in (tool.get("tools") or [tool]) if t.get("type") == "function"
    ]


def peer_body(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as llama-server's ``/v1/responses`` is sent it: the namespace's tools
    flattened into function tools, because it skips every tool that is not a function."""
    return {**body, "tools": flat_tools(body["tools"])}


def output_kind(event: dict[str, Any]) -> str | None:
    """What model output an event carries: ``text``, ``call``, ``completed`` (the end, with
    nothing before it), or None."""
    kind = event.get("type")
    if kind == "response.output_text.delta":
        return "text"
    if kind == "response.output_item.added":
        item = event.get("item") or {}
        return "call" if item.get("type") in ("function_call", "custom_tool_call") else None
    if kind in ("response.completed", "response.incomplete"):
        return "completed"
    for choice in event.get("choices") or ():  # Chat Completions chunks
        delta = choice.get("delta") or {}
        if delta.get("tool_calls"):
            return "call"
        if delta.get("content"):
            return "text"
    return None


def counts(final: dict[str, Any]) -> dict[str, Any]:
    """The server's own counts in its last event: prompt tokens, reply tokens, evaluated (None
    when it reports none), wake tokens decoded (continuum), reused (cached), the response's
    status, the server's own first-token time, and the reply's items."""
    response = final.get("response") or {}
    usage = response.get("usage") or final.get("usage") or {}
    ours = usage.get("continuum") or {}
    timings = final.get("timings") or {}
    evaluated = ours.get("prompt_tokens_evaluated", timings.get("prompt_n"))
    details = usage.get("input_tokens_details") or usage.get("prompt_tokens_details") or {}
    return {
        "prompt": usage.get("input_tokens", usage.get("prompt_tokens")),
        "completion": usage.get("output_tokens", usage.get("completion_tokens")),
        "evaluated": evaluated,
        "wake": ours.get("wake_tokens", 0),
        "cached": details.get("cached_tokens"),
        "status": response.get("status"),  # completed, or incomplete (cut at the limit)
        "hit_tier": ours.get("hit_tier"),
        # the server's own time to first token (llama-server: its prompt processing)
        "server_ttft_ms": ours.get("ttft_ms", timings.get("prompt_ms")),
        "output": [item.get("name") or item.get("type") for item in response.get("output") or ()],
    }


def send(
    client: httpx.Client, target: Target, body: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any]:
    """One streamed request: TTFT and total time at the client, the server's counts. A
    keep-alive connection the server already closed is retried once, timed from the retry."""
    if target.endpoint == CHAT:
        body = chat_body(body)
    elif target.mode == "llama-server":
        body = peer_body(body)
    raw = json.dumps(body)
    try:
        return _send_once(client, target.url + target.endpoint, raw, headers)
    except httpx.RemoteProtocolError:
        return _send_once(client, target.url + target.endpoint, raw, headers)


def _send_once(client: httpx.Client, url: str, raw: str, headers: dict[str, str]) -> dict[str, Any]:
    first: tuple[float, str] | None = None
    final: dict[str, Any] = {}
    t0 = time.perf_counter()
    with client.stream("POST", url, content=raw, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:800]}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("type") == "error" or "error" in event:
                raise RuntimeError(f"{url} streamed an error: {line[:800]}")
            kind = output_kind(event)
            if kind is not None and first is None:
                first = ((time.perf_counter() - t0) * 1000, kind)
            if kind == "completed" or event.get("usage") or event.get("timings"):
                final = event
    total = (time.perf_counter() - t0) * 1000
    ttft, kind = first or (total, "completed")
    return {"ttft_ms": ttft, "total_ms": total, "first_event": kind, **counts(final)}


# -- one run ----------------------------------------------------------------------------------
def responses_endpoint(url: str) -> str:
    """RESPONSES when the server has it (a tiny request not answered 404), else CHAT."""
    probe = {"model": "continuum", "input": "Say hi.", "max_output_tokens": 1, "temperature": 0}
    r = httpx.post(url + RESPONSES, json=probe, timeout=600)
    return CHAT if r.status_code == 404 else RESPONSES


@contextmanager
def serving(mode: str, plan: Plan) -> Iterator[Target]:
    """The server of ``mode``, started for one run and stopped after it."""
    port, threads = _free_port(), str(plan.threads)
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "continuum":
            args = serve_command(
                plan.model_file.path, port, threads, plan.n_ctx, Path(tmp) / "h.db"
            )
            if plan.sessions > SERVE_LANES:
                args += ["--parallel", str(plan.sessions)]
        else:
            args = [
                str(plan.llama_server),
                "-m",
                str(plan.model_file.path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                str(plan.n_ctx * plan.sessions),
                "-np",
                str(plan.sessions),
                "-t",
                threads,
                "-tb",
                threads,
                "-fa",
                "off",
                "--swa-full",
                "--jinja",
                *plan.llama_server_args,
            ]
        with _process(args, f"{url}/health"):
            endpoint = RESPONSES if mode == "continuum" else responses_endpoint(url)
            yield Target(url, mode, endpoint)


def run_once(mode: str, plan: Plan, tick: Callable[[str], None]) -> dict[str, Any]:
    """Both parts on one server run: the loop of session 1, then the new sessions' first
    requests one at a time, then every session's next step at once."""
    shape, limit = plan.shape, plan.max_output_tokens
    with serving(mode, plan) as target, httpx.Client(timeout=3600) as client:
        loop = []
        for step in range(1, plan.steps + 1):
            tick(f"{mode}: tool loop, step {step}/{plan.steps}")
            loop.append(send(client, target, *codex_input.request(shape, 0, step, limit)))
        firsts = [loop[0]]
        for s in range(1, plan.sessions):
            tick(f"{mode}: session {s + 1}'s first request")
            firsts.append(send(client, target, *codex_input.request(shape, s, 1, limit)))
        together: list[dict[str, Any]] = []
        if plan.sessions > 1:
            tick(f"{mode}: {plan.sessions} sessions' next step at once")
            together = _together(target, plan)
    return {
        "mode": mode,
        "endpoint": target.endpoint,
        "loop": loop,
        "firsts": firsts,
        "together": together,
    }


def _together(target: Target, plan: Plan) -> list[dict[str, Any]]:
    """Every session's next step at once: session 1's after its loop, the others' second."""

    def client(i: int, start: Any) -> list[dict[str, Any]]:
        step = plan.steps + 1 if i == 0 else 2
        body, headers = codex_input.request(plan.shape, i, step, plan.max_output_tokens)
        with httpx.Client(timeout=3600) as own:
            start.wait()
            return [send(own, target, body, headers)]

    results, _ = run_clients(plan.sessions, client)
    return [r[0] for r in results]


def run_codex(
    cfg: CodexConfig, shape: CodexShape | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """``shape``: the stand-in requests' sizes (default: Codex's own, :class:`CodexShape`)."""
    mf = resolve_model(cfg.model)
    n_threads = LlamaConfig(n_threads=cfg.threads).threads()[0]
    reps, steps, sessions, llama_server = cfg.reps, cfg.steps, cfg.sessions, cfg.llama_server
    plan = Plan(
        mf,
        n_threads,
        cfg.n_ctx,
        steps,
        sessions,
        cfg.max_output_tokens,
        shape or CodexShape(),
        llama_server,
        tuple(shlex.split(cfg.llama_server_args)),
    )
    modes = [m for m in MODES if m != "llama-server" or llama_server]
    per_run = steps + (sessions - 1) + (1 if sessions > 1 else 0)
    total, done = reps * len(modes) * per_run, [0]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}

    def tick(what: str) -> None:
        if progress is not None:
            progress(f"run {rep + 1}/{reps}, {what}", done[0], total)
        done[0] += 1

    for rep in range(reps):
        for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
            runs[mode].append(run_once(mode, plan, tick))
    if progress is not None:
        progress("done", total, total)
    return {
        "experiment": "codex",
        "model": mf.path.name,
        "model_digest": mf.digest,
        "machine": {"model_path": str(mf.path), "n_threads": n_threads},
        "n_threads": n_threads,
        "n_ctx": cfg.n_ctx,
        "reps": reps,
        "steps": steps,
        "sessions": sessions,
        "max_output_tokens": cfg.max_output_tokens,
        "llama_server_args": list(plan.llama_server_args) if llama_server else None,
        "request": describe(plan.shape),
        "rows": [summary(rs) for rs in runs.values()],
        "runs": runs,
    }


def describe(shape: CodexShape) -> dict[str, Any]:
    """The stand-in's sizes, as the results record them."""
    first, _ = codex_input.request(shape, 0, 1, 1)
    developer = [len(i["content"][0]["text"]) for i in first["input"] if i["role"] == "developer"]
    return {
        "seed": shape.seed,
        "developer_chars": developer,
        "tools": len(first["tools"]),
        "tools_chars": len(json.dumps(first["tools"])),
        "first_request_bytes": len(json.dumps(first)),
    }


# -- medians ----------------------------------------------------------------------------------
def _median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def per_request(rs: list[dict[str, Any]], part: str) -> dict[str, list[Any]]:
    """Per request of ``part`` over the runs: median TTFT and its range, median counts."""
    columns = list(zip(*(r[part] for r in rs), strict=True))
    return {
        "ttft_ms": [_median([x["ttft_ms"] for x in c]) for c in columns],
        "ttft_range": [
            (min(x["ttft_ms"] for x in c), max(x["ttft_ms"] for x in c)) for c in columns
        ],
        "evaluated": [_median([x["evaluated"] for x in c]) for c in columns],
        "prompt": [_median([x["prompt"] for x in c]) for c in columns],
        "first_event": [c[0]["first_event"] for c in columns],
        "server_ttft_ms": [_median([x.get("server_ttft_ms") for x in c]) for c in columns],
    }


def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's medians over its runs; ``together``'s p50 and slowest TTFT per run, medianed."""
    row = {
        "mode": rs[0]["mode"],
        "endpoint": rs[0]["endpoint"],
        "loop": per_request(rs, "loop"),
        "firsts": per_request(rs, "firsts"),
    }
    if rs[0]["together"]:
        row["together"] = per_request(rs, "together")
        ttfts = [[x["ttft_ms"] for x in r["together"]] for r in rs]
        row["together_p50_ms"] = statistics.median(statistics.median(t) for t in ttfts)
        row["together_max_ms"] = statistics.median(max(t) for t in ttfts)
    return row
