"""``continuum bench agent``: a scripted tool loop over HTTP, continuum vs llama-server.

An agent fixes a failing build in ``--steps`` model calls. Every call sends the whole
transcript with two tools (``read_file``, ``run_tests``) and ``tool_choice: auto``, greedy;
the reply's call (the first, when it made several) is answered at once — no idle gap, an agent
loop — with a scripted tool result of a few hundred tokens (a test log, a file). A reply that
made no call is kept as text and the result comes back as a user message, so the loop runs its
steps whatever the model says.

Modes, each server started for its run and stopped after it (run alone):

``session``      continuum serve, the transcript re-sent with ``X-Continuum-Session``: the
                 session verifies it and decodes only what is new; the generated calls stay
                 resident exactly as generated.
``chat``         continuum serve, stateless ``/v1/chat/completions``: the reuse stack's prefix
                 KV tier serves the longest common prefix it holds.
``responses``    continuum serve's Responses API: each call sends only the new items after
                 ``previous_response_id``; the stored chain's KV (its reply as generated) is
                 in the prefix KV tier.
``resend``       the Responses API the way Codex uses it: every item re-sent each call with a
                 ``prompt_cache_key``, which puts the loop on a resident session.
``llama-server`` llama.cpp's server (``--jinja``, prompt cache on, ``-fa off``), the transcript
                 replayed each call. It returns this model's bare-JSON calls as ``content`` (its
                 Qwen parser waits for ``<tool_call>`` tags), so the script parses them with
                 :func:`continuum.toolcalls.parse_tool_calls` and sends them back as
                 ``tool_calls``, as it does for continuum's.

Per step: prompt tokens the server evaluated (its own report: continuum's usage, llama-server's
``timings.prompt_n``), TTFT as the server reports it (continuum's ``ttft_ms``: request parsed to
first token, rendering and tier lookups included; llama-server's ``timings.prompt_ms``: prompt
processing to first token), and the step's wall time at the client (request sent to reply
read), and the bytes of each request body. Modes alternate run by run; medians per step.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench.http import _continuum, _free_port, _llama_server, _process
from continuum.bench.settings import PeerSettings
from continuum.settings import Names, setting
from continuum.toolcalls import parse_tool_calls

FORK_AT = 3  # after the loop: a branch from the reply of this step, then the main line again
FORK_ASK = "Before you go on: which test failed first? Answer in one line."
MODES = ("session", "chat", "responses", "resend", "llama-server")
_RESPONSES = ("responses", "resend")
SYSTEM = (
    "You are a coding agent working in a Python repository. Use the tools to inspect files "
    "and run tests; call one tool at a time and keep replies short."
)
TASK = "The CI build is failing in the billing package. Find the cause."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run the test suite of a package and return its log.",
            "parameters": {
                "type": "object",
                "properties": {"package": {"type": "string"}},
                "required": ["package"],
            },
        },
    },
]
NAMES = frozenset(t["function"]["name"] for t in TOOLS)  # type: ignore[index]
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]  # type: ignore[dict-item]


def tool_result(step: int, lines: int = 24) -> str:
    """A deterministic tool output of about 300 tokens: a test log for even steps, a source
    file for odd ones."""
    if step % 2 == 0:
        out = [f"$ pytest billing -q  # run {step}"]
        for i in range(lines - 2):
            verdict = "FAILED" if (i * 7 + step) % 11 == 0 else "PASSED"
            out.append(f"billing/tests/test_invoice_{step}_{i}.py::test_total_{i} {verdict}")
        out.append(f"== {lines // 11 + 1} failed, {lines - 3} passed in 0.{step}4s ==")
        return "\n".join(out)
    out = [f"# billing/invoice_{step}.py"]
    for i in range(lines - 1):
        out.append(f"def line_total_{i}(qty, price):  return round(qty * price * 1.{i:02d}, 2)")
    return "\n".join(out)


@dataclass(frozen=True, slots=True)
class _Server:
    """Where one run sends its requests, and how it reads each reply's cost."""

    url: str
    mode: str
    model: str


