"""``continuum bench sweep``: seed 000's conversation after system prompts of growing length.

The same 16-turn conversation as ``bench eva`` runs after a system prompt of about 0.5k, 2k, 4k,
8k and 16k tokens (the handbook of ``conversation.long_system_prompt``), n_ctx raised to fit
the whole conversation under continuum's high-water mark; every mode gets the same n_ctx.

Modes, alternated run by run (the order rotates each repetition so drift hits all of them):

``stateful``          continuum in process: a resident session, only the new message sent.
``prefix``            llama-cpp-python's ``Llama`` re-sent the full transcript (same-worker
                      longest-common-prefix reuse), as in ``bench eva``.
``cold``              full recompute, KV cleared before the turn. At long contexts a cold turn
                      costs tens of seconds, so it is timed on a stated sample: every turn up
                      to ``cold_full_upto`` tokens, turns 2, 9 and 16 above (cold TTFT grows
                      linearly with the turn's prompt, so their mean is the mean of turns
                      2-16), in every repetition up to ``cold_all_reps_upto`` tokens and in the
                      first one above. The transcript before a sampled turn is that
                      repetition's stateful replies (the same greedy text).
``delta``             ``continuum serve``'s session API over HTTP: only the new message.
``llama-cpp-python``  the full transcript re-sent to llama-cpp-python's server.
``llama-server``      the full transcript re-sent to llama.cpp's server at its fastest flags
                      here (``-fa off --swa-full``, prompt cache), when its path is given.

Over HTTP every mode waits ``idle_ms`` between a reply and the next message (continuum's eager
glue runs in that gap; the peers get the same gap). Reported per size and mode: mean TTFT of
turns 2-16 (median over repetitions, with the spread), evaluated prompt tokens over the whole
conversation, and wire bytes (HTTP request bodies).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llama_cpp import Llama

from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.bench import eva, http
from continuum.bench.conversation import TURNS, long_system_prompt, n_ctx_for

IN_PROCESS = ("stateful", "prefix", "cold")
OVER_HTTP = ("delta", "llama-cpp-python", "llama-server")
MODES = IN_PROCESS + OVER_HTTP


def default_modes(llama_server: bool) -> tuple[str, ...]:
    """What a sweep runs without ``--modes``: every mode, llama-server only with its binary."""
    return MODES if llama_server else tuple(m for m in MODES if m != "llama-server")


DEFAULT_SIZES = (512, 2048, 4096, 8192, 16384)


@dataclass(frozen=True, slots=True)
class SweepConfig:
    model: str | None = None
    sizes: tuple[int, ...] = DEFAULT_SIZES
    reps: int = 3
    n_threads: int | None = None
    max_tokens: int = 48
    turns: int = len(TURNS)
    modes: tuple[str, ...] = ("stateful", "prefix", "cold", "delta", "llama-cpp-python")
    llama_server: str | None = None
    idle_ms: int = 250
    cold_full_upto: int = 2048
    cold_all_reps_upto: int = 4096
    cold_sample: tuple[int, ...] = (2, 9, 16)

    def validate(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes must be among {', '.join(MODES)}; got {bad or 'none'}")
        if "cold" in self.modes and "stateful" not in self.modes:
            raise ValueError("cold replays the stateful run's transcript: include stateful")
        if "llama-server" in self.modes and not self.llama_server:
            raise ValueError("the llama-server mode needs --llama-server PATH")
        if self.reps < 1 or not self.sizes or min(self.sizes) < 1:
            raise ValueError("reps must be >= 1 and sizes positive token counts")
        if not 2 <= self.turns <= len(TURNS):
            raise ValueError(f"turns must be 2..{len(TURNS)}")

    def cold_turns(self, size: int) -> tuple[int, ...]:
        """The 1-based turn numbers cold recompute is timed on at this size."""
        if size <= self.cold_full_upto:
            return tuple(range(2, self.turns + 1))
        return tuple(sorted({min(t, self.turns) for t in self.cold_sample if t >= 2}))

    def cold_in_rep(self, size: int, rep: int) -> bool:
        return rep == 0 or size <= self.cold_all_reps_upto


@dataclass
class _Point:
    requested: int
    system_tokens: int
    n_ctx: int
    eva_runs: dict[str, list[eva.ModeRun]] = field(default_factory=dict)
    http_runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _count_tokens(model: ModelFile, text: str) -> int:
    vocab = Llama(str(model.path), vocab_only=True, verbose=False)
    try:
        return len(vocab.tokenize(text.encode(), add_bos=True, special=True))
    finally:
        vocab.close()


def _order(modes: tuple[str, ...], rep: int) -> list[str]:
    """This repetition's mode order: rotated by ``rep``; cold always right after stateful,
    whose replies it needs."""
    base = [m for m in modes if m != "cold"]
    k = rep % len(base)
    rotated = base[k:] + base[:k]
    out: list[str] = []
    for m in rotated:
        out.append(m)
        if m == "stateful" and "cold" in modes:
            out.append("cold")
    return out


def _check_fits(cfg: SweepConfig, model: ModelFile) -> None:
    """Refuse before any run, not after an hour of smaller sizes, a size whose conversation
    needs more context than the model was trained for."""
    trained = model.info.metadata.get(f"{model.info.architecture}.context_length")
    for size in cfg.sizes:
        need = n_ctx_for(size, cfg.turns, cfg.max_tokens)
        if isinstance(trained, int) and need > trained:
            raise ValueError(
                f"a {size}-token system prompt needs n_ctx {need}, above the {trained} tokens "
                f"{model.path.name} was trained for: choose smaller --sizes"
            )


def _total_runs(cfg: SweepConfig) -> int:
    return sum(
        sum(m != "cold" or cfg.cold_in_rep(size, rep) for m in _order(cfg.modes, rep))
        for size in cfg.sizes
        for rep in range(cfg.reps)
    )


def run_sweep(
    cfg: SweepConfig,
    progress: Progress | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the sweep; ``on_point`` gets the whole result so far after each size (so a long
    sweep can be written out as it goes)."""
    cfg.validate()
    model = resolve_model(cfg.model)
    _check_fits(cfg, model)
    points: list[_Point] = []
    total = _total_runs(cfg)
    done = 0
    result: dict[str, Any] = {}
    if progress:
        progress("warm-up (untimed)", 0, total)
    # one short untimed run first: the first timed run would otherwise pay for cold page
    # cache and CPU clocks that the later ones do not
    eva.run_stateful(model, eva.EvaConfig(model=cfg.model, n_threads=cfg.n_threads, turns=2))
    for size in cfg.sizes:
        system_tokens = _count_tokens(model, long_system_prompt(size))
        n_ctx = n_ctx_for(system_tokens, cfg.turns, cfg.max_tokens)
        point = _Point(size, system_tokens, n_ctx)
        points.append(point)
        done = _run_point(model, cfg, point, progress, done, total)
        result = _summarize(model, cfg, points)
        if on_point:
            on_point(result)
    if progress:
        progress("done", total, total)
    return result


