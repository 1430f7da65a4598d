"""``continuum bench speculative --agents N``: the same tasks as several agents at once, in the
batch steps the server's lanes decode them in, with drafts from each reply's context and
without.

Agent ``i`` replies to task ``i mod len(tasks)`` on lane ``i`` of a context with a KV stream per
lane, and every agent's reply is submitted at once to a
:class:`~continuum.backends.batching.BatchScheduler` on it (their prompts prefill in the first
steps, as concurrent requests' do). Each repetition runs both modes, alternating which goes
first. Per agent, the decode rate is its generated tokens over the time from its first token to
its last; per run, the throughput is every agent's generated tokens over the time from the first
first token to the last reply's end. Medians are reported, with the share of drafted tokens
kept, the calls that verified drafts, and whether each agent's reply is the same tokens in both
modes (greedy).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from continuum.backends.base import GenOut
from continuum.backends.batching import BatchScheduler
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile
from continuum.backends.progress import Progress
from continuum.backends.step_plan import Program
from continuum.bench.machine import cpu
from continuum.params import GenerationParams

MODES = ("draft", "plain")


def run_batched(
    mf: ModelFile,
    threads: int | None,
    counts: Sequence[int],
    tasks: dict[str, list[dict[str, str]]],
    max_draft: int,
    each_rep: Sequence[GenerationParams],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """For each agent count in ``counts``, that many replies at once to ``tasks`` (agent ``i``
    to the ``i mod len(tasks)``-th), both modes once per repetition's parameters in
    ``each_rep``."""
    total = 2 * len(each_rep) * len(counts)
    sweep, n_threads = [], 0
    for ci, agents in enumerate(counts):
        llama = LlamaConfig(
            n_ctx=4096,
            n_threads=threads,
            n_threads_batch=threads,
            n_seq_max=agents,
            kv_unified=False,
        )
        names = [list(tasks)[i % len(tasks)] for i in range(agents)]
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        with (
            LlamaCppBackend(mf, llama) as plain,
            plain.sibling(replace(llama, draft=max_draft)) as drafting,
            BatchScheduler(plain) as plain_steps,
            BatchScheduler(drafting) as draft_steps,
        ):
            prompts = [
                plain.tokenize(plain.chat_format.render(tasks[t], add_generation_prompt=True))
                for t in names
            ]
            for rep, params in enumerate(each_rep):
                for j, mode in enumerate(MODES if rep % 2 == 0 else MODES[::-1]):
                    if progress:
                        done = (ci * len(each_rep) + rep) * 2 + j
                        progress(f"{agents} agents, {mode}, run {rep + 1}", done, total)
                    steps = draft_steps if mode == "draft" else plain_steps
                    runs[mode].append(_run(steps, prompts, params, f"rep-{rep}"))
            n_threads = plain.n_threads
        sweep.append(_point(agents, names, runs))
    if progress:
        progress("done", total, total)
    return {
        "experiment": "speculative-batched",
        "model": mf.path.name,
        "model_digest": mf.digest,
        "cpu": cpu(),
        "n_threads": n_threads,
        "reps": len(each_rep),
        "max_draft": max_draft,
        "max_tokens": each_rep[0].max_tokens,
        "temperature": each_rep[0].temperature,
        "sweep": sweep,
    }


def _point(agents: int, names: list[str], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One agent count's figures: per task, all agents together, and each run's rates."""
    return {
        "agents": agents,
        "rows": [_row(t, names, runs) for t in dict.fromkeys(names)],
        "all": _all(runs),
        "per_run": {  # each run's throughput and agents' decode rates, in run order
            mode: [
                {"tok_s": r["tok_s"], "agents_tok_s": [a["decode_tok_s"] for a in r["agents"]]}
                for r in runs[mode]
            ]
            for mode in MODES
        },
    }


def _run(
    steps: BatchScheduler, prompts: list[list[int]], params: GenerationParams, tenant: str
) -> dict[str, Any]:
    """Every agent's reply at once: per agent its tokens and decode rate, and the run's
    throughput and drafting counts. Each repetition's agents are a tenant of their own, so no
    reply drafts from the same task's reply in an earlier repetition (the tenant's earlier
    replies are a draft source)."""
    with steps.exclusive():
        steps.backend.clear()
    before, calls_before = replace(steps.draft_stats), steps.stats().draft_calls
    firsts: dict[int, float] = {}
    ends: dict[int, float] = {}

    def timed(i: int) -> Callable[[str], None]:
        def on_text(_: str) -> None:  # on the step thread: the first call is the first token
            firsts.setdefault(i, time.perf_counter())

        return on_text

    def ended(i: int) -> Callable[[Future[GenOut]], None]:
        def done(_: Future[GenOut]) -> None:  # on the step thread, as the reply ends
            ends.setdefault(i, time.perf_counter())

        return done

    futures = []
    for i, p in enumerate(prompts):
        f = steps.submit(i, p, params, on_text=timed(i), program=Program(tenant))
        f.add_done_callback(ended(i))
        futures.append(f)
    outs = [f.result() for f in futures]
    after = steps.draft_stats
    agents = []
    for i, out in enumerate(outs):
        span = ends[i] - firsts.get(i, ends[i])
        rate = (len(out.tokens) - 1) / span if span > 0 and len(out.tokens) > 1 else 0.0
        agents.append({"tokens": list(out.tokens), "decode_tok_s": rate})
    span = max(ends.values()) - min(firsts.values(), default=max(ends.values()))
    return {
        "agents": agents,
        "tok_s": sum(len(o.tokens) for o in outs) / span if span > 0 else 0.0,
        "drafted": after.drafted - before.drafted,
        "accepted": after.accepted - before.accepted,
        "redone": after.redone - before.redone,
        "draft_calls": steps.stats().draft_calls - calls_before,
    }


