"""``continuum bench prefill``: time to first token after the end of input, by message length.

One stateful session per run, primed with one exchange; then a message of about 10, 100 or
1,000 tokens arrives after the same idle gap (default 500 ms: a person reading, a tool running)
in three modes, alternated run by run:

``append``   eager glue off; the whole message is appended when it has fully arrived.
``eager``    eager glue on (the template tokens that open the next user turn are decoded in
             the idle gap); the whole message is appended when it has arrived.
``arrival``  eager glue on, and the message is fed as it arrives — at ``rate`` tokens/s (a tool
             streaming its output), in pieces of about one token — then committed.

TTFT runs from the end of input (the ``append``/``commit`` call) to the first sampled token.
The reference floor is measured in the same run: one decode of the closing glue (the message's
end-of-turn and the reply header) at that context length, plus one decode step for the first
token — the least any engine must do after the last byte arrives.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import resolve_model
from continuum.bench.conversation import long_system_prompt
from continuum.params import GenerationParams
from continuum.stateful.worker import Worker, WorkerConfig

Progress = Callable[[str, int, int], None]
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
    floor = _floor(worker, m.context_used, r.tokens, params)
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


def run_prefill(
    model: str | None = None,
    reps: int = 3,
    threads: int | None = None,
    sizes: Sequence[int] = (10, 100, 1000),
    idle_ms: int = 500,
    rate: float = 200.0,
    max_tokens: int = 8,
    modes: Sequence[str] = MODES,
    progress: Progress | None = None,
) -> dict[str, Any]:
    mf = resolve_model(model)
    params = GenerationParams(max_tokens=max_tokens)
    n_ctx = max(2048, 2 * max(sizes) + 512)
    rows = []
    total, done = reps * len(sizes) * len(modes), 0
    with tempfile.TemporaryDirectory() as tmp:
        workers = {
            eager: Worker(
                mf,
                WorkerConfig(
                    llama=LlamaConfig(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads),
                    eager_glue=eager,
                    session_snapshots=False,
                ),
                store=Path(tmp) / f"h{int(eager)}.db",
            )
            for eager in (False, True)
        }
        try:
            for size in sizes:
                text = _message(workers[True], size)
                n_tok = len(workers[True].backend.tokenize(text))
                runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
                for rep in range(reps):
                    order = list(modes[rep % len(modes) :]) + list(modes[: rep % len(modes)])
                    for mode in order:
                        if progress:
                            progress(f"{size} tokens, run {rep + 1}/{reps}: {mode}", done, total)
                        w = workers[mode != "append"]
                        runs[mode].append(_one(w, mode, text, params, idle_ms / 1000, rate))
                        done += 1
                texts = {r["text"] for rs in runs.values() for r in rs}
                for mode, rs in runs.items():
                    ttfts = [r["ttft_ms"] for r in rs]
                    rows.append(
                        {
                            "message_tokens": n_tok,
                            "mode": mode,
                            "ttft_ms": statistics.median(ttfts),
                            "ttft_spread_ms": [min(ttfts), max(ttfts)],
                            "evaluated_after_input": statistics.median(
                                r["evaluated_after_input"] for r in rs
                            ),
                            "fed_tokens": statistics.median(r["fed_tokens"] for r in rs),
                            "eager_used": statistics.median(r["eager_used"] for r in rs),
                            "feed_lag_ms": max(r["feed_lag_ms"] for r in rs),
                            "floor_ms": statistics.median(r["floor_ms"] for r in rs),
                            "same_reply_all_modes": len(texts) == 1,
                        }
                    )
        finally:
            for w in workers.values():
                w.close()
    if progress:
        progress("done", total, total)
    return {
        "experiment": "prefill",
        "model_digest": mf.digest,
        "n_threads": LlamaConfig(n_threads=threads).threads()[0],
        "reps": reps,
        "idle_ms": idle_ms,
        "rate_tps": rate,
        "max_tokens": max_tokens,
        "rows": rows,
    }


def format_table(r: dict[str, Any]) -> str:
    lines = [
        f"prefill · TTFT after the end of input · {r['n_threads']} threads · idle gap "
        f"{r['idle_ms']} ms · arrival at {r['rate_tps']:.0f} tokens/s · median of {r['reps']}",
        "",
        "| message tokens | mode | TTFT after input | spread | decoded after input | "
        "fed before | glue+1 floor | TTFT / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['message_tokens']} | {row['mode']} | {row['ttft_ms']:.1f} ms | "
            f"{row['ttft_spread_ms'][0]:.0f}–{row['ttft_spread_ms'][1]:.0f} | "
            f"{row['evaluated_after_input']:.0f} | {row['fed_tokens']:.0f} | "
            f"{row['floor_ms']:.1f} ms | {row['ttft_ms'] / row['floor_ms']:.2f} |"
        )
    same = all(row["same_reply_all_modes"] for row in r["rows"])
    lines.append("")
    lines.append(f"same reply in every mode and run: {'yes' if same else 'NO'}")
    return "\n".join(lines)
