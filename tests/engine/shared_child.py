"""A second process on the same Redis: runs the bench questions and prints each op's hit tier.

``python -m tests.engine.shared_child URL NAMESPACE PASSES`` (JSON list of passes on stdout).
"""

from __future__ import annotations

import json
import sys

from continuum import GenerationParams, Session, TokenOp
from continuum.bench.tiers import QUESTIONS
from tests.conftest import model


def main(url: str, namespace: str, passes: int) -> None:
    params = GenerationParams(max_tokens=8)
    out = []
    with Session(namespace, model=model("gemma3-270m"), n_ctx=2048, store=url) as session:
        for _ in range(passes):
            tiers = []
            for q in QUESTIONS:
                op = TokenOp("answer", messages=({"role": "user", "content": q},), params=params)
                r = session.run(op)
                tiers.append([r.metrics.hit_tier, r.text])
            out.append(tiers)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
