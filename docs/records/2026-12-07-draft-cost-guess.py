#!/usr/bin/env python
"""How should a draft length nobody has timed yet be priced? Replayed over recorded replies.

:class:`continuum.backends.drafting.VerifyCost` learns what a call of k rows costs from the
calls a context makes. A length not timed yet must be guessed, and the guess decides whether it
is ever tried. The rule before this record drew a line from (1, 1) through the nearest timed
length: after a reply's first calls, all of 2 rows, it priced 17 rows along the 2-row call's
slope (on the AMD EPYC of 2026-12-07: 2 rows 1.85 steps, so 17 rows ~15 steps against the ~10
they cost), and ``bench speculative``'s JSON reply drafted one token a call for its whole first
run. The rule after: between two timed lengths, the line between them; past the longest, its
cost plus at most :data:`~continuum.backends.drafting.VerifyCost.PRIOR_ROW` a row (calls have a
fixed part, so cost grows slower than rows).

The replay runs :mod:`2026-12-07-draft-streak`'s greedy replies (its recorded file,
docs/results/draft-replay-qwen2.5-coder-0.5b.json) through prompt lookup, :class:`DraftLength`
and the streak rule, with a cost table *learnt* from the replay's own calls (each call costs
what the CPU's table says and is observed at that cost), under both rules: ``cold``, a new
table per reply (a fresh context), and ``warm``, one table across the ten replies (a server).
Printed: the speed-up over plain steps per reply, the geometric mean and the worst reply.

Usage: python docs/records/2026-12-07-draft-cost-guess.py
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

from continuum.backends.drafting import CLEAR_STREAK, MARGIN, DraftLength, PromptLookup, VerifyCost

_spec = importlib.util.spec_from_file_location(
    "draft_streak", Path(__file__).with_name("2026-12-07-draft-streak.py")
)
assert _spec is not None and _spec.loader is not None
streak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streak)

TABLES = {
    **streak.TABLES,
    # a throwaway timing of llama_decode with k rows' logits, 700 tokens resident, 2 threads, medians
    # of 6, weights not repacked (as continuum loads them)
    "epyc-2026-12-07": {1: 1.0, 2: 1.85, 4: 2.65, 6: 3.6, 9: 6.5, 17: 10.0},
}


class NearestLine(VerifyCost):
    """The rule before: an untimed length along the line from (1, 1) through the nearest
    timed one."""

    def steps(self, rows: int) -> float:
        step = self._seconds.get(1)
        timed = [k for k in self._seconds if k > 1]
        if rows <= 1:
            return 1.0
        if step is None or not timed:
            return 1.0 + self.PRIOR_ROW * (rows - 1)
        if rows in self._seconds:
            return self._seconds[rows] / step
        near = min(timed, key=lambda k: (abs(k - rows), k))
        per_row = (self._seconds[near] / step - 1.0) / (near - 1)
        return 1.0 + max(per_row, 0.0) * (rows - 1)


def replay(reply: dict[str, Any], table: dict[int, float], cost: VerifyCost) -> float:
    """One greedy reply drafted under ``cost`` (learning as it goes): its speed-up."""
    prompt, toks, lead = reply["prompt"], reply["tokens"], reply["margins"]
    n = len(toks)
    look = PromptLookup()
    look.reset(prompt)
    length = DraftLength(16, cost=cost)
    spent, i, inexact, held, clear = 0.0, 0, None, len(prompt), 0
    while i < n - 1:
        look.extend([toks[i]])
        g = length.next()
        guess = look.draft(g) if inexact is not None or clear >= CLEAR_STREAK else []
        if guess:
            c = streak.steps(table, len(guess) + 1)
            spent += c
            cost.observe(len(guess) + 1, c)
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
            held, i, clear = held + 1 + taken, i + 1 + taken, clear + taken
        else:
            spent, held, i = spent + 1.0, held + 1, i + 1
            cost.observe(1, 1.0)
        if i >= n:
            break
        if lead[i] >= MARGIN:
            clear += 1
        else:
            clear = 0
            if inexact is not None:  # a close call: the inexact stretch again, a step a token
                spent, inexact = spent + held - inexact, None
    return (n - 1) / spent


def main() -> None:
    replies = json.loads(streak.OUT.read_text())
    print("rule | table |", " | ".join(replies), "| geomean | worst")
    for name, table in TABLES.items():
        for rule, cls in (("nearest-line", NearestLine), ("guess-cheap", VerifyCost)):
            for warm in (False, True):
                shared = cls()
                sp = [replay(r, table, shared if warm else cls()) for r in replies.values()]
                geo = math.exp(sum(map(math.log, sp)) / len(sp))
                cells = " | ".join(f"{x:.2f}" for x in sp)
                mode = "warm" if warm else "cold"
                print(f"{rule} {mode} | {name} | {cells} | {geo:.3f} | {min(sp):.2f}")


if __name__ == "__main__":
    main()
