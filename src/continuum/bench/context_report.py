"""The report's section on the one context: what a server holds in RAM (``bench memory``), what
a long stateless request does to sessions generating (``bench interference``), and what the
sessions of one agent decode when they open with one system prompt (``bench shared-prefix``),
each with its goal, and a line under "where we lose" for every goal a result misses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from continuum.bench.interference import interference_table
from continuum.bench.memory import memory_table
from continuum.bench.shared_prefix import shared_prefix_table
from continuum.errors import InvalidRequest

MEMORY_GOAL = 1.1  # continuum serve's RSS over llama-server's (its default, least-memory mode)
INTERFERENCE_GOAL = 2.0  # the sessions' inter-token p99 during the request over their p50
SHARED_TTFT_GOAL = 0.1  # the last session's first TTFT over a cold prefill's


def _memory(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    rows = {r["mode"]: r for r in data["rows"]}
    modes = ",".join(rows)
    lines += [
        f"Command: `continuum bench memory -m {data['model']} -t {data['threads']} --reps "
        f"{data['reps']} --n-ctx {data['n_ctx_per_slot']} --modes {modes} --llama-server "
        "<llama-server>`",
        "",
        memory_table(data),
        "",
    ]
    ours, peer = rows.get("continuum"), rows.get("llama-server")
    if ours is None or peer is None:
        return
    ratio = ours["rss_mb"] / peer["rss_mb"]
    if ratio > MEMORY_GOAL:
        full = rows.get("llama-server-swa-full")
        beside = f" ({ours['rss_mb'] / full['rss_mb']:.2f}x its --swa-full mode)" if full else ""
        misses.append(
            f"memory, {data['model']}: continuum serve holds {ours['rss_mb']:,} MB, "
            f"{ratio:.2f}x llama-server's {peer['rss_mb']:,} MB (goal <= {MEMORY_GOAL}x){beside}"
        )


def _interference(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    args = [
        f"-m {data['model']} -t {data['threads']} --reps {data['reps']}",
        f"--sessions {data['sessions']} --prompt-tokens {data['prompt_tokens']}",
        f"--reply-tokens {data['reply_tokens']}",
        *(f"--compare {r['mode']}=<continuum of that commit>" for r in data["rows"][1:]),
    ]
    lines += [
        f"Command: `continuum bench interference {' '.join(args)}`",
        "",
        interference_table(data),
        "",
    ]
    for r in data["rows"]:
        if r["mode"] == "continuum" and r["ratio"] > INTERFERENCE_GOAL:
            misses.append(
                f"interference, {data['model']}: the sessions' inter-token p99 during a "
                f"{data['prompt_tokens']}-token stateless request is {r['ratio']:.2f}x their "
                f"p50 (goal <= {INTERFERENCE_GOAL}x)"
            )


def _shared(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    lines += [
        f"Command: `continuum bench shared-prefix -m {data['model']} -t {data['threads']} "
        f"--reps {data['reps']} --sessions {data['sessions']} --system-tokens "
        f"{data['system_tokens']}`",
        "",
        shared_prefix_table(data),
        "",
    ]
    last, cold = data["rows"][-1], data["cold"]
    if last["ttft_ms"] > SHARED_TTFT_GOAL * cold["ttft_ms"]:
        misses.append(
            f"shared-prefix, {data['model']}: session {last['session']}'s first TTFT is "
            f"{last['ttft_ms'] / cold['ttft_ms']:.2f}x a cold prefill's (goal <= "
            f"{SHARED_TTFT_GOAL}x)"
        )


def report_context(lines: list[str], misses: list[str], results: Path) -> None:
    found = [
        (path, json.loads(path.read_text()))
        for pattern in ("memory*.json", "interference*.json", "shared_prefix*.json")
        for path in sorted(results.glob(pattern))
    ]
    if not found:
        return
    lines += [
        "## One context",
        "",
        "`continuum serve` holds one llama.cpp context laid out in lanes (`--parallel`, default "
        "4): sessions are resident in lanes and every stateless request is lent one, its "
        "decodes riding in the same batch steps. Goals: RSS at most "
        f"{MEMORY_GOAL}x llama-server's with as many slots of as many cells; the sessions' "
        f"inter-token p99 during a 2k-token stateless request at most {INTERFERENCE_GOAL}x "
        "their p50; a new session of an agent whose prompt another session holds decodes only "
        f"its own message, its first TTFT at most {SHARED_TTFT_GOAL}x a cold prefill's.",
        "",
    ]
    for path, data in found:
        render = _SECTIONS.get(str(data.get("experiment")))
        if render is None:
            raise InvalidRequest(f"{path}: not a memory, interference or shared-prefix result")
        render(lines, misses, data)


_SECTIONS: dict[str, Callable[[list[str], list[str], dict[str, Any]], None]] = {
    "memory": _memory,
    "interference": _interference,
    "shared_prefix": _shared,
}
