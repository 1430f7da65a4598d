"""``continuum bench speculative``: greedy replies with drafts from their own context, on and off.

Tasks (chat messages through the model's own template, greedy):

``edit-file``   a 60-line Python file, and "rename one function, return the whole file";
``tool-args``   a tool result full of ids and paths, and "call the tool on each, as JSON";
``json``        a JSON document, and "return it with one field changed";
``prose``       a short essay question: nothing to quote, drafting must turn itself off.

Each reply is decoded once with ``LlamaConfig.draft`` at ``--max-draft`` and once without
(plain steps), alternating which goes first, ``reps`` times; medians of the decode rate
(generated tokens over the time from the first token to the last) are reported with the share
of drafted tokens the model kept, the tokens decoded again one a step for close calls
(:func:`~continuum.backends.drafting.drafted_reply`), and whether the two replies are the same
tokens. The prompt
is decoded before the clock starts. In process, on one llama.cpp context (no server).

With ``--llama-server PATH``, llama-server decodes the same prompts afterwards, plain and with
each of its ``--spec-type ngram-*`` modes, each server alone (:mod:`.speculative_peer`); its best
mode per task is the peer the goal names.

With ``--agents N`` (N > 1), N agents reply at once in the batch steps the server's lanes use
(:mod:`.speculative_batched`).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from typing import Any

from pydantic import field_validator

from continuum.backends.drafting import DraftStats
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.machine import cpu
from continuum.bench.settings import PeerSettings
from continuum.bench.speculative_batched import goal, run_batched, task_misses
from continuum.bench.speculative_peer import peer_lines, run_peer
from continuum.params import GenerationParams
from continuum.settings import Counts, Names, setting

FILE = "\n".join(
    f"def step_{i}(value: int) -> int:\n    return value * {i} + {i % 7}\n" for i in range(20)
)
RECORDS = [
    {"id": f"R-{4100 + i}", "path": f"/srv/data/2026/batch_{i:02d}/records.jsonl", "rows": 40 + i}
    for i in range(12)
]
DOC = {
    "service": "billing",
    "version": "2.14.3",
    "owners": ["dana@example.com", "eli@example.com"],
    "limits": {"requests_per_minute": 600, "burst": 120, "timeout_ms": 2500},
    "regions": [{"name": f"eu-{i}", "replicas": 3 + i, "zone": f"eu-{i}a"} for i in range(6)],
}
TASKS: dict[str, list[dict[str, str]]] = {
    "edit-file": [
        {
            "role": "user",
            "content": f"```python\n{FILE}```\n\nRename step_3 to scale_3 and "
            "return the whole file in one code block, every other line unchanged.",
        },
    ],
    "tool-args": [
        {
            "role": "user",
            "content": "The search tool returned:\n"
            + json.dumps(RECORDS, indent=1)
            + "\n\nFor each record, write one call fetch(id, path) with its id and path, "
            "one a line.",
        },
    ],
    "json": [
        {
            "role": "user",
            "content": json.dumps(DOC, indent=2) + "\n\nReturn this JSON exactly, "
            "with version set to 2.15.0 and nothing else changed.",
        },
    ],
    "prose": [
        {"role": "user", "content": "In a short paragraph, why do ships float?"},
    ],
}


MAX_AGENTS = 16  # lanes of one context in a batched run


class SpeculativeConfig(PeerSettings):
    """What a ``bench speculative`` run is told (its command line is generated from it)."""

    tasks: Names = setting(tuple(TASKS), "Tasks, comma-separated.")
    max_draft: int = setting(16, "Longest draft (LlamaConfig.draft).", ge=1, le=32)
    max_tokens: int = setting(400, "Most tokens in a reply.", ge=1)
    agents: Counts = setting(
        (1,),
        "Agents at once, comma-separated for a sweep (2,4,8): above 1, each replies to a task "
        "(in turn) on its own lane of one context, decoded together in batch steps as the "
        "server's lanes are (speculative-batched.json); no llama-server peer. 1: one reply at "
        "a time, in process.",
    )
    temperature: float = setting(
        0.0,
        "Sampling temperature; 0 is greedy. Sampled replies are seeded by repetition (both "
        "modes, and llama-server, the same seed) and drafts are kept by speculative sampling.",
        ge=0.0,
        le=2.0,
    )

    @field_validator("agents")
    @classmethod
    def _lanes(cls, agents: tuple[int, ...]) -> tuple[int, ...]:
        if max(agents) > MAX_AGENTS:
            raise ValueError(f"agents must be 1..{MAX_AGENTS} each, got {agents}")
        return agents

    @property
    def batched(self) -> bool:
        """Agents at once in batch steps (a sweep, or one count above 1)."""
        return self.agents != (1,)

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(tasks) - set(TASKS))
        if unknown or not tasks:
            raise ValueError(f"tasks must be among {', '.join(TASKS)}; got {', '.join(tasks)}")
        return tasks


def run_speculative(cfg: SpeculativeConfig, progress: Progress | None = None) -> dict[str, Any]:
    mf = resolve_model(cfg.model)
    if cfg.batched:
        chosen = {t: TASKS[t] for t in cfg.tasks}
        each_rep = [_params(cfg, rep) for rep in range(cfg.reps)]
        return run_batched(mf, cfg.threads, cfg.agents, chosen, cfg.max_draft, each_rep, progress)
    llama = LlamaConfig(n_ctx=4096, n_threads=cfg.threads, n_threads_batch=cfg.threads)
    rows, threads, prompts = [], 0, {}
    with (
        LlamaCppBackend(mf, llama) as plain,
        plain.sibling(replace(llama, draft=cfg.max_draft)) as drafting,
    ):
        threads = plain.n_threads
        bos = plain.chat_format.bos_token
        for task in cfg.tasks:  # the peer's prompts: the same template, its own BOS
            text = plain.chat_format.render(TASKS[task], add_generation_prompt=True)
            prompts[task] = text[len(bos) :] if bos and text.startswith(bos) else text
        for ti, task in enumerate(cfg.tasks):
            if progress:
                progress(task, ti, len(cfg.tasks))
            runs: dict[str, list[dict[str, Any]]] = {"draft": [], "plain": []}
            for rep in range(cfg.reps):
                order = ("draft", "plain") if rep % 2 == 0 else ("plain", "draft")
                params = _params(cfg, rep)
                for mode in order:
                    b = drafting if mode == "draft" else plain
                    runs[mode].append(_reply(b, TASKS[task], params))
            rows.append(_row(task, runs))
    out: dict[str, Any] = {
        "experiment": "speculative",
        "model": mf.path.name,
        "model_digest": mf.digest,
        "cpu": cpu(),
        "n_threads": threads,
        "reps": cfg.reps,
        "max_draft": cfg.max_draft,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "rows": rows,
    }
    if cfg.llama_server:  # after ours, each of its servers alone
        reply = [_params(cfg, rep) for rep in range(cfg.reps)]
        out["llama_server"] = run_peer(cfg.llama_server, mf, threads, prompts, reply, progress)
    if progress:
        progress("done", len(cfg.tasks), len(cfg.tasks))
    return out


def _params(cfg: SpeculativeConfig, rep: int) -> GenerationParams:
    """Repetition ``rep``'s reply parameters: greedy, or sampled with the seed ``rep``."""
    if cfg.temperature == 0:
        return GenerationParams(max_tokens=cfg.max_tokens)
    return GenerationParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature, seed=rep)