def _call_body(srv: _Server, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": srv.model,
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": "auto",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if srv.mode == "llama-server":
        body["cache_prompt"] = True
    return body


def _cost(srv: _Server, reply: dict[str, Any]) -> tuple[int, float]:
    """(prompt tokens evaluated, server TTFT ms) as the server reports them."""
    if srv.mode == "llama-server":
        t = reply["timings"]
        return int(t["prompt_n"]), float(t["prompt_ms"])
    c = reply["usage"]["continuum"]
    return int(c["prompt_tokens_evaluated"]), float(c["ttft_ms"])


def _next_messages(message: dict[str, Any], step: int) -> tuple[list[dict[str, Any]], bool]:
    """The reply as the transcript keeps it and the tool's answer to it; True if it called."""
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if not calls:
        content, parsed = parse_tool_calls(content, NAMES)
        calls = [c.to_openai() for c in parsed]
    if not calls:
        result = {"role": "user", "content": f"Tool output:\n{tool_result(step)}"}
        return [{"role": "assistant", "content": content}, result], False
    call = calls[0]
    assistant = {"role": "assistant", "content": content or None, "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": tool_result(step)}
    return [assistant, result], True


def agent_run(client: httpx.Client, srv: _Server, steps: int, max_tokens: int) -> dict[str, Any]:
    """One scripted loop of ``steps`` model calls."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    headers = {"content-type": "application/json"}
    if srv.mode == "session":
        sid = client.post(f"{srv.url}/v1/sessions", json={"system": SYSTEM}).json()["id"]
        headers["X-Continuum-Session"] = sid
    out: dict[str, Any] = {"evaluated": [], "prompt": [], "ttft_ms": [], "wall_ms": []}
    out["called"], out["completion"], out["wire_bytes"] = [], [], []
    branch: list[dict[str, Any]] = []
    for step in range(steps):
        reply, cost, raw = _chat_call(client, srv, messages, max_tokens, headers)
        out["wire_bytes"].append(raw)
        for key, value in cost.items():
            out[key].append(value)
        added, called = _next_messages(reply["choices"][0]["message"], step)
        out["called"].append(called)
        if step == FORK_AT - 1:
            branch = [*messages, added[0]]
        messages += added
    if srv.mode != "session" and steps > FORK_AT:  # a session is one line: a fork is an edit
        fork = [*branch, {"role": "user", "content": FORK_ASK}]
        out["fork"] = _chat_call(client, srv, fork, max_tokens, headers)[1]
        out["back"] = _chat_call(client, srv, messages, max_tokens, headers)[1]
    return out


def _chat_call(
    client: httpx.Client,
    srv: _Server,
    messages: list[dict[str, Any]],
    max_tokens: int,
    headers: dict[str, str],
) -> tuple[dict[str, Any], dict[str, float], int]:
    """One chat call: the reply, what it cost (evaluated, prompt, completion, TTFT, wall),
    and the request's bytes."""
    raw = json.dumps(_call_body(srv, messages, max_tokens))
    t0 = time.perf_counter()
    r = client.post(f"{srv.url}/v1/chat/completions", content=raw, headers=headers)
    wall = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    reply = r.json()
    evaluated, ttft = _cost(srv, reply)
    usage = reply.get("usage") or {}
    cost = {
        "evaluated": evaluated,
        "prompt": int(usage.get("prompt_tokens", 0)),
        "completion": int(usage.get("completion_tokens", 0)),
        "ttft_ms": ttft,
        "wall_ms": wall,
    }
    return reply, cost, len(raw)


def responses_run(
    client: httpx.Client, srv: _Server, steps: int, max_tokens: int
) -> dict[str, Any]:
    """The loop on the Responses API: ``responses`` sends only the new items after
    ``previous_response_id``; ``resend`` sends every item each step with a
    ``prompt_cache_key``, as Codex does."""
    history: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    new, prev, ids = list(history), None, []
    out: dict[str, Any] = {k: [] for k in ("evaluated", "prompt", "ttft_ms", "wall_ms")}
    out["called"], out["completion"], out["wire_bytes"], out["new_bytes"] = [], [], [], []
    for step in range(steps):
        if srv.mode == "responses":
            body = _responses_body(srv, new, prev, max_tokens)
        else:
            body = _responses_body(srv, history, None, max_tokens)
            body["prompt_cache_key"] = "bench-agent"
        reply, cost, raw = _responses_call(client, srv, body)
        for key, value in cost.items():
            out[key].append(value)
        out["wire_bytes"].append(raw)
        out["new_bytes"].append(len(json.dumps(new)))
        calls = [o for o in reply["output"] if o["type"] == "function_call"]
        out["called"].append(bool(calls))
        if calls:
            new = [
                {
                    "type": "function_call_output",
                    "call_id": calls[0]["call_id"],
                    "output": tool_result(step),
                }
            ]
        else:
            new = [{"role": "user", "content": f"Tool output:\n{tool_result(step)}"}]
        history += [*reply["output"], *new]
        prev = reply["id"]
        ids.append(prev)
    if srv.mode == "responses" and steps > FORK_AT:  # resend is a hinted session: one line
        ask = [{"role": "user", "content": FORK_ASK}]
        out["fork"] = _responses_call(
            client, srv, _responses_body(srv, ask, ids[FORK_AT - 1], max_tokens)
        )[1]
        out["back"] = _responses_call(client, srv, _responses_body(srv, new, prev, max_tokens))[1]
    return out


def _responses_body(
    srv: _Server, items: list[dict[str, Any]], prev: str | None, max_tokens: int
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": srv.model,
        "instructions": SYSTEM,
        "tools": FLAT_TOOLS,
        "input": items,
        "tool_choice": "auto",
        "max_output_tokens": max_tokens,
        "temperature": 0,
    }
    if prev is not None:
        body["previous_response_id"] = prev
    return body


def _responses_call(
    client: httpx.Client, srv: _Server, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float], int]:
    """One Responses call: the reply, what it cost, and the request's bytes."""
    raw = json.dumps(body)
    t0 = time.perf_counter()
    r = client.post(
        f"{srv.url}/v1/responses", content=raw, headers={"content-type": "application/json"}
    )
    wall = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    reply = r.json()
    c, usage = reply["usage"]["continuum"], reply["usage"]
    cost = {
        "evaluated": int(c["prompt_tokens_evaluated"]),
        "prompt": int(usage["input_tokens"]),
        "completion": int(usage["output_tokens"]),
        "ttft_ms": float(c["ttft_ms"]),
        "wall_ms": wall,
    }
    return reply, cost, len(raw)