def _run_point(
    model: ModelFile,
    cfg: SweepConfig,
    point: _Point,
    progress: Progress | None,
    done: int,
    total: int,
) -> int:
    """Every repetition of every mode at one size, into ``point``; returns the runs done so
    far (``done`` counted on)."""
    size = point.requested
    ecfg = eva.EvaConfig(
        model=cfg.model,
        reps=1,
        system_tokens=size,
        max_tokens=cfg.max_tokens,
        n_threads=cfg.n_threads,
        turns=cfg.turns,
        n_ctx=point.n_ctx,
    )
    for rep in range(cfg.reps):
        replies: list[str] = []
        for mode in _order(cfg.modes, rep):
            if mode == "cold" and not cfg.cold_in_rep(size, rep):
                continue
            if progress:
                progress(
                    f"{point.system_tokens:,}-token system prompt · run {rep + 1}/{cfg.reps}: "
                    f"{mode}",
                    done,
                    total,
                )
            if mode == "stateful":
                run = eva.run_stateful(model, ecfg)
                replies = run.replies
                point.eva_runs.setdefault(mode, []).append(run)
            elif mode == "prefix":
                point.eva_runs.setdefault(mode, []).append(eva.run_prefix(model, ecfg))
            elif mode == "cold":
                run = eva.run_cold(model, ecfg, cfg.cold_turns(size), replies)
                point.eva_runs.setdefault(mode, []).append(run)
            else:
                point.http_runs.setdefault(mode, []).append(_run_http_mode(cfg, point, mode))
            done += 1
    return done