def result_name(temperature: float, batched: bool = False) -> str:
    """The results file of a run at ``temperature``, one reply at a time or ``batched``."""
    if batched:
        return "speculative-batched.json"
    return "speculative.json" if temperature == 0 else "speculative-sampled.json"


def _sampling(r: dict[str, Any]) -> str:
    t = r.get("temperature", 0.0)
    return "greedy" if t == 0 else f"sampled at temperature {t:g}, seeded by repetition"


def _reply(
    b: LlamaCppBackend, messages: list[dict[str, str]], params: GenerationParams
) -> dict[str, Any]:
    b.clear()
    text = b.chat_format.render(messages, add_generation_prompt=True)
    logits, _ = b.decode(b.tokenize(text))
    assert logits is not None
    before = replace(b.draft_stats)
    first: list[float] = []

    def on_text(_: str) -> None:
        if not first:
            first.append(time.perf_counter())

    t0 = time.perf_counter()
    out = b.generate(logits.copy(), params, on_text=on_text)
    end = time.perf_counter()
    after = b.draft_stats
    stats = DraftStats(
        after.calls - before.calls,
        after.drafted - before.drafted,
        after.accepted - before.accepted,
        after.redone - before.redone,
    )
    span = end - (first[0] if first else t0)
    return {
        "tokens": list(out.tokens),
        "decode_tok_s": (len(out.tokens) - 1) / span if span > 0 and len(out.tokens) > 1 else 0.0,
        "calls": stats.calls,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "redone": stats.redone,
    }


