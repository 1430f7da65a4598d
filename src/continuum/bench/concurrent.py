"""``continuum bench concurrent``: many agents at once against one server.

Each of N clients holds its own conversation: a system prompt of about ``system_tokens`` tokens
(its own: the first line names the agent), ``turns`` user turns, greedy streamed replies of up
to ``max_tokens`` tokens. All clients start together, and by default send the next request as
soon as a reply ends (an agent loop, no idle gap; ``idle_ms`` adds one).

Servers, each started for its run and stopped after it, so that one never runs beside another
(an idle server's spinning threads slow the one being measured); modes alternate run by run:

``continuum``     ``continuum serve`` in its own process, the sessions API: each turn sends only
                  the new message. It runs with serve's default lanes (``--parallel 4``), one
                  lane per client beyond four: the configuration a user gets, in which a
                  turn's eager glue rides in its own prefill (``--parallel 1``, one turn at a
                  time with the glue as its own batch, is slower with no idle gap); and
                  serve's ``--prefill-share`` as given (``oldest``, its default, or ``equal``).
``llama-server``  llama.cpp's server with one slot per client (``-np N``, ``id_slot``), at its
                  fastest flags here (``-fa off --swa-full``), ``cache_prompt``; each turn sends
                  the whole rendered transcript (full replay).

Measured at the clients: time to first token (request sent -> first content byte) over every
turn of every client, p50 and p95 (continuum's first turn includes the session's creation,
which prefills the system prompt); inter-token latency per turn, ``(last byte - first byte) /
(tokens - 1)``, p50; and total tokens per second: every client's generated tokens over the span
from the first request to the last reply. The same model file and thread count for both.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from continuum.backends.llamacpp import LlamaConfig, choose_chat_format
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.backends.step_plan import PrefillShare
from continuum.bench.conversation import TURNS, long_system_prompt, n_ctx_for
from continuum.bench.http import _free_port, _process, serve_command
from continuum.bench.http_client import sse
from continuum.bench.settings import PeerSettings
from continuum.settings import Counts, setting

MODES = ("continuum", "llama-server")
SERVE_LANES = 4  # `continuum serve --parallel`'s default (tests/bench keep the two equal)


def result_name(prefill_share: str, exact: bool = False) -> str:
    """The results file of a run with serve's ``--prefill-share``: ``concurrent.json`` for
    the default, ``concurrent-equal.json`` for ``equal`` (both render in the report); with
    serve's ``--exact``, ``-exact`` before the suffix."""
    name = "concurrent"
    if prefill_share != PrefillShare.OLDEST.value:
        name += f"-{prefill_share}"
    return f"{name}-exact.json" if exact else f"{name}.json"


RESULT_NAMES = [result_name(p.value) for p in PrefillShare]  # the default's first


def _stream(
    client: httpx.Client, url: str, body: dict[str, Any], *, counts_eos: bool = False
) -> dict[str, Any]:
    """POST a streamed completion; the client-side timings and the server's token count.
    ``counts_eos``: the server counts the end-of-generation token it sampled as a completion
    token (llama-server does; continuum does not): one less for a reply that ended on it, so
    both sides count the same tokens."""
    stamps: list[float] = []
    ttft, text, last = sse(client, url, body, stamps)
    usage = last.get("usage") or {}
    tokens = int(usage.get("completion_tokens") or len(stamps))
    if counts_eos and last.get("finish_reason") == "stop" and usage.get("completion_tokens"):
        tokens -= 1
    return {
        "ttft_ms": ttft,
        "itl_ms": (stamps[-1] - stamps[0]) * 1000 / (tokens - 1) if tokens > 1 and stamps else None,
        "tokens": tokens,
        "text": text,
    }


