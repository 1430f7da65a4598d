"""``continuum bench draft-cost``: what verifying a draft of k tokens costs, against k steps.

Speculative decoding without a draft model (prompt lookup, n-gram and suffix drafts: issue 41)
guesses the next k tokens from the context and checks them in one ``llama_decode`` of k rows
(:meth:`~continuum.backends.llamacpp.LlamaCppBackend.decode_rows`) instead of k calls of one
token. It pays only if that call costs less than the steps its accepted tokens replace. On a
GPU a call of 16 rows costs about what one row does; on 2 CPU threads it may not, so this is
measured first, at each draft length k, on each model and resident context length:

- ``step_ms``: one token decoded after the context (a plain decoding step), median;
- ``verify_ms``: k tokens decoded in one call with logits for every row, median;
- ``cost_in_steps``: ``verify_ms / step_ms``, the steps one verification costs;
- ``break_even``: the draft tokens a verification must get accepted, on average, to be no
  slower than plain decoding: a call yields the accepted tokens plus one token of its own
  (the model's choice after the last accepted one), so ``cost_in_steps - 1``;
- ``same_argmax``: rows whose most likely next token is the one the k single steps give
  (greedy drafting keeps its outputs exactly when this is every row), and ``max_abs_diff``,
  the largest logit difference between the two.

The draft tokens are the text that follows the context (as a draft that is entirely right
would be). Singles and the verification alternate in order, run by run; the sequence is cut
back to the context after each.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import long_system_prompt
from continuum.bench.settings import BenchSettings
from continuum.settings import Names, Sizes, setting


class DraftCostConfig(BenchSettings):
    """What a ``bench draft-cost`` run is told (its command line is generated from it)."""

    models: Names | None = setting(
        None, "Several models, comma-separated aliases or GGUF paths, instead of --model."
    )
    contexts: Sizes = setting((1024, 8192), "Resident context lengths, comma-separated.")
    max_draft: int = setting(16, "Draft lengths k = 1..N are measured.", ge=1, le=32)


def run_draft_cost(cfg: DraftCostConfig, progress: Progress | None = None) -> dict[str, Any]:
    models: list[str | None] = list(cfg.models) if cfg.models else [cfg.model]
    tables, threads = [], 0
    for mi, alias in enumerate(models):
        mf = resolve_model(alias)
        llama = LlamaConfig(
            n_ctx=max(cfg.contexts) + cfg.max_draft + 64,
            n_threads=cfg.threads,
            n_threads_batch=cfg.threads,
        )
        with LlamaCppBackend(mf, llama) as b:
            threads = b.n_threads
            text = b.tokenize(long_system_prompt(max(cfg.contexts) + cfg.max_draft + 400))
            for ci, n in enumerate(cfg.contexts):
                if progress:
                    done, total = mi * len(cfg.contexts) + ci, len(models) * len(cfg.contexts)
                    progress(f"{mf.path.name} at {n:,} tokens", done, total)
                b.clear()
                _prefill(b, [b.bos_id, *text[: n - 1]], progress, f"{mf.path.name} at {n:,}")
                draft = text[n - 1 : n - 1 + cfg.max_draft]
                rows = [_measure(b, draft[:k], cfg.reps) for k in range(1, cfg.max_draft + 1)]
                tables.append(
                    {"model": mf.path.name, "model_digest": mf.digest, "context": n, "rows": rows}
                )
    if progress:
        progress("done", 1, 1)
    return {
        "experiment": "draft-cost",
        "config": {
            "models": [m or "qwen2.5-coder-0.5b" for m in models],
            "contexts": list(cfg.contexts),
            "max_draft": cfg.max_draft,
        },
        "n_threads": threads,
        "reps": cfg.reps,
        "tables": tables,
    }


def _prefill(b: LlamaCppBackend, tokens: list[int], progress: Progress | None, what: str) -> None:
    """The resident context, decoded in parts so that a long one shows progress."""
    part = 1024
    for start in range(0, len(tokens), part):
        if progress:
            progress(f"{what}: prefill", start, len(tokens))
        b.decode(tokens[start : start + part])


def _measure(b: LlamaCppBackend, draft: list[int], reps: int) -> dict[str, Any]:
    """k single steps and one k-row verification of ``draft`` after the resident context,
    ``reps`` times each, alternating which goes first."""
    base = len(b.seq_tokens(0))
    steps: list[float] = []
    verifies: list[float] = []
    singles: list[np.ndarray] = []
    rows = np.empty(0)
    for rep in range(reps):
        for mode in ("steps", "verify") if rep % 2 == 0 else ("verify", "steps"):
            if mode == "steps":
                singles = []
                for tok in draft:
                    t0 = time.perf_counter()
                    logits, _ = b.decode([tok])
                    steps.append((time.perf_counter() - t0) * 1000)
                    assert logits is not None
                    singles.append(logits.copy())
            else:
                t0 = time.perf_counter()
                rows = b.decode_rows(draft)
                verifies.append((time.perf_counter() - t0) * 1000)
            b.truncate(base)
    step_ms, verify_ms = statistics.median(steps), statistics.median(verifies)
    want = np.stack(singles)
    return {
        "k": len(draft),
        "step_ms": step_ms,
        "verify_ms": verify_ms,
        "cost_in_steps": verify_ms / step_ms,
        "break_even": verify_ms / step_ms - 1,
        "same_argmax": int((rows.argmax(axis=1) == want.argmax(axis=1)).sum()),
        "max_abs_diff": float(np.abs(rows - want).max()),
    }


def format_table(result: dict[str, Any]) -> str:
    lines = []
    for t in result["tables"]:
        lines += [
            f"draft-cost · {t['model']} · {t['context']:,} resident tokens · "
            f"{result['n_threads']} threads · median of {result['reps']}",
            "",
            "| k | one step | verify k | verify / step | break-even accepted | same argmax | "
            "max abs diff |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in t["rows"]:
            lines.append(
                f"| {r['k']} | {r['step_ms']:.1f} ms | {r['verify_ms']:.1f} ms | "
                f"{r['cost_in_steps']:.2f}x | {r['break_even']:.2f} | "
                f"{r['same_argmax']}/{r['k']} | {r['max_abs_diff']:.3g} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip()


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """``docs/benchmarks.md``'s section: the tables, and where a draft could pay (a
    measurement with no goal of its own: nothing goes to ``misses``)."""
    cfg = data["config"]
    command = (
        f"continuum bench draft-cost --models {','.join(cfg['models'])} -t {data['n_threads']} "
        f"--reps {data['reps']} --contexts {','.join(str(c) for c in cfg['contexts'])} "
        f"--max-draft {cfg['max_draft']}"
    )
    lines += [
        "## Drafting: what verifying k tokens costs",
        "",
        "Speculative decoding without a draft model checks k guessed tokens in one call of k "
        "rows instead of k decoding steps (issue 41). It pays only when the tokens a call gets "
        "accepted, plus the one it adds, outnumber the steps the call costs. Measured before "
        "any drafting is built: one step, one verification of k tokens, their ratio, the "
        "accepted tokens a verification needs to break even, and whether the k rows pick the "
        "same next tokens as the k single steps (greedy outputs stay unchanged only if so).",
        "",
        f"Command: `{command}`",
        "",
        format_table(data),
        "",
    ]
    for t in data["tables"]:
        multi = [r for r in t["rows"] if r["k"] >= 2]
        if not multi:
            continue
        best = min(multi, key=lambda r: r["cost_in_steps"] / r["k"])
        differ = sum(r["k"] - r["same_argmax"] for r in t["rows"])
        rows = sum(r["k"] for r in t["rows"])
        diff = max(r["max_abs_diff"] for r in t["rows"])
        lines.append(
            f"- {t['model']} at {t['context']:,} tokens: verifying k = {best['k']} costs "
            f"{best['cost_in_steps']:.2f} steps ({best['cost_in_steps'] / best['k']:.2f} per "
            f"draft token, the least of k >= 2), so a draft of {best['k']} pays only with more "
            f"than {best['break_even']:.1f} accepted tokens per call; {differ} of {rows} rows "
            f"picked another next token than the single step, their logits up to {diff:.2g} "
            "apart ("
            + (
                "bit-equal"
                if diff == 0
                else "not bit-equal: at a near-tie the "
                "verification could pick another token than plain decoding"
            )
            + ")."
        )
    lines.append("")