class AgentConfig(PeerSettings):
    """What a ``bench agent`` run is told (its command line is generated from it)."""

    steps: int = setting(10, "Model calls in the tool loop.", ge=2, le=40)
    max_tokens: int = setting(48, "Most tokens in a reply.", ge=1)
    n_ctx: int = setting(8192, "Context size of each server.", ge=512)
    modes: Names | None = setting(
        None,
        "Comma-separated: session, chat, responses, resend, llama-server (default: all, "
        "llama-server when its path is given).",
    )


@contextmanager
def _serving(mode: str, cfg: AgentConfig, mf: ModelFile, n_threads: int) -> Iterator[_Server]:
    if mode == "llama-server":
        port = _free_port()
        peer = _llama_server(cfg.llama_server, mf, port, cfg.n_ctx, n_threads)
        with _process([*peer.args, "--jinja"], peer.health):
            yield _Server(peer.url, mode, "qwen")
        return
    with _continuum(cfg.model, cfg.n_ctx, cfg.threads) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        yield _Server(url, mode, model)


def run_agent(cfg: AgentConfig, progress: Progress | None = None) -> dict[str, Any]:
    mf = resolve_model(cfg.model)
    n_threads = LlamaConfig(n_threads=cfg.threads).threads()[0]
    steps, max_tokens, reps, llama_server = cfg.steps, cfg.max_tokens, cfg.reps, cfg.llama_server
    ours = ("session", "chat", "responses", "resend")
    chosen = cfg.modes or ours + (("llama-server",) if llama_server else ())
    bad = [m for m in chosen if m not in MODES]
    if bad or ("llama-server" in chosen and not llama_server):
        raise ValueError(f"modes must be among {MODES} (llama-server needs its path): {bad}")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in chosen}
    total, done = reps * len(chosen), 0
    with httpx.Client(timeout=600) as client:
        for rep in range(reps):
            order = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]
            for mode in order:
                if progress:
                    progress(f"run {rep + 1}/{reps}: {mode}", done, total)
                run_one = responses_run if mode in _RESPONSES else agent_run
                with _serving(mode, cfg, mf, n_threads) as srv:
                    runs[mode].append(run_one(client, srv, steps, max_tokens))
                done += 1
    if progress:
        progress("done", total, total)
    return {
        "experiment": "agent",
        "model_digest": mf.digest,
        "machine": {"model_path": str(mf.path), "n_threads": n_threads},
        "n_threads": n_threads,
        "n_ctx": cfg.n_ctx,
        "reps": reps,
        "steps": steps,
        "max_tokens": max_tokens,
        "rows": _rows(runs),
        "runs": runs,
    }