def _run_http_mode(cfg: SweepConfig, point: _Point, mode: str) -> dict[str, Any]:
    """One run of one HTTP mode at this point's size, against a server started for it."""
    one = http.HttpConfig(
        model=cfg.model,
        reps=1,
        threads=cfg.n_threads,
        max_tokens=cfg.max_tokens,
        system_tokens=point.requested,
        llama_server=cfg.llama_server,
        turns=cfg.turns,
        idle_ms=cfg.idle_ms,
        modes=(mode,),
    )
    r = http.run_http(one, n_ctx=point.n_ctx)
    run: dict[str, Any] = r["runs"][mode][0]
    return run


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "mean_ttft_ms_turns_2_16": statistics.median(values),
        "ttft_spread_ms": [min(values), max(values)],
        "runs": len(values),
    }


def _point_rows(cfg: SweepConfig, p: _Point) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    stateful = p.eva_runs.get("stateful", [])
    base = stateful[0] if stateful else None
    for mode in cfg.modes:
        if mode in p.eva_runs:
            rs = p.eva_runs[mode]
            first = rs[0]
            row = {"mode": mode, **_spread([r.mean_ttft_2_16 for r in rs])}
            row["timed_turns"] = [n for n in first.turn_numbers if n >= 2]
            if mode == "cold" and base is not None:
                # cold evaluates every turn's prompt whole: over the conversation that is the
                # sum of the prompt lengths; the sampled turns show it (evaluated == prompt)
                row["evaluated_prompt_tokens"] = sum(base.prompt_tokens)
                row["evaluated_counted_from"] = "prompt lengths (timed turns evaluated whole)"
                row["sampled_turns_evaluated_whole"] = all(
                    ev == base.prompt_tokens[n - 1]
                    for ev, n in zip(first.evaluated, first.turn_numbers, strict=True)
                )
            else:
                row["evaluated_prompt_tokens"] = first.wake_tokens + sum(first.evaluated)
            row["wire_bytes"] = None  # in process: nothing crosses a wire
            row["replies_identical_to_stateful"] = (
                None
                if base is None
                else [
                    sum(
                        base.replies[n - 1] == text
                        for n, text in zip(first.turn_numbers, first.replies, strict=True)
                    ),
                    len(first.replies),
                ]
            )
            rows.append(row)
        elif mode in p.http_runs:
            hs = p.http_runs[mode]
            row = {"mode": mode, **_spread([statistics.fmean(h["ttft_ms"][1:]) for h in hs])}
            row["timed_turns"] = list(range(2, len(hs[0]["ttft_ms"]) + 1))
            ev = hs[0]["evaluated"]
            # continuum's count includes what it decoded ahead of a message (eager glue)
            early = sum(hs[0].get("decoded_early", ()))
            row["evaluated_prompt_tokens"] = None if None in ev else sum(ev) + early
            row["wire_bytes"] = sum(hs[0]["wire_bytes"])
            row["replies_identical_to_stateful"] = None  # the HTTP runs record no text
            rows.append(row)
    return rows


