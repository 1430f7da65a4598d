"""The verified semantic tier on a stream of many wordings per answer (``bench semantic-verified
--sets ...,groups``): where each answer's own threshold can be learned.

The set (``data/semantic_groups.jsonl``, written by a helper who had seen no code, no design and
no other set): 30 groups of one request worded 12 ways (meaning 0) and 5 near misses worded
twice each (meanings 1-5: another number, entity, direction, scope or format; another answer).
Lines of one ``(group, meaning)`` share one right answer; any other answer is wrong.

The stream asks every line once, in a shuffled order. A request the tier does not serve is
answered cold and recorded; the promotion queue is drained after each request (the judge keeps
up). Each cold answer is a stand-in naming the line it answers unless answers are given (an
answer judge needs the model's real answers); a served answer is right when it was first given
to a line of the request's own ``(group, meaning)``. The first half is the warm-up; on the
second half: **repeat hits** (requests whose meaning was asked before in the stream, served
right), **wrong served** (of all measured requests, with the 95% Wilson interval) and the share
of served answers that were wrong (what ``delta`` bounds).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from continuum.bench.stats import wilson
from continuum.tiers.base import Hit, TierRequest, TierResult
from continuum.tiers.semantic import SemanticTier

DATA = Path(__file__).parent / "data" / "semantic_groups.jsonl"
GROUP_LINES = 22  # 12 wordings of meaning 0, two of each of five near misses

Row = dict[str, Any]


def load_groups(limit: int | None = None, seed: int = 0) -> list[Row]:
    """Every line; with ``limit``, the lines of ``max(1, limit // 22)`` groups (whole groups,
    chosen by a seeded shuffle)."""
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line]
    if limit is None:
        return rows
    ids = sorted({r["group"] for r in rows})
    random.Random(seed).shuffle(ids)
    kept = set(ids[: max(1, limit // GROUP_LINES)])
    return [r for r in rows if r["group"] in kept]


def stand_in(text: str) -> str:
    """The cold answer recorded for ``text`` when no model answers are given."""
    return f"[the answer to] {text}"


def run_groups_stream(
    tier: SemanticTier,
    rows: Sequence[Row],
    ask: Any,
    answers: dict[str, str] | None,
    seed: int,
) -> dict[str, Any]:
    """``ask(text) -> TierRequest``; ``answers``: each line's cold answer (None: stand-ins)."""
    order = list(rows)
    random.Random(seed).shuffle(order)
    warm = len(order) // 2

    def answer(text: str) -> str:
        return answers[text] if answers is not None else stand_in(text)

    origin: dict[str, tuple[int, int]] = {}  # an answer -> the meaning it was first given for
    asked: set[tuple[int, int]] = set()
    counts: Counter[str] = Counter()
    for i, row in enumerate(order):
        label = (row["group"], row["meaning"])
        request: TierRequest = ask(row["text"])
        got = tier.lookup(request)
        if isinstance(got, Hit):
            assert got.result is not None
            right = origin.get(got.result.text) == label
            if i >= warm:
                counts["right" if right else "wrong"] += 1
        else:
            text = answer(row["text"])
            origin.setdefault(text, label)
            tier.record(request, TierResult(text, (), "stop", 0))
            assert tier.promoter is not None
            tier.promoter.drain()
        if i >= warm:
            counts["measured"] += 1
            counts["repeats"] += label in asked
        asked.add(label)
    served = counts["right"] + counts["wrong"]
    return {
        "stream": len(order),
        "warm_up": warm,
        "measured": counts["measured"],
        "repeats": counts["repeats"],
        "served_right": counts["right"],
        "served_wrong": counts["wrong"],
        "repeat_hit_share": counts["right"] / max(counts["repeats"], 1),
        "wrong_share": counts["wrong"] / max(counts["measured"], 1),
        "wrong_ci95": wilson(counts["wrong"], counts["measured"]),
        "served_wrong_share": counts["wrong"] / served if served else None,
        "tier": tier.stats(),
    }


def judged_sweep(
    rows: Sequence[Row], known: dict[str, float | None], margins: Sequence[float]
) -> dict[str, Any]:
    """The judge on the pairs of ``rows`` it judged (``known``: margins by ``query\x1fstored``),
    by the truth of each pair: the share of same-meaning and of other-meaning pairs it
    accepts at each margin. Diagnostic: the stream used one margin, chosen elsewhere."""
    label = {r["text"]: (r["group"], r["meaning"]) for r in rows}
    same: list[float] = []
    other: list[float] = []
    for key, margin in known.items():
        a, _, b = key.partition("\x1f")
        if a in label and b in label:
            (same if label[a] == label[b] else other).append(-1e9 if margin is None else margin)
    sweep = []
    for m in margins:
        k = sum(x >= m for x in other)
        sweep.append(
            {
                "margin": m,
                "same_accepted": sum(x >= m for x in same) / max(len(same), 1),
                "other_accepted": k / max(len(other), 1),
                "other_accepted_ci95": wilson(k, len(other)),
            }
        )
    return {"same_pairs": len(same), "other_pairs": len(other), "sweep": sweep}