def _median_per_step(rs: list[dict[str, Any]], key: str) -> list[float]:
    return [statistics.median(x) for x in zip(*(r[key] for r in rs), strict=True)]


def _rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    rows = []
    for mode, rs in runs.items():
        rows.append(
            {
                "mode": mode,
                "ttft_ms": _median_per_step(rs, "ttft_ms"),
                "wall_ms": _median_per_step(rs, "wall_ms"),
                "evaluated": _median_per_step(rs, "evaluated"),
                "prompt": _median_per_step(rs, "prompt"),
                "completion": _median_per_step(rs, "completion"),
                "calls": sum(rs[0]["called"]),
                "wire_bytes": rs[0]["wire_bytes"],
                "new_bytes": rs[0].get("new_bytes"),
            }
        )
        rows[-1].update({k: _median_probe(rs, k) for k in ("fork", "back") if k in rs[0]})
    return rows


def _median_probe(rs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """The median of each figure of a probe call (the fork, or the call back on the main line)."""
    return {f: statistics.median(r[key][f] for r in rs) for f in rs[0][key]}


def format_table(r: dict[str, Any]) -> str:
    rows = {row["mode"]: row for row in r["rows"]}
    steps = r["steps"]
    lines = [
        f"agent · {Path(r['machine']['model_path']).name} · {steps}-step tool loop · "
        f"{r['n_threads']} threads · n_ctx {r['n_ctx']} · "
        f"median of {r['reps']} · no idle gap",
        "",
        "| step | prompt tokens | "
        + " | ".join(f"{m} evaluated | {m} TTFT | {m} wall" for m in rows)
        + " |",
        "|---|---|" + "---|---|---|" * len(rows),
    ]
    first = next(iter(rows.values()))
    for i in range(steps):
        cells = [
            f"{row['evaluated'][i]:,.0f} | {row['ttft_ms'][i]:.0f} ms | {row['wall_ms'][i]:.0f} ms"
            for row in rows.values()
        ]
        lines.append(f"| {i + 1} | {first['prompt'][i]:,.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    for mode, row in rows.items():
        lines.append(
            f"{mode}: {row['calls']}/{steps} steps made a tool call; "
            f"completion tokens per step {', '.join(f'{x:.0f}' for x in row['completion'])}; "
            f"wire bytes {sum(row.get('wire_bytes', [])):,}"
        )
    if "responses" in rows and "llama-server" in rows and rows["responses"].get("wire_bytes"):
        mine, peer = rows["responses"]["wire_bytes"], rows["llama-server"]["wire_bytes"]
        worst = max(a / b for a, b in zip(mine[1:], peer[1:], strict=True))
        lines.append(
            f"responses vs llama-server, wire bytes per step 2-{steps}: at most "
            f"{100 * worst:.1f}% of the full replay's"
        )
        floor = rows["responses"].get("new_bytes")
        if floor:
            lines.append(
                f"  at step {steps}: {mine[-1]:,} bytes ({floor[-1]:,} of them the new items, "
                f"{100 * floor[-1] / peer[-1]:.1f}% of the replay's {peer[-1]:,}; the rest "
                "instructions and tools, which a Responses request carries each time)"
            )
    for mode, row in rows.items():
        if "fork" in row:
            f, b = row["fork"], row["back"]
            lines.append(
                f"{mode}: fork from step {FORK_AT}: {f['evaluated']:,.0f} of {f['prompt']:,.0f} "
                f"prompt tokens evaluated, TTFT {f['ttft_ms']:.0f} ms; back on the main line "
                f"(step {steps + 1}): {b['evaluated']:,.0f} of {b['prompt']:,.0f}, TTFT "
                f"{b['ttft_ms']:.0f} ms"
            )
    for ours in ("session", "chat", "responses", "resend"):
        if ours in rows and "llama-server" in rows and steps >= 3:
            o, p = rows[ours], rows["llama-server"]
            ttft = statistics.fmean(p["ttft_ms"][2:]) / statistics.fmean(o["ttft_ms"][2:])
            wall = statistics.fmean(p["wall_ms"][2:]) / statistics.fmean(o["wall_ms"][2:])
            lines.append(
                f"{ours} vs llama-server, steps 3-{steps}: {ttft:.2f}x TTFT, {wall:.2f}x wall"
            )
    return "\n".join(lines)


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """The agent loop's section of ``bench report``, and the goals it missed."""
    by = {r["mode"]: r for r in data["rows"]}
    cmd = f"continuum bench agent --reps {data['reps']} --steps {data['steps']}"
    cmd += " --llama-server PATH" if "llama-server" in by else ""
    model = Path(data["machine"]["model_path"]).name
    lines += ["## Agent tool loop", "", f"Model {model}. Command: `{cmd}`", ""]
    lines += [*format_table(data).splitlines(), "", "![agent](agent.png)", ""]
    peer = by.get("llama-server")
    mine = by.get("responses")
    if mine is not None and peer is not None and mine.get("wire_bytes"):
        share = 100 * mine["wire_bytes"][-1] / peer["wire_bytes"][-1]
        floor = mine.get("new_bytes") or [0]
        if share > 5:
            misses.append(
                f"Agent loop (responses): {share:.1f}% of llama-server's full-replay wire bytes "
                f"at step {data['steps']} (goal 5% per step). The new tool result alone is "
                f"{100 * floor[-1] / peer['wire_bytes'][-1]:.1f}% of the replay there: no "
                "protocol sends less than what is new, so the goal holds only in longer loops; "
                "the rest is the tools and instructions a Responses request carries each call."
            )
    for mode in ("session", "chat", "responses", "resend"):
        row = by.get(mode)
        if row is None or peer is None or data["steps"] < 3:
            continue
        ratio = statistics.fmean(peer["ttft_ms"][2:]) / statistics.fmean(row["ttft_ms"][2:])
        if ratio < 1.5:
            misses.append(
                f"Agent loop ({mode}): {ratio:.2f}x llama-server's TTFT from step 3 on (goal "
                "1.5x). In one loop every server decodes only the new messages (llama-server's "
                "prompt cache keeps a single conversation's transcript); what is left is each "
                "tool result's prefill, which no cache avoids, at the same speed on both."
            )
