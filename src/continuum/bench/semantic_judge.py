"""The judge's part of ``continuum bench semantic``: what the verifier accepts, and what it costs.

Every labelled pair whose cosine reaches the tier's threshold (the only pairs the tier ever
judges) is put to :class:`~continuum.tiers.verifier.JudgeVerifier`; pairs below it are never
served whatever the judge says. For a few margins around the default the bench reports the
paraphrase hit rate and the false-hit rate (with its 95% Wilson interval), with the word-rule
guard in front and without it: the judge alone is the safety argument, the guard only a
cheaper first filter. The judge's latency is compared with the time of a cold answer on the
same model (greedy, up to ``max_tokens``, prefill included), measured on the same machine.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.progress import Progress
from continuum.bench.stats import wilson
from continuum.params import GenerationParams
from continuum.tiers.features import unjudgeable
from continuum.tiers.verifier import DEFAULT_MARGIN, JudgeVerifier

MARGINS = (0.0, 0.1, DEFAULT_MARGIN, 0.3, 0.5)
COLD_QUESTIONS = 8
COLD_MAX_TOKENS = 256


def judge_pairs(
    judge: JudgeVerifier,
    scored: Sequence[dict[str, Any]],
    threshold: float,
    progress: Progress | None = None,
    label: str = "",
) -> tuple[list[dict[str, Any]], list[float]]:
    """Each pair with ``margin`` (None: below the threshold, or a side the tier never judges)
    and ``verdict`` (the judge's reason, "" when it accepts); and each judgment's ms."""
    todo = [p for p in scored if p["cosine"] >= threshold]
    out, ms = [], []
    done = 0
    for p in scored:
        if p["cosine"] < threshold or unjudgeable(p["a"]) or unjudgeable(p["b"]):
            out.append({**p, "margin": None, "verdict": "not_judged"})
            continue
        v = judge.verify(p["b"], p["a"])  # the new request is b, the stored one a
        ms.append(v.ms)
        out.append({**p, "margin": v.margin, "verdict": v.reason})
        done += 1
        if progress is not None and done % 20 == 0:
            progress(f"judging the {label} pairs", done, len(todo))
    return out, ms


def _served(p: dict[str, Any], margin: float, guarded: bool) -> bool:
    if p["margin"] is None or p["margin"] < margin:
        return False
    return not guarded or p["guard"] is None


def judge_sweep(
    judged: Sequence[dict[str, Any]], margins: Sequence[float] = MARGINS
) -> list[dict[str, Any]]:
    same = [p for p in judged if p["label"] == "same"]
    different = [p for p in judged if p["label"] == "different"]
    rows = []
    for m in margins:
        row: dict[str, Any] = {"margin": m}
        for guarded, tag in ((False, "judge"), (True, "guard+judge")):
            k = sum(_served(p, m, guarded) for p in different)
            row[f"paraphrase_hit_{tag}"] = sum(_served(p, m, guarded) for p in same) / len(same)
            row[f"false_hits_{tag}"] = k
            row[f"false_hit_{tag}"] = k / len(different)
            row[f"false_hit_ci95_{tag}"] = wilson(k, len(different))
            row[f"false_by_kind_{tag}"] = _rate_by_kind(different, m, guarded)
            row[f"paraphrase_by_kind_{tag}"] = _rate_by_kind(same, m, guarded)
        rows.append(row)
    return rows


def _rate_by_kind(
    pairs: Sequence[dict[str, Any]], margin: float, guarded: bool
) -> dict[str, float]:
    kinds = sorted({p["kind"] for p in pairs})
    return {
        k: sum(_served(p, margin, guarded) for p in pairs if p["kind"] == k)
        / sum(p["kind"] == k for p in pairs)
        for k in kinds
    }


def cold_answer_ms(b: LlamaCppBackend, questions: Sequence[str]) -> list[float]:
    """Milliseconds of a cold greedy answer to each question on ``b``'s model: prefill of the
    rendered request plus generation, in a fresh context on the same weights."""
    ctx = b.sibling(LlamaConfig(n_ctx=2048, n_threads=b.n_threads, n_threads_batch=b.n_threads))
    params = GenerationParams(max_tokens=COLD_MAX_TOKENS)
    out = []
    try:
        for q in questions:
            text = ctx.chat_format.render([{"role": "user", "content": q}], True)
            tokens = [ctx.bos_id] if ctx.add_bos else []
            tokens += ctx.tokenize(text)
            ctx.clear()
            t0 = time.perf_counter()
            logits, _ = ctx.decode(tokens)
            assert logits is not None
            ctx.generate(logits, params, t0=t0)
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        ctx.close()
    return out


def run_judge(
    judge: JudgeVerifier,
    scored_sets: dict[str, list[dict[str, Any]]],
    threshold: float,
    progress: Progress | None = None,
) -> dict[str, Any]:
    sets: dict[str, Any] = {}
    all_ms: list[float] = []
    for name, scored in scored_sets.items():
        judged, ms = judge_pairs(judge, scored, threshold, progress, name)
        all_ms += ms
        rows = judge_sweep(judged)
        sets[name] = {
            "judged": len(ms),
            "sweep": rows,
            "default": next(r for r in rows if r["margin"] == judge.threshold),
            "false_hits_at_default": [
                {k: p[k] for k in ("a", "b", "kind", "cosine", "margin")}
                for p in judged
                if p["label"] == "different" and _served(p, judge.threshold, True)
            ],
        }
    questions = [p["a"] for p in scored_sets.get("independent", next(iter(scored_sets.values())))]
    questions = [q for q in questions if not unjudgeable(q)]
    random.Random(5).shuffle(questions)
    if progress is not None:
        progress("cold answers on the judge's model", 0, COLD_QUESTIONS)
    cold = cold_answer_ms(judge.backend, questions[:COLD_QUESTIONS])
    all_ms.sort()
    p50 = statistics.median(all_ms) if all_ms else 0.0
    return {
        "identity": judge.identity,
        "model": judge.backend.model.name,
        "threads": judge.backend.n_threads,
        "default_margin": judge.threshold,
        "sets": sets,
        "judge_ms_p50": p50,
        "judge_ms_p99": all_ms[int(len(all_ms) * 0.99)] if all_ms else 0.0,
        "cold_answer_ms_p50": statistics.median(cold),
        "cold_max_tokens": COLD_MAX_TOKENS,
        "judge_share_of_cold_answer": p50 / statistics.median(cold),
    }


def format_judge(j: dict[str, Any]) -> list[str]:
    lines = [
        f"judge: {j['model']} ({j['identity']}), default margin {j['default_margin']:g}; "
        f"judgment p50 {j['judge_ms_p50']:.0f} ms, p99 {j['judge_ms_p99']:.0f} ms; a cold "
        f"answer (<= {j['cold_max_tokens']} tokens) p50 {j['cold_answer_ms_p50']:.0f} ms: the "
        f"judge adds {j['judge_share_of_cold_answer']:.1%} of it",
    ]
    for name, s in j["sets"].items():
        lines.append(f"{name} set: {s['judged']} pairs judged (cosine >= the threshold)")
        lines.append(
            f"{'margin':>7}  {'paraphrase':>10} {'false':>6} {'95% CI':>12}   "
            f"{'paraphrase':>10} {'false':>6} {'95% CI':>12}"
        )
        lines.append(f"{'':>7}  {'(judge alone)':>30}   {'(guard + judge)':>30}")
        for r in s["sweep"]:
            cells = []
            for tag in ("judge", "guard+judge"):
                lo, hi = r[f"false_hit_ci95_{tag}"]
                cells.append(
                    f"{r[f'paraphrase_hit_{tag}']:>10.1%} {r[f'false_hit_{tag}']:>6.1%} "
                    f"{lo:>5.1%}-{hi:<5.1%}"
                )
            mark = " <- default" if r["margin"] == j["default_margin"] else ""
            lines.append(f"{r['margin']:>7g}  {cells[0]}   {cells[1]}{mark}")
        d = s["default"]
        lines.append(
            "at the default, guard + judge, false hits by kind: "
            + ", ".join(f"{k} {v:.0%}" for k, v in d["false_by_kind_guard+judge"].items())
        )
        lines.append(
            "paraphrase hits by kind: "
            + ", ".join(f"{k} {v:.0%}" for k, v in d["paraphrase_by_kind_guard+judge"].items())
        )
    return lines


def report_judge(lines: list[str], misses: list[str], j: dict[str, Any], threshold: float) -> None:
    """The judge's section of docs/benchmarks.md, and its misses of the goal."""
    share = j["judge_share_of_cold_answer"]
    lines += [
        f"Verifier: {j['model']} as a judge (`{j['identity']}`), margin "
        f"logit(yes) - logit(no) >= {j['default_margin']:g}, chosen on the dev and holdout sets "
        "with the guard off (the judge alone must hold false hits to 1% there). It judges the "
        f"pairs at cosine >= {threshold}; the tier serves a pair only if the guard passes it "
        "and the judge accepts it.",
        "",
        "| set | judged | margin | paraphrase hits (guard + judge) | false hits (guard + "
        "judge) | 95% CI | paraphrase hits (judge alone) | false hits (judge alone) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in j["sets"].items():
        for r in s["sweep"]:
            lo, hi = r["false_hit_ci95_guard+judge"]
            mark = " (default)" if r["margin"] == j["default_margin"] else ""
            lines.append(
                f"| {name} | {s['judged']} | {r['margin']:g}{mark} | "
                f"{r['paraphrase_hit_guard+judge']:.1%} | {r['false_hit_guard+judge']:.1%} "
                f"({r['false_hits_guard+judge']}) | {lo:.1%}-{hi:.1%} | "
                f"{r['paraphrase_hit_judge']:.1%} | {r['false_hit_judge']:.1%} |"
            )
    lines += [
        "",
        f"Judge latency: p50 {j['judge_ms_p50']:.0f} ms, p99 {j['judge_ms_p99']:.0f} ms per "
        f"judgment; a cold answer on the same model (greedy, <= {j['cold_max_tokens']} tokens) "
        f"takes {j['cold_answer_ms_p50']:.0f} ms at the median: the judge adds {share:.1%}.",
        "",
    ]
    ind = j["sets"].get("independent")
    if ind is not None:
        d = ind["default"]
        lines += [
            "Independent set at the default, guard + judge, by kind: false hits "
            + ", ".join(f"{k} {v:.0%}" for k, v in d["false_by_kind_guard+judge"].items())
            + "; paraphrase hits "
            + ", ".join(f"{k} {v:.0%}" for k, v in d["paraphrase_by_kind_guard+judge"].items()),
            "",
        ]
        fh, ph = d["false_hit_guard+judge"], d["paraphrase_hit_guard+judge"]
        if fh > 0.01 or ph < 0.5:
            misses.append(
                f"semantic with the judge (independent set): {fh:.1%} false hits, {ph:.1%} "
                "paraphrase hits (goal <= 1% and >= 50%): the tier stays off by default."
            )
    if share > 0.05:
        misses.append(
            f"semantic judge latency: {share:.1%} of a cold answer (goal <= 5%), "
            f"{j['judge_ms_p50']:.0f} ms per judgment."
        )