def _summarize(model: ModelFile, cfg: SweepConfig, points: list[_Point]) -> dict[str, Any]:
    return {
        "experiment": "sweep",
        "config": asdict(cfg) | {"llama_server": bool(cfg.llama_server)},
        "machine": eva.machine_info(model, eva.EvaConfig(n_threads=cfg.n_threads)),
        "points": [
            {
                "requested_tokens": p.requested,
                "system_prompt_tokens": p.system_tokens,
                "n_ctx": p.n_ctx,
                "cold_turns": list(cfg.cold_turns(p.requested)),
                "rows": _point_rows(cfg, p),
                "runs": {
                    **{m: [asdict(r) for r in rs] for m, rs in p.eva_runs.items()},
                    **p.http_runs,
                },
            }
            for p in points
        ],
    }


def cold_note(result: dict[str, Any]) -> str:
    """How cold recompute was sampled, in words (printed under every sweep table)."""
    c = result["config"]
    return (
        f"cold recompute is timed on every turn up to {c['cold_full_upto']:,} requested tokens "
        f"and on turns {', '.join(map(str, c['cold_sample']))} above (cold TTFT grows linearly "
        f"with the prompt, so their mean is the mean of turns 2-16); in every run up to "
        f"{c['cold_all_reps_upto']:,} tokens and in the first run above."
    )


def table_lines(result: dict[str, Any]) -> list[str]:
    """Two markdown tables: mean TTFT per size and mode; evaluated tokens and wire bytes."""
    points = result["points"]
    modes = [r["mode"] for r in points[0]["rows"]] if points else []
    lines = [
        "| system prompt tokens | n_ctx | " + " | ".join(modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for p in points:
        by = {r["mode"]: r for r in p["rows"]}
        cells = []
        for m in modes:
            r = by.get(m)
            if r is None:
                cells.append("—")
                continue
            lo, hi = r["ttft_spread_ms"]
            sample = "" if m != "cold" else f" (turns {_turns(r['timed_turns'])}, {r['runs']} run"
            sample += "" if m != "cold" else ("s)" if r["runs"] > 1 else ")")
            cells.append(f"{_ms(r['mean_ttft_ms_turns_2_16'])} [{_ms(lo)}–{_ms(hi)}]{sample}")
        lines.append(f"| {p['system_prompt_tokens']:,} | {p['n_ctx']:,} | {' | '.join(cells)} |")
    lines += [
        "",
        f"| system prompt tokens | mode | evaluated prompt tokens ({result['config']['turns']} "
        "turns) | wire bytes |",
        "|---|---|---|---|",
    ]
    for p in points:
        for r in p["rows"]:
            ev = r["evaluated_prompt_tokens"]
            evs = "not reported" if ev is None else f"{ev:,}"
            if r.get("evaluated_counted_from"):
                evs += " (prompt lengths)"
            wire = "in process" if r["wire_bytes"] is None else f"{r['wire_bytes']:,}"
            lines.append(f"| {p['system_prompt_tokens']:,} | {r['mode']} | {evs} | {wire} |")
    return lines


def _ms(x: float) -> str:
    return f"{x:,.0f} ms" if x >= 100 else f"{x:.1f} ms"


def _turns(ns: list[int]) -> str:
    if len(ns) > 2 and ns == list(range(ns[0], ns[-1] + 1)):
        return f"{ns[0]}–{ns[-1]}"
    return ", ".join(map(str, ns))


def format_table(result: dict[str, Any]) -> str:
    c, m = result["config"], result["machine"]
    lines = [
        f"context sweep · {Path(m['model_path']).name} · {c['turns']} turns · "
        f"{m['n_threads']} threads · median of {c['reps']} runs [spread] · mean TTFT turns 2–16 · "
        f"HTTP idle gap {c['idle_ms']} ms",
        "",
        *table_lines(result),
        "",
        cold_note(result),
    ]
    return "\n".join(lines)