def _row(task: str, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    draft, plain = runs["draft"], runs["plain"]
    rate_d = statistics.median(r["decode_tok_s"] for r in draft)
    rate_p = statistics.median(r["decode_tok_s"] for r in plain)
    drafted = sum(r["drafted"] for r in draft)
    return {
        "task": task,
        "tokens": len(plain[0]["tokens"]),
        "plain_tok_s": rate_p,
        "draft_tok_s": rate_d,
        "speedup": rate_d / rate_p if rate_p else float("nan"),
        "accepted_share": sum(r["accepted"] for r in draft) / drafted if drafted else 0.0,
        "draft_calls": statistics.median(r["calls"] for r in draft),
        "redone": statistics.median(r["redone"] for r in draft),
        "same_tokens": sum(d["tokens"] == p["tokens"] for d, p in zip(draft, plain, strict=True)),
        "runs": len(draft),
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"speculative · {r['model']} · {r['n_threads']} threads · drafts up to "
        f"{r['max_draft']} tokens from the context · {_sampling(r)}, up to {r['max_tokens']} "
        "tokens · "
        f"median of {r['reps']}",
        "",
        "| task | reply tokens | plain tok/s | drafting tok/s | speed-up | drafted tokens kept | "
        "verify calls | decoded again | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['task']} | {row['tokens']} | {row['plain_tok_s']:.1f} | "
            f"{row['draft_tok_s']:.1f} | {row['speedup']:.2f}x | {row['accepted_share']:.0%} | "
            f"{row['draft_calls']:.0f} | {row['redone']:.0f} | "
            f"{row['same_tokens']}/{row['runs']} |"
        )
    if "llama_server" in r:
        lines += [
            "",
            "llama-server on the same prompts, model file and threads (`-fa off --swa-full "
            "-np 1`), plain and with each `--spec-type` at its default lengths, each server "
            "alone; its own decode rate (`timings.predicted_per_second`):",
            "",
            *peer_lines(r["llama_server"]),
        ]
    return "\n".join(lines)


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """``docs/benchmarks.md``'s section, and its goals: quoting replies at least 1.5x the plain
    decode rate, prose no slower (issue 41)."""
    greedy = data.get("temperature", 0.0) == 0
    lines += [
        f"## Drafting from the context ({'greedy' if greedy else 'sampled'} replies)",
        "",
        "Each reply is decoded with drafts from its own context (`LlamaConfig.draft`, prompt "
        "lookup verified in one call, "
        + (
            "a draft token kept only while the model clearly chose it, close calls decided "
            "by plain steps, a run of drafts started only after 16 clear choices in a row"
            if greedy
            else "a draft token kept by standard speculative sampling: with its probability "
            "under the reply's sampling distribution, else the token drawn from the rest; the "
            "same seed in both modes, so replies are not expected to be the same tokens"
        )
        + ") and without, alternated; the prompt is decoded before the clock starts. In "
        "process, one sequence at a time (several agents in batch steps: the section below).",
        "",
        f"Command: `continuum bench speculative -t {data['n_threads']} --reps {data['reps']} "
        f"--max-draft {data['max_draft']} --max-tokens {data['max_tokens']}"
        + (f" --temperature {data['temperature']:g}" if not greedy else "")
        + f"{' --llama-server PATH' if 'llama_server' in data else ''}`"
        + (f" on {data['cpu']}" if "cpu" in data else ""),
        "",
        format_table(data),
        "",
    ]
    for row in data["rows"]:
        misses += task_misses("Drafting", row, data)
        peer = _peer_row(data, row["task"])
        quoting = goal(row["task"]) > 1.0
        if peer is not None and row["draft_tok_s"] < peer["best_tok_s"] and quoting:
            misses.append(
                f"Drafting, {row['task']}: {row['draft_tok_s']:.1f} tok/s against llama-server's "
                f"best n-gram mode ({peer['best']}) {peer['best_tok_s']:.1f}, {data['model']}"
            )


def _peer_row(data: dict[str, Any], task: str) -> dict[str, Any] | None:
    peer = data.get("llama_server")
    if peer is None:
        return None
    return next((r for r in peer["rows"] if r["task"] == task), None)
