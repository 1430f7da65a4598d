"""``continuum bench eva``: seed 000's experiment on a real model, every mode measured here.

Modes (each runs the same 16-turn conversation, greedy, on its own freshly loaded model):

``stateful``   continuum: a resident session; each turn sends only the new user message.
``prefix``     the peer: the full transcript rendered to text and re-sent to the same
               llama-cpp-python ``Llama`` object, which reuses its longest common token prefix
               (``create_completion``, streaming; the ideal same-worker prefix-cache hit).
``cold``       full recompute: the same canonical prompt as ``stateful``, KV cleared each turn.
``raw``        the floor: the exact token deltas ``stateful`` decoded, replayed straight into
               ``llama_decode`` with no session logic (decode + argmax, nothing else).

Modes alternate run by run (the order rotates) so drift hits all of them; medians are reported
with the spread across runs. Every figure printed is what this run measured.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama

from continuum.backends.llama_process import on_compute_thread, repack_off
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend, choose_chat_format
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import (
    SYSTEM,
    TURNS,
    UserTurn,
    check,
    long_system_prompt,
    n_ctx_for,
)
from continuum.bench.machine import cpu
from continuum.messages import Message
from continuum.params import GenerationParams
from continuum.results import Result
from continuum.stateful.worker import Worker, WorkerConfig

MODES = ("stateful", "prefix", "cold", "raw")


@dataclass
class ModeRun:
    mode: str
    ttft_ms: list[float] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)
    wire_chars: list[int] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    checks: list[bool | None] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    wake_tokens: int = 0
    # 1-based turn numbers of the entries above (a sampled mode times only some turns) and
    # each turn's whole prompt length in tokens (what a cold recompute evaluates)
    turn_numbers: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)

    def record(self, turn: UserTurn, r: Result) -> None:
        self.turn_numbers.append(TURNS.index(turn) + 1)
        self.prompt_tokens.append(r.metrics.tokens_reused + r.metrics.prompt_tokens_evaluated)
        self.ttft_ms.append(r.metrics.ttft_ms)
        self.evaluated.append(r.metrics.prompt_tokens_evaluated)
        self.wire_chars.append(r.metrics.wire_chars or 0)  # a turn reports both
        self.prefill_ms.append(r.metrics.prefill_ms or 0.0)
        self.replies.append(r.text)
        self.checks.append(check(turn, r.text))

    @property
    def mean_ttft_2_16(self) -> float:
        """Mean TTFT over the turns after the first (those this run timed)."""
        numbers = self.turn_numbers or list(range(1, len(self.ttft_ms) + 1))
        later = [t for t, n in zip(self.ttft_ms, numbers, strict=True) if n >= 2]
        return statistics.fmean(later) if later else float("nan")


@dataclass
class _Trace:
    """What the stateful run decoded each turn, so ``raw`` can replay exactly that."""

    keep: list[int] = field(default_factory=list)
    delta: list[list[int]] = field(default_factory=list)
    after: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EvaConfig:
    model: str | None = None
    reps: int = 3
    system_tokens: int = 0  # 0: the short system prompt; N: a handbook of about N tokens
    max_tokens: int = 48
    n_threads: int | None = None
    turns: int = len(TURNS)
    modes: tuple[str, ...] = MODES
    n_ctx: int = 0  # 0: sized from system_tokens (see conversation.n_ctx_for)
    exact: bool = False  # the stateful session re-decodes each reply before reusing it


def _system(cfg: EvaConfig) -> str:
    return long_system_prompt(cfg.system_tokens) if cfg.system_tokens else SYSTEM


def _llama_config(cfg: EvaConfig) -> LlamaConfig:
    n_ctx = cfg.n_ctx or n_ctx_for(cfg.system_tokens, cfg.turns, cfg.max_tokens)
    return LlamaConfig(n_ctx=n_ctx, n_threads=cfg.n_threads, n_threads_batch=cfg.n_threads)


def _turns(cfg: EvaConfig) -> tuple[UserTurn, ...]:
    return TURNS[: cfg.turns]


def run_stateful(model: ModelFile, cfg: EvaConfig, trace: _Trace | None = None) -> ModeRun:
    out = ModeRun("stateful")
    params = GenerationParams(max_tokens=cfg.max_tokens)
    config = WorkerConfig(llama=_llama_config(cfg), exact=cfg.exact)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Worker(model, config, store=Path(tmp) / "h.db") as worker,
    ):
        session = worker.create_session(_system(cfg))
        out.wake_tokens = len(worker.seq.tokens)
        for turn in _turns(cfg):
            keep_before = list(worker.seq.tokens)
            r = session.append([{"role": "user", "content": turn.content}], params)
            m = r.metrics
            out.record(turn, r)
            if trace is not None:
                after = list(worker.seq.tokens)
                trace.keep.append(m.tokens_reused)
                trace.delta.append(
                    after[m.tokens_reused : m.tokens_reused + m.prompt_tokens_evaluated]
                )
                trace.after.append(after)
                assert keep_before[: m.tokens_reused] == after[: m.tokens_reused]
    return out


def run_cold(
    model: ModelFile,
    cfg: EvaConfig,
    sample: tuple[int, ...] = (),
    replies: list[str] | None = None,
) -> ModeRun:
    """Full recompute: the KV is cleared before every turn, so the whole prompt is evaluated.

    With ``sample`` (1-based turn numbers) only those turns run; the transcript before each is
    built from ``replies`` (the stateful run's replies, the same greedy text), so a turn deep in
    a long conversation can be timed without paying for every turn before it."""
    out = ModeRun("cold")
    params = GenerationParams(max_tokens=cfg.max_tokens)
    turns = _turns(cfg)
    numbers = sample or tuple(range(1, len(turns) + 1))
    if sample and (replies is None or max(sample) - 1 > len(replies) or min(sample) < 1):
        raise ValueError("a sampled cold run needs turn numbers from 1 and the replies before them")
    with (
        tempfile.TemporaryDirectory() as tmp,
        Worker(model, WorkerConfig(llama=_llama_config(cfg)), store=Path(tmp) / "h.db") as worker,
    ):
        session = worker.create_session(_system(cfg))
        for n in numbers:
            before = replies if sample and replies is not None else out.replies
            msgs: list[Message] = [{"role": "system", "content": _system(cfg)}]
            for turn, reply in zip(turns[: n - 1], before[: n - 1], strict=True):
                msgs += [
                    {"role": "user", "content": turn.content},
                    {"role": "assistant", "content": reply},
                ]
            msgs.append({"role": "user", "content": turns[n - 1].content})
            worker.seq.clear()  # nothing resident: the whole prompt is evaluated
            out.record(turns[n - 1], session.turn(msgs, params))
    return out


def run_prefix(model: ModelFile, cfg: EvaConfig) -> ModeRun:
    """The peer: llama-cpp-python's own longest-common-prefix reuse on a full transcript.
    It runs on continuum's llama.cpp compute thread, as a second thread decoding in the same
    process would slow both (see ``on_compute_thread``)."""
    return on_compute_thread(lambda: _run_prefix(model, cfg))


def _run_prefix(model: ModelFile, cfg: EvaConfig) -> ModeRun:
    out = ModeRun("prefix")
    lc = _llama_config(cfg)
    n_threads, n_threads_batch = lc.threads()
    with repack_off():  # as ours: the same weights layout, and no AMX crash (repack_off)
        llm = Llama(
            str(model.path),
            n_ctx=lc.n_ctx,
            n_batch=lc.n_batch,
            n_ubatch=lc.n_batch,
            n_threads=n_threads,
            n_threads_batch=n_threads_batch,
            flash_attn=False,
            verbose=False,
        )
    vocab_text = llm._model.token_get_text
    fmt = choose_chat_format(
        model, lc.chat_format, vocab_text(llm.token_bos()), vocab_text(llm.token_eos())
    )
    try:
        msgs: list[Message] = [{"role": "system", "content": _system(cfg)}]
        for turn in _turns(cfg):
            msgs.append({"role": "user", "content": turn.content})
            wire = json.dumps(msgs, ensure_ascii=False)
            text = fmt.render(json.loads(wire), add_generation_prompt=True)
            if fmt.bos_token and text.startswith(fmt.bos_token):
                text = text[len(fmt.bos_token) :]  # llama-cpp-python adds BOS itself
            prompt = llm.tokenize(text.encode(), add_bos=True, special=True)
            cached = list(llm._input_ids)
            lcp = 0
            for a, b in zip(cached, prompt, strict=False):
                if a != b:
                    break
                lcp += 1
            reuse = lcp - 1 if lcp == len(prompt) else lcp
            ttft = None
            reply = ""
            # the clock starts where ours does (inside the turn): not before the JSON round
            # trip, the render, our own tokenisation and the LCP count above, which are the
            # bench's bookkeeping, not the peer's work
            t0 = time.perf_counter()
            for chunk in llm.create_completion(
                text,
                max_tokens=cfg.max_tokens,
                temperature=0.0,
                top_p=1.0,
                top_k=0,
                repeat_penalty=1.0,
                stream=True,
            ):
                if ttft is None:
                    ttft = (time.perf_counter() - t0) * 1000.0
                reply += chunk["choices"][0]["text"]  # type: ignore[index]
            msgs.append({"role": "assistant", "content": reply})
            out.turn_numbers.append(TURNS.index(turn) + 1)
            out.prompt_tokens.append(len(prompt))
            out.ttft_ms.append(ttft if ttft is not None else float("nan"))
            out.evaluated.append(len(prompt) - reuse)
            out.wire_chars.append(len(wire))
            out.replies.append(reply)
            out.checks.append(check(turn, reply))
    finally:
        llm.close()
    return out


def run_raw(model: ModelFile, cfg: EvaConfig, trace: _Trace) -> ModeRun:
    """Replay the stateful run's exact deltas into llama_decode: the floor for its TTFT."""
    out = ModeRun("raw")
    with LlamaCppBackend(model, _llama_config(cfg)) as backend:
        backend.decode(trace.after[0][: trace.keep[0]])  # the wake prefix, as at creation
        out.wake_tokens = trace.keep[0]
        for keep, delta, after in zip(trace.keep, trace.delta, trace.after, strict=True):
            backend.truncate(keep)
            t0 = time.perf_counter()
            logits, ms = backend.decode(delta)
            assert logits is not None
            int(np.argmax(logits))
            out.ttft_ms.append((time.perf_counter() - t0) * 1000.0)
            out.prefill_ms.append(ms)
            out.evaluated.append(len(delta))
            backend.decode(after[len(backend.tokens) :])  # the reply, untimed
    return out


def machine_info(model: ModelFile, cfg: EvaConfig) -> dict[str, Any]:
    threads = _llama_config(cfg).threads()
    return {
        "cpu": cpu(),
        "cores_visible": os.cpu_count(),
        "n_threads": threads[0],
        "n_threads_batch": threads[1],
        "model_path": str(model.path),
        "model_digest": model.digest,
        "llama_cpp_python": llama_cpp.__version__,
        "python": platform.python_version(),
    }


def run_eva(cfg: EvaConfig, progress: Progress | None = None) -> dict[str, Any]:
    model = resolve_model(cfg.model)
    runs: dict[str, list[ModeRun]] = {m: [] for m in cfg.modes}
    order = [m for m in ("stateful", "prefix", "cold") if m in cfg.modes]
    total = cfg.reps * len(cfg.modes)
    done = 0
    for rep in range(cfg.reps):
        rotated = order[rep % len(order) :] + order[: rep % len(order)]
        for mode in rotated:
            if progress:
                progress(f"run {rep + 1}/{cfg.reps}: {mode}", done, total)
            if mode == "stateful":
                trace = _Trace()
                runs[mode].append(run_stateful(model, cfg, trace))
                if "raw" in cfg.modes:  # right after, on the same deltas
                    done += 1
                    if progress:
                        progress(f"run {rep + 1}/{cfg.reps}: raw", done, total)
                    runs["raw"].append(run_raw(model, cfg, trace))
            elif mode == "prefix":
                runs[mode].append(run_prefix(model, cfg))
            else:
                runs[mode].append(run_cold(model, cfg))
            done += 1
    if progress:
        progress("done", total, total)
    return summarize(model, cfg, runs)


def _identical(a: ModeRun, b: ModeRun) -> int:
    return sum(x == y for x, y in zip(a.replies, b.replies, strict=False))


def summarize(model: ModelFile, cfg: EvaConfig, runs: dict[str, list[ModeRun]]) -> dict[str, Any]:
    rows = []
    base = runs.get("stateful", [None])[0]
    for mode, rs in runs.items():
        if not rs:
            continue
        means = [r.mean_ttft_2_16 for r in rs]
        first = rs[0]
        checks = [c for c in first.checks if c is not None]
        rows.append(
            {
                "mode": mode,
                "evaluated_prompt_tokens": first.wake_tokens + sum(first.evaluated),
                "wire_chars": sum(first.wire_chars),
                "mean_ttft_ms_turns_2_16": statistics.median(means),
                "ttft_spread_ms": [min(means), max(means)],
                "mean_prefill_ms_turns_2_16": (
                    statistics.median(statistics.fmean(r.prefill_ms[1:]) for r in rs)
                    if first.prefill_ms
                    else None
                ),
                "retention_checks": None if mode == "raw" else [sum(checks), len(checks)],
                "replies_identical_to_stateful": (
                    None
                    if base is None or mode == "raw"
                    else [_identical(base, first), len(first.replies)]
                ),
                "runs_agree": all(r.replies == first.replies for r in rs),
            }
        )
    return {
        "experiment": "eva",
        "config": asdict(cfg) | {"n_ctx": _llama_config(cfg).n_ctx},
        "machine": machine_info(model, cfg),
        "system_prompt_tokens": runs["stateful"][0].wake_tokens if runs.get("stateful") else None,
        "rows": rows,
        "runs": {m: [asdict(r) for r in rs] for m, rs in runs.items()},
    }


def table_rows(result: dict[str, Any]) -> list[str]:
    """The markdown table of an eva result (header included), shared with the report."""
    lines = [
        "| mode | evaluated prompt tokens | wire characters | mean TTFT turns 2–16 "
        "| spread | retention checks | replies = stateful |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        rc = "—" if r["retention_checks"] is None else "{} / {}".format(*r["retention_checks"])
        same = r["replies_identical_to_stateful"]
        lines.append(
            f"| {r['mode']} | {r['evaluated_prompt_tokens']:,} | "
            f"{r['wire_chars']:,} | {r['mean_ttft_ms_turns_2_16']:.1f} ms | "
            f"{r['ttft_spread_ms'][0]:.1f}–{r['ttft_spread_ms'][1]:.1f} | {rc} | "
            f"{'—' if same is None else '{} / {}'.format(*same)} |"
        )
    return lines


def format_table(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"eva · {Path(result['machine']['model_path']).name} · {cfg['turns']} turns · "
        f"system prompt {result['system_prompt_tokens']} tokens · n_ctx {cfg['n_ctx']} · "
        f"{result['machine']['n_threads']} threads · median of {cfg['reps']} runs"
        + (" · stateful exact (WorkerConfig.exact)" if cfg.get("exact") else ""),
        "",
        *table_rows(result),
    ]
    by = {r["mode"]: r for r in result["rows"]}
    if "stateful" in by and "prefix" in by:
        s, p = by["stateful"]["mean_ttft_ms_turns_2_16"], by["prefix"]["mean_ttft_ms_turns_2_16"]
        lines.append("")
        lines.append(f"stateful vs prefix reuse: {p / s:.2f}x ({(1 - s / p) * 100:.1f}% less TTFT)")
    if "stateful" in by and "raw" in by:
        s, r = by["stateful"]["mean_ttft_ms_turns_2_16"], by["raw"]["mean_ttft_ms_turns_2_16"]
        lines.append(
            f"stateful vs raw llama_decode floor of the same deltas: +{s - r:.2f} ms "
            f"({(s / r - 1) * 100:.1f}% above the floor)"
        )
    return "\n".join(lines)
