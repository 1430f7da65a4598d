"""``continuum bench agents-paused``: more agents than lanes, each pausing while its tools run.

M agents (:mod:`continuum.bench.agent_trace`: one seeded trace for every server) share a server
with 4 lanes. Every call sends the whole transcript over Chat Completions, streamed, greedy: a
system prompt every agent shares (the framework's instructions), the agent's task, then for
each step the model's reply and the tool's output as a user message (the replies are text: no
tools are declared, so both servers see the same messages and no parser stands between them).
While an agent waits for its tool, the server serves the others and may park its KV.

Servers, each started for its run and stopped after it (run alone), modes alternated run by run:

``continuum``            ``continuum serve --parallel 4``; each request carries the agent's
                         ``prompt_cache_key`` (as Codex sends it), which keeps the agent on a
                         resident session: parked to a RAM snapshot (disk below it) while
                         paused when a lane is needed, restored when it returns.
``continuum-las``        the same with ``--prefill-share las``: the agent with the least
                         attained service (the shortest conversation so far) first in each
                         step, instead of the oldest request (Autellix's program-level rule).
``continuum-age``        the same with ``--lane-order age --prefill-share age``: the agent
                         that started first gets a freed lane and a step's prompt room first
                         (program-level first come, first served), instead of the turn
                         waiting longest and the oldest request.
``continuum-arrival``    the same with ``--lane-order arrival`` (the turn waiting longest).
``continuum-lru``        the same with ``--park-policy lru``: the least recently used session is
                         parked for a lane, instead of the one cheapest to bring back per
                         second of lane it frees (issue 38's rule against the one before it).
``continuum-stateless``  the same server, no key: the stateless path (lanes lent per request,
                         a tenant's leftovers and parked prefixes as its KV sources).
``llama-server``         ``-np 4`` (4 slots of ``n_ctx`` cells), ``--cache-ram`` (its host-memory
                         prompt cache: a slot's prompt is saved there when another request
                         takes the slot, and restored when it comes back), ``cache_prompt``,
                         ``-fa off``, ``--jinja``.

Per agent: job completion time (its first request sent to its last reply read). Per call: TTFT
at the client, and where the call's history KV came from: continuum's own report (``resident``
in a lane, a ``ram`` or ``disk`` snapshot, ``re-prefill``); llama-server's ``timings`` say only
how many prompt tokens it reused (``cache_n``), so a call is ``reused`` (a slot or its RAM
cache) or ``re-prefill``. A paused agent's KV *survived* when the call after the pause
evaluated no more than its new tokens (the tool output, the reply's end and the template's
glue: ``SLACK`` tokens); ``re-prefilled`` counts the tokens evaluated beyond those.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.agent_trace import AgentTrace, TraceShape, make_trace, tool_output
from continuum.bench.concurrent import percentiles
from continuum.bench.http import _free_port, _process, serve_command
from continuum.bench.http_client import sse
from continuum.errors import InvalidRequest

MODES = (
    "continuum",
    "continuum-las",
    "continuum-age",
    "continuum-arrival",
    "continuum-lru",
    "continuum-stateless",
    "llama-server",
)
_KEYED = ("continuum", "continuum-las", "continuum-age", "continuum-arrival", "continuum-lru")
_OPT_IN = ("continuum-las", "continuum-age", "continuum-arrival", "continuum-lru")  # when named
LANES = 4
_LANE_ORDER = {
    "continuum-age": ("--lane-order", "age"),
    "continuum-arrival": ("--lane-order", "arrival"),
}
SLACK = 64  # tokens a returning call may evaluate beyond its new ones and still count as reused
SYSTEM = (
    "You are a coding agent working in a Python repository. You run tools (tests, file reads, "
    "builds); their output comes back to you as a message. After each output, say in one or "
    "two short sentences what it shows and which tool you run next. Keep every reply short.\n"
    "Rules: do not repeat tool output back; name files by their path; when every test passes, "
    "say DONE and summarise the fix in one sentence."
)


def task(agent: int) -> str:
    return (
        f"Task {agent + 1}: the test suite of package agent_{agent} fails after the last merge. "
        "Find the failing tests and the module that causes them."
    )


def chat_body(
    model: str, messages: list[dict[str, str]], max_tokens: int, key: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if key is not None:
        body["prompt_cache_key"] = key
    return body


def kv_source(mode: str, last: dict[str, Any], history: int) -> tuple[str, int]:
    """(where the call's history KV came from, prompt tokens evaluated) from the server's report;
    ``history``: the tokens of the transcript the agent sent last time, with its reply."""
    if mode == "llama-server":
        t = last.get("timings") or {}
        evaluated = int(t.get("prompt_n", 0))
        return (
            "reused" if int(t.get("cache_n", 0)) + SLACK >= history else "re-prefill"
        ), evaluated
    c = (last.get("usage") or {}).get("continuum") or {}
    evaluated = int(c.get("prompt_tokens_evaluated", 0))
    tier = c.get("hit_tier")
    if tier == "prefix_kv":
        return "resident", evaluated
    if tier == "layer_kv":
        src = next((t.get("source") for t in c.get("tiers", ()) if t["tier"] == "layer_kv"), "")
        return (src or "ram"), evaluated
    return ("re-prefill" if tier == "cold" else str(tier)), evaluated


def agent_loop(
    url: str, mode: str, model: str, plan: AgentTrace, max_tokens: int, t0: float
) -> list[dict[str, Any]]:
    """Run one agent's trace from ``t0`` (``time.perf_counter()`` of the run's start)."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task(plan.agent)},
    ]
    key = f"agent-{plan.agent}" if mode in _KEYED else None
    calls: list[dict[str, Any]] = []
    history = 0
    time.sleep(max(0.0, t0 + plan.start_s - time.perf_counter()))
    with httpx.Client(timeout=1800) as client:
        for k, step in enumerate(plan.steps):
            if k:
                output = tool_output(plan.agent, k, step.result_tokens)
                messages.append({"role": "user", "content": f"Tool output:\n{output}"})
            sent = time.perf_counter()
            ttft, text, last = sse(
                client, f"{url}/v1/chat/completions", chat_body(model, messages, max_tokens, key)
            )
            done = time.perf_counter()
            usage = last.get("usage") or {}
            prompt, completion = (
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
            )
            source, evaluated = kv_source(mode, last, history)
            calls.append(
                {
                    "step": k,
                    "sent_s": sent - t0,
                    "done_s": done - t0,
                    "ttft_ms": ttft,
                    "prompt": prompt,
                    "completion": completion,
                    "evaluated": evaluated,
                    "new": prompt - history if k else prompt,
                    "source": source if k else "first",
                }
            )
            history = prompt + completion
            messages.append({"role": "assistant", "content": text})
            if step.pause_s:
                time.sleep(step.pause_s)
    return calls


