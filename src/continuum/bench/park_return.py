"""``continuum bench park-return``: a returning agent's first token, by where its KV waited.

``bench agents-paused`` cannot show what a return from a snapshot costs: under its load, a
parked agent waits for a lane, and the queue sets its first token. This isolates the return.
One ``continuum serve --parallel 1`` (one lane, so a second session parks the first), and one
agent transcript — the agents-paused system prompt and task, an earlier tool output of
``history`` tokens, its reply — then, after a tool pause (``pause_s``), a tool output of each
size, sent three ways, the order rotated rep by rep (each way on a session key of its own, so no
way leaves KV to another):

``resident``    the agent's previous reply has just ended on the lane and nothing came between.
``ram``         another agent used the lane during the pause (the pause is the longer of the
                two), so this one was parked to a RAM snapshot: its call restores it (parking
                the other).
``re-prefill``  the same transcript, sent whole under a new key: the server has no KV of it.

The ``resident`` and ``ram`` calls' KV source is the server's own report (``usage.continuum``),
kept beside the figures; every way reports the prompt tokens the server evaluated.
Issue 38's goal: ``ram`` ≤ 2× ``resident``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.agent_trace import tool_output
from continuum.bench.agents_paused import SYSTEM, chat_body, kv_source, task
from continuum.bench.http import _free_port, _process, serve_command
from continuum.bench.http_client import sse
from continuum.errors import InvalidRequest

WAYS = ("resident", "ram", "re-prefill")
MAX_TOKENS = 8
# the agent's reply to its first tool output, in the re-prefill way's transcript (the other ways
# have the model's own: its length is about the same, MAX_TOKENS)
EARLIER_REPLY = "The log shows two failures in module_3. I read module_3.py next."


@dataclass(frozen=True)
class ReturnPlan:
    model: str | None = None
    sizes: tuple[int, ...] = (200, 1000, 2000)  # tokens of the returning call's tool output
    history: int = 2000  # tokens of the earlier tool output already in the transcript
    pause_s: float = 2.0  # the agent's tool time between its reply and its return
    reps: int = 3
    threads: int | None = None

    def check(self) -> None:
        if not self.sizes or min(self.sizes) < 1:
            raise InvalidRequest(f"tool output sizes must be >= 1 token, got {self.sizes}")
        if self.history < 0:
            raise InvalidRequest(f"history must be >= 0 tokens, got {self.history}")
        if not 0 <= self.pause_s <= 600:
            raise InvalidRequest(f"the pause must be 0-600 seconds, got {self.pause_s}")
        if self.reps < 1:
            raise InvalidRequest(f"reps must be >= 1, got {self.reps}")


class _Agent:
    """One agent's transcript on one session key."""

    def __init__(self, client: httpx.Client, url: str, model: str, key: str) -> None:
        self.client, self.url, self.model, self.key = client, url, model, key
        self.messages: list[dict[str, str]] = []

    def call(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body = chat_body(self.model, messages, MAX_TOKENS, self.key)
        ttft, text, last = sse(self.client, f"{self.url}/v1/chat/completions", body)
        self.messages = [*messages, {"role": "assistant", "content": text}]
        return {"ttft_ms": ttft, "last": last}


def opening(agent: int, history: int) -> list[dict[str, str]]:
    """The transcript before the return: agent ``agent``'s task and first tool output (each
    agent's own text, so that no call is the result memo's answer to another's)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task(agent)}]
    if history:
        output = tool_output(agent, 0, history)
        messages.append({"role": "user", "content": "Tool output:\n" + output})
    return messages


def returning(agent: int, before: list[dict[str, str]], size: int) -> list[dict[str, str]]:
    output = tool_output(agent, 1, size)
    return [*before, {"role": "user", "content": "Tool output:\n" + output}]


def one_return(
    client: httpx.Client, url: str, model: str, way: str, n: int, size: int, plan: ReturnPlan
) -> dict[str, Any]:
    """The returning call of agent ``n`` (``n + 1`` is the other, in the ``ram`` way), its KV
    kept ``way``: TTFT, source, tokens evaluated."""
    tag, history = f"{n}-{size}", plan.history
    agent = _Agent(client, url, model, f"{way}-{tag}")
    if way == "re-prefill":  # the whole transcript is new to the server: no KV of it anywhere
        before = [*opening(n, history), {"role": "assistant", "content": EARLIER_REPLY}]
        got = agent.call(returning(n, before, size))
        return {"ttft_ms": got["ttft_ms"], "source": "re-prefill", "evaluated": _evaluated(got)}
    first = agent.call(opening(n, history))
    usage = first["last"]["usage"]
    prior = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
    messages = returning(n, agent.messages, size)
    paused = time.perf_counter()
    if way == "ram":  # another agent takes the one lane while this one's tool runs: parked
        _Agent(client, url, model, f"other-{tag}").call(opening(n + 1, history))
    time.sleep(max(0.0, paused + plan.pause_s - time.perf_counter()))
    got = agent.call(messages)
    source, evaluated = kv_source("continuum", got["last"], prior)
    return {"ttft_ms": got["ttft_ms"], "source": source, "evaluated": evaluated}


def _evaluated(call: dict[str, Any]) -> int:
    return kv_source("continuum", call["last"], 0)[1]


def run_park_return(plan: ReturnPlan, progress: Progress | None = None) -> dict[str, Any]:
    plan.check()
    mf = resolve_model(plan.model)
    threads = LlamaConfig(n_threads=plan.threads).threads()[0]
    need = int(1.3 * (plan.history + max(plan.sizes))) + 1024
    n_ctx = -(-need // 256) * 256
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    calls: dict[int, dict[str, list[dict[str, Any]]]] = {
        s: {w: [] for w in WAYS} for s in plan.sizes
    }
    total, done = len(plan.sizes) * plan.reps * len(WAYS), 0
    with (
        tempfile.TemporaryDirectory() as tmp,
        _process(
            serve_command(mf.path, port, threads, n_ctx, Path(tmp) / "h.db", "--parallel", "1"),
            f"{url}/health",
        ),
        httpx.Client(timeout=600) as client,
    ):
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        for size in plan.sizes:
            for rep in range(plan.reps):
                order = WAYS[rep % 3 :] + WAYS[: rep % 3]
                for way in order:
                    if progress:
                        progress(f"{size} tokens, rep {rep + 1}: {way}", done, total)
                    got = one_return(client, url, model, way, 2 * done, size, plan)
                    calls[size][way].append(got)
                    done += 1
    if progress:
        progress("done", total, total)
    return {
        "experiment": "park-return",
        "model_digest": mf.digest,
        "machine": {"model_path": str(mf.path), "n_threads": threads},
        "history": plan.history,
        "pause_s": plan.pause_s,
        "reps": plan.reps,
        "rows": [_row(size, calls[size]) for size in plan.sizes],
        "calls": {str(s): c for s, c in calls.items()},
    }


def _row(size: int, by_way: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"tool_tokens": size}
    for way, got in by_way.items():
        row[f"{way}_ms"] = statistics.median(c["ttft_ms"] for c in got)
        row[f"{way}_sources"] = sorted({c["source"] for c in got})
        row[f"{way}_evaluated"] = statistics.median(c["evaluated"] for c in got)
    row["ram_over_resident"] = row["ram_ms"] / row["resident_ms"]
    return row


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"Model: {Path(result['machine']['model_path']).name}, {result['machine']['n_threads']} "
        f"threads; transcript before the return: the task and a {result['history']}-token tool "
        f"output; the return sent {result['pause_s']:g} s after the reply, or when the other "
        f"agent's call ends if later; medians of {result['reps']}; continuum serve --parallel 1",
        "",
        "| tool output tokens | resident TTFT | from a RAM snapshot | RAM / resident | "
        "re-prefill TTFT | evaluated (resident / RAM / re-prefill) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tool_tokens']} | {r['resident_ms']:.0f} ms | {r['ram_ms']:.0f} ms | "
            f"{r['ram_over_resident']:.2f}x | {r['re-prefill_ms']:.0f} ms | "
            f"{r['resident_evaluated']:.0f} / {r['ram_evaluated']:.0f} / "
            f"{r['re-prefill_evaluated']:.0f} |"
        )
    return "\n".join(lines)


__all__ = ["WAYS", "ReturnPlan", "format_table", "one_return", "run_park_return"]
