"""``continuum bench prefill``: time to first token after the end of input, by message length.

One stateful session per run, primed with one exchange; then a message of about 10, 100 or
1,000 tokens arrives after the same idle gap (default 500 ms: a person reading, a tool running)
in three modes, alternated run by run:

``append``   eager glue off; the whole message is appended when it has fully arrived.
``eager``    eager glue on (the template tokens that open the next user turn are decoded in
             the idle gap); the whole message is appended when it has arrived.
``arrival``  eager glue on, and the message is fed as it arrives — at ``rate`` tokens/s (a tool
             streaming its output), in pieces of about one token — then committed.

With a llama-server binary, its two modes run as well (``bench/prefill_peer.py``): the whole
message sent when it has arrived, and the slot pre-warmed with the partial message while it
arrives, as a careful user of a request-based server would. Every run has the machine alone.

TTFT runs from the end of input (the ``append``/``commit`` call) to the first sampled token.
The reference floor is measured in the same run: one decode of the closing glue (the message's
end-of-turn and the reply header) at that context length, plus one decode step for the first
token — the least any engine must do after the last byte arrives.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.conversation import long_system_prompt
from continuum.bench.prefill_peer import PEERS, PeerPlan, peer_run
from continuum.bench.settings import PeerSettings
from continuum.params import GenerationParams
from continuum.settings import Sizes, setting
from continuum.stateful.worker import Worker, WorkerConfig

MODES = ("append", "eager", "arrival")
SYSTEM = "You are a concise assistant. Answer in one sentence."
FIRST = "Hello! I will paste some text next."


def _message(worker: Worker, n_tokens: int) -> str:
    """A message of about ``n_tokens`` tokens: prose cut at a word boundary."""
    text = long_system_prompt(max(64, n_tokens * 2)).replace("\n", " ")
    toks = worker.backend.tokenize(text)
    cut = worker.backend.detokenize(toks[:n_tokens])
    return cut[: cut.rfind(" ")] if " " in cut[-12:] else cut


def _pieces(worker: Worker, text: str) -> list[str]:
    """The message in pieces of about one token each (the way a tool's output streams)."""
    out, start = [], 0
    for tok in worker.backend.tokenize(text):
        piece = worker.backend.detokenize([tok])
        end = text.find(piece, start) + len(piece) if piece and piece in text[start:] else start
        if end > start:
            out.append(text[start:end])
            start = end
    if start < len(text):
        out.append(text[start:])
    return out


def _one(
    worker: Worker, mode: str, text: str, params: GenerationParams, idle_s: float, rate: float
) -> dict[str, Any]:
    s = worker.create_session(SYSTEM)
    s.append([{"role": "user", "content": FIRST}], params)
    time.sleep(idle_s)  # the same gap for every mode; eager glue runs in it when enabled
    worker.settle()
    if mode == "arrival":
        pieces = _pieces(worker, text)
        t0 = time.perf_counter()
        for i, piece in enumerate(pieces):
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            s.feed(piece)
        late_ms = (time.perf_counter() - (t0 + (len(pieces) - 1) / rate)) * 1000
        r = s.commit(params)
    else:
        late_ms = 0.0
        r = s.append([{"role": "user", "content": text}], params)
    m = r.metrics
    floor = _floor(worker, m.context_used or 0, r.tokens, params)  # a turn reports it
    worker.delete_session(s.id)  # its KV was disturbed by the floor measurement
    return {
        "ttft_ms": m.ttft_ms,
        "evaluated_after_input": m.prompt_tokens_evaluated,
        "fed_tokens": m.fed_tokens,
        "eager_used": m.eager_tokens_used,
        "feed_lag_ms": late_ms,  # how far the last feed ran behind the arrival schedule
        "floor_ms": floor,
        "text": r.text,
    }


def _floor(
    worker: Worker, context_used: int, reply: Sequence[int], params: GenerationParams
) -> float:
    """Decode the closing glue of the message just sent, then one token, at this context."""
    with worker.claim():  # idle work (eager glue) steps aside
        backend, seq = worker.backend, worker.seq
        gen_len = len(reply) - (0 if len(reply) < params.max_tokens else 1)
        prompt_end = context_used - gen_len
        glue = backend.tokenize("<end_of_turn>\n<start_of_turn>model\n")
        prompt = seq.tokens[:prompt_end]
        if prompt[-len(glue) :] != glue:  # another template: use its generation prompt
            glue = prompt[-5:]
        seq.truncate(prompt_end - len(glue))
        t0 = time.perf_counter()
        logits, _ = seq.decode(glue)
        assert logits is not None
        seq.decode([int(logits.argmax())])
        return (time.perf_counter() - t0) * 1000


class PrefillConfig(PeerSettings):
    """What a ``bench prefill`` run is told (its command line is generated from it)."""

    sizes: Sizes = setting((10, 100, 1000), "Message lengths.")
    idle_ms: int = setting(500, "The gap before the message, the same for every mode.", ge=0)
    rate: float = setting(200.0, "arrival mode: tokens per second the message arrives at.", ge=1)
    max_tokens: int = setting(8, "Most tokens in a reply.", ge=1)


def run_prefill(cfg: PrefillConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Every mode at every size, alternated; with ``llama_server``, its two modes as well
    (``bench/prefill_peer.py``). Each run has the machine to itself: continuum's worker is
    loaded for its run and closed after it, as the peer's server is."""
    mf = resolve_model(cfg.model)
    reps, sizes, idle_ms, rate = cfg.reps, cfg.sizes, cfg.idle_ms, cfg.rate
    max_tokens, llama_server = cfg.max_tokens, cfg.llama_server
    params = GenerationParams(max_tokens=max_tokens)
    n_ctx = max(2048, 2 * max(sizes) + 512)
    n_threads = LlamaConfig(n_threads=cfg.threads).threads()[0]
    modes = MODES + (PEERS if llama_server else ())
    rows = []
    total, done = reps * len(sizes) * len(modes), 0
    with tempfile.TemporaryDirectory() as tmp:

        def worker(eager: bool) -> Worker:
            cfg = LlamaConfig(n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads)
            return Worker(
                mf,
                WorkerConfig(llama=cfg, eager_glue=eager, session_snapshots=False),
                store=Path(tmp) / f"h{done}.db",
            )

        for size in sizes:
            with worker(True) as w:
                text = _message(w, size)
                n_tok = len(w.backend.tokenize(text))
                pieces = _pieces(w, text)
                fmt = w.backend.chat_format
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            for rep in range(reps):
                for mode in list(modes[rep % len(modes) :]) + list(modes[: rep % len(modes)]):
                    if progress:
                        progress(f"{size} tokens, run {rep + 1}/{reps}: {mode}", done, total)
                    if mode in PEERS:
                        assert llama_server is not None
                        peer = PeerPlan(
                            llama_server, mf, n_threads, n_ctx, max_tokens, idle_ms / 1000, rate
                        )
                        script = (SYSTEM, FIRST, text)
                        runs[mode].append(peer_run(mode, peer, fmt, script, pieces))
                    else:
                        with worker(mode != "append") as w:
                            runs[mode].append(_one(w, mode, text, params, idle_ms / 1000, rate))
                    done += 1
            rows += _rows(n_tok, runs)
    if progress:
        progress("done", total, total)
    return {
        "experiment": "prefill",
        "model_digest": mf.digest,
        "n_threads": n_threads,
        "reps": reps,
        "idle_ms": idle_ms,
        "rate_tps": rate,
        "max_tokens": max_tokens,
        "llama_server": bool(llama_server),
        "rows": rows,
    }


def _rows(n_tok: int, runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    ours = {r["text"] for m, rs in runs.items() if m not in PEERS for r in rs}
    rows = []
    for mode, rs in runs.items():
        ttfts = [r["ttft_ms"] for r in rs]
        floors = [r["floor_ms"] for r in rs if r.get("floor_ms") is not None]
        rows.append(
            {
                "message_tokens": n_tok,
                "mode": mode,
                "ttft_ms": statistics.median(ttfts),
                "ttft_spread_ms": [min(ttfts), max(ttfts)],
                "evaluated_after_input": statistics.median(
                    r["evaluated_after_input"] or 0 for r in rs
                ),
                "fed_tokens": statistics.median(r.get("fed_tokens", 0) for r in rs),
                "eager_used": statistics.median(r.get("eager_used", 0) for r in rs),
                "prewarm_requests": statistics.median(r.get("prewarm_requests", 0) for r in rs),
                "feed_lag_ms": max(r.get("feed_lag_ms", 0.0) for r in rs),
                "floor_ms": statistics.median(floors) if floors else None,
                # a peer decodes the same greedy reply only up to float noise: not compared
                "same_reply_all_modes": mode in PEERS or len(ours) == 1,
            }
        )
    return rows


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"prefill · TTFT after the end of input · {r['n_threads']} threads · idle gap "
        f"{r['idle_ms']} ms · arrival at {r['rate_tps']:.0f} tokens/s · median of {r['reps']}",
        "",
        "| message tokens | mode | TTFT after input | spread | decoded after input | "
        "fed before (peer: pre-warm requests) | glue+1 floor | TTFT / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    floors = {row["message_tokens"]: row["floor_ms"] for row in r["rows"] if row["floor_ms"]}
    for row in r["rows"]:
        floor = floors.get(row["message_tokens"])
        fed = row["fed_tokens"] or row.get("prewarm_requests", 0)
        lines.append(
            f"| {row['message_tokens']} | {row['mode']} | {row['ttft_ms']:.1f} ms | "
            f"{row['ttft_spread_ms'][0]:.0f}–{row['ttft_spread_ms'][1]:.0f} | "
            f"{row['evaluated_after_input']:.0f} | {fed:.0f} | "
            + (f"{floor:.1f} ms | {row['ttft_ms'] / floor:.2f} |" if floor else "— | — |")
        )
    same = all(row["same_reply_all_modes"] for row in r["rows"])
    lines.append("")
    lines.append(f"same reply in every mode and run: {'yes' if same else 'NO'}")
    return "\n".join(lines)