def _command(mode: str, cfg: dict[str, Any], port: int, tmp: str) -> list[str]:
    threads = str(cfg["threads"])
    if mode.startswith("continuum"):
        return serve_command(
            cfg["model_path"],
            port,
            threads,
            cfg["n_ctx"],
            Path(tmp) / "h.db",
            "--parallel",
            str(LANES),
            "--max-queue",
            str(4 * cfg["agents"] + 4),
            "--prefill-share",
            {"continuum-las": "las", "continuum-age": "age"}.get(mode, "oldest"),
            "--park-policy",
            "lru" if mode == "continuum-lru" else "price",
            "--snapshot-ram",
            str(cfg["snapshot_ram_mb"]),
            *_LANE_ORDER.get(mode, ()),
        )
    return [
        str(cfg["llama_server"]),
        "-m",
        str(cfg["model_path"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(cfg["n_ctx"] * LANES),
        "-np",
        str(LANES),
        "-t",
        threads,
        "-tb",
        threads,
        "-fa",
        "off",
        "--swa-full",
        "--jinja",
        "--cache-ram",
        str(cfg["cache_ram_mb"]),
    ]


def run_mode(mode: str, trace: Sequence[AgentTrace], cfg: dict[str, Any]) -> dict[str, Any]:
    """One run of the whole trace against a server started for it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        _process(_command(mode, cfg, port, tmp), f"{url}/health"),
    ):
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        results: list[list[dict[str, Any]]] = [[] for _ in trace]
        errors: list[BaseException] = []
        t0 = time.perf_counter() + 0.5

        def run(i: int) -> None:
            try:
                results[i] = agent_loop(url, mode, model, trace[i], cfg["max_tokens"], t0)
            except BaseException as e:  # reported after the run: one agent's error fails it
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(trace))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    return summarise(mode, results)


def summarise(mode: str, agents: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """A run's figures: job completion times, TTFT by KV source, survival and re-prefill."""
    jct = [calls[-1]["done_s"] - calls[0]["sent_s"] for calls in agents]
    returning = [c for calls in agents for c in calls if c["step"]]
    by_source: dict[str, list[float]] = {}
    for c in returning:
        by_source.setdefault(c["source"], []).append(c["ttft_ms"])
    extra = [max(0, c["evaluated"] - c["new"]) for c in returning]
    p50, p95 = percentiles(jct)
    return {
        "mode": mode,
        "jct_s_p50": p50,
        "jct_s_p95": p95,
        "ttft_ms_p50": percentiles([c["ttft_ms"] for c in returning])[0],
        "ttft_by_source": {
            s: {"calls": len(v), "p50": percentiles(v)[0], "p95": percentiles(v)[1]}
            for s, v in sorted(by_source.items())
        },
        "survived": sum(e <= SLACK for e in extra),
        "returns": len(returning),
        "reprefilled_tokens": sum(e for e in extra if e > SLACK),
        "evaluated_tokens": sum(c["evaluated"] for calls in agents for c in calls),
        "agents": agents,
    }


@dataclass(frozen=True)
class PausedPlan:
    """What one ``bench agents-paused`` call runs: the trace (``shape``, ``seed``) at each agent
    count, against which servers, how many times."""

    model: str | None = None
    agents: tuple[int, ...] = (16,)
    reps: int = 3
    threads: int | None = None
    max_tokens: int = 32
    shape: TraceShape = field(default_factory=TraceShape)
    seed: int = 0
    llama_server: str | None = None
    cache_ram_mb: int = 8192  # llama-server's --cache-ram (its default)
    snapshot_ram_mb: int = 512  # continuum serve's --snapshot-ram (its default)
    modes: tuple[str, ...] = ()  # () : every mode (llama-server when its path is given)

    def chosen(self) -> list[str]:
        chosen = list(self.modes) or [
            m for m in MODES if m not in _OPT_IN and (m != "llama-server" or self.llama_server)
        ]
        bad = [m for m in chosen if m not in MODES]
        if bad or ("llama-server" in chosen and not self.llama_server):
            raise InvalidRequest(
                f"modes must be among {', '.join(MODES)} (llama-server needs --llama-server): "
                f"{', '.join(bad) or 'llama-server'}"
            )
        if not self.agents or min(self.agents) < 1:
            raise InvalidRequest(f"agent counts must be >= 1, got {self.agents}")
        return chosen


def run_agents_paused(plan: PausedPlan, progress: Progress | None = None) -> dict[str, Any]:
    mf = resolve_model(plan.model)
    chosen, shape = plan.chosen(), plan.shape
    cfg: dict[str, Any] = {
        "threads": LlamaConfig(n_threads=plan.threads).threads()[0],
        "model_path": mf.path,
        "llama_server": plan.llama_server,
        "cache_ram_mb": plan.cache_ram_mb,
        "snapshot_ram_mb": plan.snapshot_ram_mb,
        "max_tokens": plan.max_tokens,
    }
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {}
    total, done = len(plan.agents) * plan.reps * len(chosen), 0
    for m in plan.agents:
        trace = make_trace(m, shape, plan.seed)
        longest = max(sum(s.result_tokens for s in a.steps) for a in trace)
        # the longest transcript, with room for the replies and the prompt: 256-rounded
        need = int(1.3 * longest) + shape.steps[1] * (plan.max_tokens + 40) + 1024
        cfg.update(agents=m, n_ctx=-(-need // 256) * 256)
        runs[m] = {mode: [] for mode in chosen}
        for rep in range(plan.reps):
            order = chosen[rep % len(chosen) :] + chosen[: rep % len(chosen)]
            for mode in order:
                if progress:
                    progress(f"{m} agents, run {rep + 1}/{plan.reps}: {mode}", done, total)
                runs[m][mode].append(run_mode(mode, trace, cfg))
                done += 1
    if progress:
        progress("done", total, total)
    return {
        "experiment": "agents-paused",
        "model_digest": mf.digest,
        "machine": {"model_path": str(mf.path), "n_threads": cfg["threads"]},
        "shape": {
            "steps": shape.steps,
            "result_tokens": shape.result_tokens,
            "pause_median_s": shape.pause_median_s,
            "pause_p90_s": shape.pause_p90_s,
            "stagger_s": shape.stagger_s,
            "seed": plan.seed,
        },
        "lanes": LANES,
        "reps": plan.reps,
        "max_tokens": plan.max_tokens,
        "cache_ram_mb": plan.cache_ram_mb,
        "snapshot_ram_mb": plan.snapshot_ram_mb,
        "rows": [_row(m, mode, rs) for m, by in runs.items() for mode, rs in by.items()],
        "runs": {str(m): by for m, by in runs.items()},
    }


def _row(agents: int, mode: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians over a mode's runs."""

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rs))

    sources = sorted({s for r in rs for s in r["ttft_by_source"]})
    return {
        "agents": agents,
        "mode": mode,
        "jct_s_p50": med("jct_s_p50"),
        "jct_s_p95": med("jct_s_p95"),
        "ttft_ms_p50": med("ttft_ms_p50"),
        "survived_share": statistics.median(r["survived"] / r["returns"] for r in rs),
        "reprefilled_tokens": med("reprefilled_tokens"),
        "evaluated_tokens": med("evaluated_tokens"),
        "ttft_by_source": {
            s: {
                "calls": statistics.median(
                    r["ttft_by_source"].get(s, {}).get("calls", 0) for r in rs
                ),
                "p50": statistics.median(
                    r["ttft_by_source"][s]["p50"] for r in rs if s in r["ttft_by_source"]
                ),
            }
            for s in sources
        },
    }


def format_table(r: dict[str, Any]) -> str:
    sh = r["shape"]
    lines = [
        f"agents-paused · {Path(r['machine']['model_path']).name} · {r['lanes']} lanes · "
        f"{r['machine']['n_threads']} threads · {sh['steps'][0]}-{sh['steps'][1]} calls an "
        f"agent · tool outputs {sh['result_tokens'][0]}-{sh['result_tokens'][1]} tokens · "
        f"pauses log-normal, median {sh['pause_median_s']:g} s, 10% over "
        f"{sh['pause_p90_s']:g} s · seed {sh['seed']} · median of {r['reps']}",
        "",
        "| agents | server | job time p50 | job time p95 | TTFT p50 | KV survived the pause "
        "| tokens re-prefilled | tokens evaluated | TTFT p50 by KV source (calls) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r["rows"]:
        src = ", ".join(
            f"{s} {v['p50']:,.0f} ms ({v['calls']:.0f})" for s, v in row["ttft_by_source"].items()
        )
        lines.append(
            f"| {row['agents']} | {row['mode']} | {row['jct_s_p50']:.1f} s | "
            f"{row['jct_s_p95']:.1f} s | {row['ttft_ms_p50']:,.0f} ms | "
            f"{row['survived_share']:.0%} | {row['reprefilled_tokens']:,.0f} | "
            f"{row['evaluated_tokens']:,.0f} | {src} |"
        )
    return "\n".join(lines)