def _row(task: str, names: list[str], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A task's agents: their median decode rates in both modes, over every repetition."""
    mine = [i for i, t in enumerate(names) if t == task]

    def rates(mode: str) -> list[float]:
        return [run["agents"][i]["decode_tok_s"] for run in runs[mode] for i in mine]

    same = [
        d["agents"][i]["tokens"] == p["agents"][i]["tokens"]
        for d, p in zip(runs["draft"], runs["plain"], strict=True)
        for i in mine
    ]
    plain, draft = statistics.median(rates("plain")), statistics.median(rates("draft"))
    return {
        "task": task,
        "agents": len(mine),
        "tokens": len(runs["plain"][0]["agents"][mine[0]]["tokens"]),
        "plain_tok_s": plain,
        "draft_tok_s": draft,
        "speedup": draft / plain if plain else float("nan"),
        "same_tokens": sum(same),
        "runs": len(same),
    }


def _all(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The runs' throughput in both modes, and what drafting did."""
    plain = statistics.median(r["tok_s"] for r in runs["plain"])
    draft = statistics.median(r["tok_s"] for r in runs["draft"])
    drafted = sum(r["drafted"] for r in runs["draft"])
    return {
        "plain_tok_s": plain,
        "draft_tok_s": draft,
        "speedup": draft / plain if plain else float("nan"),
        "accepted_share": sum(r["accepted"] for r in runs["draft"]) / drafted if drafted else 0.0,
        "draft_calls": statistics.median(r["draft_calls"] for r in runs["draft"]),
        "redone": statistics.median(r["redone"] for r in runs["draft"]),
    }


def goal(task: str) -> float:
    """Issue 41's goal for a task's decode rate over plain: 1.5x where the reply quotes its
    context, no slower for prose."""
    return 1.0 if task == "prose" else 1.5


def task_misses(who: str, row: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """A task row's misses: under its goal, and (greedy) replies that differ from plain."""
    out = []
    if row["speedup"] < goal(row["task"]):
        out.append(
            f"{who}, {row['task']}: {row['speedup']:.2f}x the plain decode rate "
            f"(goal {goal(row['task']):.1f}x), {data['model']}"
        )
    if data.get("temperature", 0.0) == 0 and row["same_tokens"] < row["runs"]:
        out.append(
            f"{who}, {row['task']}: {row['runs'] - row['same_tokens']} of {row['runs']} "
            "replies differ from plain decoding"
        )
    return out


def format_table(r: dict[str, Any]) -> str:
    sampling = "greedy" if r["temperature"] == 0 else f"sampled at temperature {r['temperature']:g}"
    lines = [
        f"speculative, agents at once in batch steps · {r['model']} · {r['n_threads']} threads · "
        f"drafts up to {r['max_draft']} tokens from the context · {sampling}, up to "
        f"{r['max_tokens']} tokens · median of {r['reps']}",
        "",
        "| agents | task | agents on it | reply tokens | plain tok/s | drafting tok/s | speed-up "
        "| same tokens |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for point in r["sweep"]:
        n = point["agents"]
        for row in point["rows"]:
            lines.append(
                f"| {n} | {row['task']} | {row['agents']} | {row['tokens']} | "
                f"{row['plain_tok_s']:.1f} | {row['draft_tok_s']:.1f} | {row['speedup']:.2f}x | "
                f"{row['same_tokens']}/{row['runs']} |"
            )
        a = point["all"]
        lines.append(
            f"| {n} | **all agents (throughput)** | {n} | | {a['plain_tok_s']:.1f} | "
            f"{a['draft_tok_s']:.1f} | {a['speedup']:.2f}x | kept {a['accepted_share']:.0%}, "
            f"{a['draft_calls']:.0f} draft calls, {a['redone']:.0f} redone |"
        )
    return "\n".join(lines)


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """``docs/benchmarks.md``'s section: drafting in the server's batch steps, and its goals
    (quoting replies 1.5x, prose and the agents' throughput no slower; issue 41)."""
    counts = ",".join(str(p["agents"]) for p in data["sweep"])
    lines += [
        "## Drafting from the context in batch steps (several agents at once)",
        "",
        "The same tasks as several agents at once, each on its own lane of one context, decoded "
        "in the batch steps the server's lanes use (`BatchScheduler`), with drafts "
        "(`serve --draft`) and without, alternated. A reply drafts in a step only where the "
        "cost model says the step's tokens per second gain (a plain token rides in the other "
        "replies' call; a draft takes a call of its own); the drafts of several replies of one "
        "length share a call.",
        "",
        f"Command: `continuum bench speculative --agents {counts} -t {data['n_threads']} "
        f"--reps {data['reps']} --max-draft {data['max_draft']} --max-tokens "
        f"{data['max_tokens']}` on {data['cpu']}",
        "",
        format_table(data),
        "",
        "![drafting in batch steps](speculative-batched.png)",
        "",
    ]
    for point in data["sweep"]:
        n = point["agents"]
        for row in point["rows"]:
            misses += task_misses(f"Drafting with {n} agents", row, data)
        if point["all"]["speedup"] < 1.0:
            misses.append(
                f"Drafting with {n} agents: throughput {point['all']['speedup']:.2f}x plain, "
                f"{data['model']}"
            )