def _continuum_client(
    url: str, system: str, turns: int, max_tokens: int, idle: float, start: threading.Barrier
) -> list[dict[str, Any]]:
    out = []
    with httpx.Client(timeout=900) as client:
        start.wait()
        # the session's creation prefills the system prompt: it is part of the first turn,
        # as the first full request is for llama-server
        t0 = time.perf_counter()
        sid = client.post(f"{url}/v1/sessions", json={"system": system}).json()["id"]
        created_ms = (time.perf_counter() - t0) * 1000
        for i, turn in enumerate(TURNS[:turns]):
            if idle and i:
                time.sleep(idle)
            body = {
                "messages": [{"role": "user", "content": turn.content}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            r = _stream(client, f"{url}/v1/sessions/{sid}/messages", body)
            if i == 0:
                r["ttft_ms"] += created_ms
            out.append(r)
    return out


def _llama_server_client(
    url: str,
    system: str,
    turns: int,
    max_tokens: int,
    idle: float,
    start: threading.Barrier,
    slot: int,
    render: Callable[[list[Any]], str],
) -> list[dict[str, Any]]:
    out = []
    history: list[dict[str, str]] = [{"role": "system", "content": system}]
    with httpx.Client(timeout=900) as client:
        start.wait()
        for i, turn in enumerate(TURNS[:turns]):
            if idle and i:
                time.sleep(idle)
            history.append({"role": "user", "content": turn.content})
            body = {
                "prompt": render(history),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "cache_prompt": True,
                "id_slot": slot,
                "stream_options": {"include_usage": True},
            }
            r = _stream(client, f"{url}/v1/completions", body, counts_eos=True)
            history.append({"role": "assistant", "content": r["text"]})
            out.append(r)
    return out


def run_clients(
    n: int, target: Callable[[int, threading.Barrier], list[dict[str, Any]]]
) -> tuple[list[list[dict[str, Any]]], float]:
    """Run ``n`` clients at once; their turns and the span from the start to the last reply."""
    start = threading.Barrier(n + 1)
    results: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i, start)
        except BaseException as e:
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait(timeout=900)
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, time.perf_counter() - t0


class ConcurrentConfig(PeerSettings):
    """What a ``bench concurrent`` run is told (its command line is generated from it)."""

    clients: Counts = setting((1, 2, 4, 8), "Numbers of agents running at once, comma-separated.")
    turns: int = setting(6, "User turns in each agent's conversation.", ge=1, le=len(TURNS))
    max_tokens: int = setting(32, "Most tokens in a reply.", ge=1)
    system_tokens: int = setting(1000, "Each agent's system prompt, in tokens (about).", ge=0)
    idle_ms: int = setting(
        0, "Gap between a reply and the client's next request (0: an agent loop).", ge=0
    )
    prefill_share: Literal["oldest", "equal", "las"] = setting(
        "oldest",
        "continuum serve's --prefill-share (the results go to concurrent.json for oldest, "
        "concurrent-equal.json for equal).",
    )
    exact: bool = setting(
        False, "continuum serve runs with --exact (results in concurrent[-equal]-exact.json)."
    )


def _systems(n: int, system_tokens: int) -> list[str]:
    base = long_system_prompt(system_tokens)
    return [f"You are agent number {i + 1} of a team.\n{base}" for i in range(n)]


def _run(
    mode: str, n: int, mf: ModelFile, cfg: ConcurrentConfig, plan: dict[str, Any]
) -> dict[str, Any]:
    """One run of ``n`` clients; ``plan``: the threads, context and renderer of every run."""
    systems = _systems(n, cfg.system_tokens)
    turns, max_tokens, idle = cfg.turns, cfg.max_tokens, cfg.idle_ms / 1000
    port, threads, n_ctx = _free_port(), str(plan["threads"]), plan["n_ctx"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "continuum":
            args = serve_command(
                mf.path,
                port,
                threads,
                n_ctx,
                Path(tmp) / "h.db",
                "--parallel",
                str(max(n, SERVE_LANES)),
                "--max-queue",
                str(4 * n + 4),
                "--prefill-share",
                cfg.prefill_share,
                *(["--exact"] if cfg.exact else []),
            )

            def target(i: int, start: threading.Barrier) -> list[dict[str, Any]]:
                return _continuum_client(url, systems[i], turns, max_tokens, idle, start)
        else:
            args = [
                str(cfg.llama_server),
                "-m",
                str(mf.path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                str(n_ctx * n),
                "-np",
                str(n),
                "-t",
                threads,
                "-tb",
                threads,
                "-fa",
                "off",
                "--swa-full",
            ]
            render = plan["render"]

            def target(i: int, start: threading.Barrier) -> list[dict[str, Any]]:
                return _llama_server_client(
                    url, systems[i], turns, max_tokens, idle, start, i, render
                )

        with _process(args, f"{url}/health"):
            results, span = run_clients(n, target)
    return _summary(mode, n, results, span)


def percentiles(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p95) of ``values`` (not empty): the median, and the nearest-rank 95th."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def _summary(mode: str, n: int, results: list[list[dict[str, Any]]], span: float) -> dict[str, Any]:
    turns = [t for client in results for t in client]
    p50, p95 = percentiles([t["ttft_ms"] for t in turns])
    itl = [t["itl_ms"] for t in turns if t["itl_ms"] is not None]
    tokens = sum(t["tokens"] for t in turns)
    return {
        "mode": mode,
        "clients": n,
        "ttft_ms_p50": p50,
        "ttft_ms_p95": p95,
        "itl_ms_p50": statistics.median(itl) if itl else None,
        "tokens": tokens,
        "span_s": span,
        "tokens_per_s": tokens / span,
        "replies": [[t["text"] for t in client] for client in results],
    }


def run_concurrent(cfg: ConcurrentConfig, progress: Progress | None = None) -> dict[str, Any]:
    mf = resolve_model(cfg.model)
    n_threads = LlamaConfig(n_threads=cfg.threads).threads()[0]
    clients, reps, turns, max_tokens = cfg.clients, cfg.reps, cfg.turns, cfg.max_tokens
    modes = [m for m in MODES if m != "llama-server" or cfg.llama_server]
    fmt = choose_chat_format(mf, None, "", "")
    bos = "<bos>" if mf.info.architecture.startswith("gemma") else ""

    def render(history: list[Any]) -> str:
        text = fmt.render(history, add_generation_prompt=True)
        return text[len(bos) :] if bos and text.startswith(bos) else text

    plan = {
        "threads": n_threads,
        "render": render,
        "n_ctx": n_ctx_for(cfg.system_tokens + 16, turns, max_tokens),
    }
    runs: dict[str, list[dict[str, Any]]] = {}
    total, done = len(clients) * len(modes) * reps, 0
    for rep in range(reps):
        for n in clients:
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            for mode in order:
                if progress is not None:
                    progress(f"run {rep + 1}/{reps}: {mode}, {n} clients", done, total)
                runs.setdefault(f"{mode}/{n}", []).append(_run(mode, n, mf, cfg, plan))
                done += 1
    if progress is not None:
        progress("done", total, total)
    return {
        "experiment": "concurrent",
        "model_digest": mf.digest,
        "model": mf.path.name,
        "n_threads": n_threads,
        "n_ctx_per_conversation": plan["n_ctx"],
        "reps": reps,
        "turns": turns,
        "max_tokens": max_tokens,
        "system_tokens": cfg.system_tokens,
        "idle_ms": cfg.idle_ms,
        "prefill_share": cfg.prefill_share,
        "exact": cfg.exact,
        "rows": [_median_row(rs) for rs in runs.values()],
        "runs": runs,
    }


def _median_row(rs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("ttft_ms_p50", "ttft_ms_p95", "itl_ms_p50", "tokens_per_s")
    row = {"mode": rs[0]["mode"], "clients": rs[0]["clients"]}
    for k in keys:
        values = [r[k] for r in rs if r[k] is not None]
        row[k] = statistics.median(values) if values else None
    first = rs[0]["replies"]
    row["replies_equal_across_runs"] = all(r["replies"] == first for r in rs)
    return row


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"concurrent · {r['model']} · {r['n_threads']} threads · {r['turns']} turns of "
        f"{r['max_tokens']} tokens · ~{r['system_tokens']}-token system prompt each · idle "
        f"{r['idle_ms']} ms · continuum --prefill-share {share_of(r)}"
        f"{' --exact' if r.get('exact') else ''} · median of {r['reps']} "
        "(lowest–highest run in brackets)",
        "",
        "| clients | server | TTFT p50 | TTFT p95 | inter-token p50 | tokens/s, all clients "
        "| agent 1's replies as alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(r["rows"], key=lambda x: (x["clients"], x["mode"])):
        itl, runs = row["itl_ms_p50"], r["runs"][f"{row['mode']}/{row['clients']}"]
        lo, hi = spread(runs, "ttft_ms_p50")
        tlo, thi = spread(runs, "tokens_per_s")
        lines.append(
            f"| {row['clients']} | {row['mode']} | {row['ttft_ms_p50']:,.0f} ms "
            f"({lo:,.0f}–{hi:,.0f}) | {row['ttft_ms_p95']:,.0f} ms | "
            f"{'—' if itl is None else f'{itl:.1f} ms'} | {row['tokens_per_s']:.1f} "
            f"({tlo:.1f}–{thi:.1f}) | {_as_alone(r, row['mode'], row['clients'])} |"
        )
    return "\n".join(lines)


def share_of(r: dict[str, Any]) -> str:
    return str(r.get("prefill_share", "oldest"))  # results from before the option: oldest


def spread(runs: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """The lowest and highest of ``key`` over ``runs``."""
    values = [run[key] for run in runs]
    return min(values), max(values)


def paired(r: dict[str, Any], n: int, key: str, *, lower_is_better: bool) -> tuple[int, int]:
    """Over the reps with ``n`` agents, (how many continuum met llama-server's run of the
    same rep on ``key``, how many reps had both): runs of one rep are next to each other in
    time (the order alternates rep by rep), so slow spells of the machine hit both."""
    ours, peer = r["runs"].get(f"continuum/{n}", []), r["runs"].get(f"llama-server/{n}", [])
    pairs = list(zip(ours, peer, strict=False))
    met = sum((a[key] <= b[key]) if lower_is_better else (a[key] >= b[key]) for a, b in pairs)
    return met, len(pairs)


def _as_alone(r: dict[str, Any], mode: str, n: int) -> str:
    """How many of agent 1's turns, over every run with ``n`` agents, replied exactly as agent
    1 did alone (the 1-agent runs; its system prompt is the same in both): a batch of 8 rows
    or more, or a prompt's first token in a ubatch beside generated tokens, sums in another
    order, so a near-tie can flip a greedy choice (llama-server; continuum cuts its steps so
    that neither happens: continuum.backends.passes)."""
    alone = r["runs"].get(f"{mode}/1")
    if not alone or n == 1:
        return "—"
    ref = alone[0]["replies"][0]
    got = [run["replies"][0] for run in r["runs"].get(f"{mode}/{n}", [])]
    same = sum(a == b for replies in got for a, b in zip(replies, ref, strict=False))
    return f"{same}/{sum(len(replies) for replies in got)}"


def report_concurrent(lines: list[str], misses: list[str], r: dict[str, Any]) -> None:
    """The section of docs/benchmarks.md, and the goals it misses."""
    share = share_of(r)
    cmd = (
        f"continuum bench concurrent --clients {','.join(str(c) for c in _clients_of(r))} "
        f"--reps {r['reps']} --turns {r['turns']} --max-tokens {r['max_tokens']} "
        f"--system-tokens {r['system_tokens']}"
        + (f" --idle-ms {r['idle_ms']}" if r["idle_ms"] else "")
        + ("" if share == "oldest" else f" --prefill-share {share}")
        + " --llama-server PATH"
    )
    if share != "oldest":  # a variant, after the default's section
        lines += [
            f"### With `continuum serve --prefill-share {share}`",
            "",
            "The same load with prefill chunks in equal shares: prefills that start together "
            "end together, so the agents run in lockstep and their next turns share one step. "
            "The same goals; the misses below are listed too.",
            "",
            f"Model {r['model']}, {r['n_threads']} threads. Command: `{cmd}`",
            "",
            *format_table(r).splitlines()[2:],
            "",
            f"![concurrent, --prefill-share {share}]({Path(result_name(share)).stem}.png)",
            "",
        ]
        _misses(misses, r, f" (--prefill-share {share})")
        return
    lines += [
        "## Many agents at once",
        "",
        "Goal: TTFT p50 at or under llama-server's at every client count, and total tokens/s "
        "at or over it, with one slot per client on llama-server (full replay, `cache_prompt`), "
        f"continuum serve with its default {SERVE_LANES} lanes (one per client beyond "
        f"{SERVE_LANES}; each turn sends only the new message), and each server running "
        "alone. Both count the same tokens: llama-server's end-of-generation token is not "
        "counted as a reply token. A cell is the median over the runs, with the lowest and "
        "highest run in brackets; a miss below says in how many runs, paired by rep (the two "
        "runs of a rep are next to each other in time), continuum met the goal.",
        "",
        f"Model {r['model']}, {r['n_threads']} threads. Command: `{cmd}`",
        "",
        *format_table(r).splitlines()[2:],
        "",
        "`agent 1's replies as alone`: of agent 1's turns under load, those token for token "
        "as its turns alone. continuum decodes each step in the calls that keep every token "
        "as it comes out alone (`continuum.backends.passes`); llama-server's steps put 8 "
        "rows or more, or a prompt's first token beside generated ones, in one ubatch, which "
        "sums in another order, so a near-tie can flip. Per turn both decode the same 16-23 "
        "new prompt tokens; llama-server with its weights repacked for its matrix kernels "
        "(its default), continuum without: with repacked weights a prompt decoded in chunks "
        "gets other logits than in one batch, which would break the exactness of resumed "
        "sessions; it makes prompts of a few dozen tokens faster, so at one agent, where "
        "both do the same work, llama-server can lead on TTFT.",
        "",
        "![concurrent](concurrent.png)",
        "",
    ]
    _misses(misses, r, "")


def _misses(misses: list[str], r: dict[str, Any], variant: str) -> None:
    by = {(row["mode"], row["clients"]): row for row in r["rows"]}
    for n in _clients_of(r):
        ours, peer = by.get(("continuum", n)), by.get(("llama-server", n))
        if ours is None or peer is None:
            continue
        who = f"{n} agent{'s' if n > 1 else ''} at once{variant}"
        if ours["ttft_ms_p50"] > peer["ttft_ms_p50"]:
            misses.append(
                f"{who}: TTFT p50 {ours['ttft_ms_p50']:,.0f} ms vs llama-server's "
                f"{peer['ttft_ms_p50']:,.0f} ms (goal: at or under it); "
                + _against_spread(r, n, "ttft_ms_p50", "{:,.0f} ms", lower_is_better=True)
            )
        if ours["tokens_per_s"] < peer["tokens_per_s"]:
            misses.append(
                f"{who}: {ours['tokens_per_s']:.2f} tokens/s vs llama-server's "
                f"{peer['tokens_per_s']:.2f} (goal: at or over it); "
                + _against_spread(r, n, "tokens_per_s", "{:.2f}", lower_is_better=False)
            )
        if ours["itl_ms_p50"] > peer["itl_ms_p50"]:
            misses.append(
                f"{who}: inter-token p50 {ours['itl_ms_p50']:,.1f} ms vs llama-server's "
                f"{peer['itl_ms_p50']:,.1f} ms (no goal is set on it; a loss all the same); "
                + _against_spread(r, n, "itl_ms_p50", "{:,.1f} ms", lower_is_better=True)
            )


def _against_spread(r: dict[str, Any], n: int, key: str, fmt: str, *, lower_is_better: bool) -> str:
    """A miss set against the run-to-run spread: the paired count and both ranges."""
    met, reps = paired(r, n, key, lower_is_better=lower_is_better)
    (a, b), (c, d) = (spread(r["runs"][f"{m}/{n}"], key) for m in MODES)
    overlap = "overlap" if a <= d and c <= b else "do not overlap"
    return (
        f"continuum met it in {met} of {reps} runs paired by rep; the runs' ranges {overlap} "
        f"(continuum {fmt.format(a)}–{fmt.format(b)}, llama-server "
        f"{fmt.format(c)}–{fmt.format(d)})."
    )


def _clients_of(r: dict[str, Any]) -> list[int]:
    return sorted({row["clients"] for row in r["rows"]})
