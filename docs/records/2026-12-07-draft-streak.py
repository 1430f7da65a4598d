#!/usr/bin/env python
"""When should a run of drafts start? Replayed over recorded greedy replies (issue 41).

``record``: decode bench speculative's four tasks and six more replies plainly (greedy, one
token a step, Qwen2.5-Coder-0.5B, 2 threads) and keep each reply's tokens and, per choice, the
lead of the chosen token over the runner-up (writes docs/results/draft-replay-<model>.json).

``replay``: run :func:`continuum.backends.drafting.drafted_reply`'s rules over those replies
without the model: prompt lookup and :class:`DraftLength` as they are, a drafted token kept
while it is the reply's token with a clear lead, a close call while the KV is inexact paying
one step per token since the run began, and a call of k rows costing what ``bench draft-cost``
measured (two CPUs' tables). Printed: the speed-up over plain steps per reply for each
``streak`` (clear choices in a row before a run may start). The replay matched the bench where
both ran: edit-file 0.63x (bench 0.61x, 22 tokens decoded again in both), prose 0.97x (0.96x).

Usage: python docs/records/2026-12-07-draft-streak.py record|replay
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from continuum.backends.drafting import MARGIN, DraftLength, PromptLookup, VerifyCost
from continuum.bench.speculative import DOC, FILE, TASKS

OUT = Path(__file__).resolve().parents[1] / "results" / "draft-replay-qwen2.5-coder-0.5b.json"
FIX = (
    "```python\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
    "    return total / len(xs) + 1\n\n\ndef median(xs):\n    s = sorted(xs)\n    n = len(s)\n"
    "    mid = n // 2\n    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2\n```\n\n"
    "mean has a bug. Return the fixed file in one code block."
)
LOG = "\n".join(
    f"2026-12-01T10:{i:02d}:00Z worker-{i % 3} job={7000 + i} "
    f"status={'ok' if i % 5 else 'failed'} path=/var/jobs/{7000 + i}.json"
    for i in range(30)
)
MORE = {
    "explain-code": f"```python\n{FILE}```\n\nExplain in two sentences what step_4 and step_9 return.",
    "fix-bug": FIX,
    "log-question": LOG + "\n\nList the job ids that failed with their paths, one per line.",
    "config": "Write a YAML config for a web service with a name, a port, three routes and a "
    "database URL.",
    "story": "Tell a four-sentence story about a lighthouse keeper.",
    "json-subset": json.dumps(DOC, indent=2)
    + "\n\nReturn only the regions array as JSON, with every replicas count doubled.",
}
# one-row steps per call of k rows (bench draft-cost, 1,024 resident tokens, 2 threads)
TABLES = {
    "xeon-avx512": {1: 1.0, 2: 1.23, 4: 1.61, 8: 2.47, 16: 3.87, 17: 4.0},
    "avx2": {1: 1.0, 2: 1.84, 3: 2.77, 4: 2.72, 8: 5.05, 12: 6.32, 16: 8.44, 17: 8.9},
}


def record() -> None:
    from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
    from continuum.backends.models import resolve_model

    mf = resolve_model("qwen2.5-coder-0.5b")
    chats = {**TASKS, **{k: [{"role": "user", "content": v}] for k, v in MORE.items()}}
    out = {}
    with LlamaCppBackend(mf, LlamaConfig(n_ctx=4096, n_threads=2, n_threads_batch=2)) as b:
        for name, msgs in chats.items():
            b.clear()
            prompt = b.tokenize(b.chat_format.render(msgs, add_generation_prompt=True))
            logits, _ = b.decode(prompt)
            toks, leads = [], []
            for _ in range(400):
                row = np.array(logits, dtype=np.float32)
                best = int(row.argmax())
                top = row[best]
                row[best] = -np.inf
                toks.append(best)
                leads.append(float(top - row.max()))
                if b.is_eog(best):
                    break
                logits, _ = b.decode([best])
            out[name] = {"prompt": prompt, "tokens": toks, "margins": leads}
            print(name, len(prompt), len(toks), flush=True)
    OUT.write_text(json.dumps(out))


def steps(table: dict[int, float], k: int) -> float:
    ks = sorted(table)
    for lo, hi in zip(ks, ks[1:], strict=False):
        if lo <= k <= hi:
            return table[lo] + (table[hi] - table[lo]) * (k - lo) / (hi - lo)
    return table[ks[-1]]


class Fixed(VerifyCost):
    def __init__(self, table: dict[int, float]) -> None:
        super().__init__()
        self._seconds = {k: steps(table, k) for k in range(1, 18)}

    def observe(self, rows: int, seconds: float) -> None:
        pass


def replay(reply: dict, table: dict[int, float], streak_needed: int) -> float:
    prompt, toks, lead = reply["prompt"], reply["tokens"], reply["margins"]
    n = len(toks)
    look = PromptLookup()
    look.reset(prompt)
    length = DraftLength(16, cost=Fixed(table))
    cost, i, inexact, held, streak = 0.0, 0, None, len(prompt), 0
    while i < n - 1:
        look.extend([toks[i]])
        g = length.next()
        guess = look.draft(g) if inexact is not None or streak >= streak_needed else []
        if guess:
            cost += steps(table, len(guess) + 1)
            inexact = held if inexact is None else inexact
            taken = 0
            while (
                taken < len(guess)
                and i + 1 + taken < n
                and guess[taken] == toks[i + 1 + taken]
                and lead[i + 1 + taken] >= MARGIN
            ):
                taken += 1
            length.accepted(len(guess), taken)
            look.extend(guess[:taken])
            held, i, streak = held + 1 + taken, i + 1 + taken, streak + taken
        else:
            cost, held, i = cost + 1.0, held + 1, i + 1
        if i >= n:
            break
        if lead[i] >= MARGIN:
            streak += 1
        else:
            streak = 0
            if inexact is not None:
                cost, inexact = cost + held - inexact, None
    return (n - 1) / cost


def main() -> None:
    if sys.argv[1:] == ["record"]:
        record()
        return
    replies = json.loads(OUT.read_text())
    print("streak |", " | ".join(replies), "| geomean | worst")
    for name, table in TABLES.items():
        print(name)
        for s in (0, 4, 8, 12, 16, 20, 24):
            sp = [replay(r, table, s) for r in replies.values()]
            geo = math.exp(sum(map(math.log, sp)) / len(sp))
            print(f"{s:6d} |", " | ".join(f"{x:.2f}" for x in sp), f"| {geo:.3f} | {min(sp):.2f}")


if __name__ == "__main__":
    main()
