"""llama-server as ``bench speculative``'s peer: its own drafting from the context
(``--spec-type ngram-*``, each of the five at its default lengths) against its plain decoding.

Each (mode, repetition) starts llama-server alone, with the flags it is fastest with here
(``-fa off --swa-full -np 1``, the same threads and model file) and, for a drafting mode,
``--spec-type TYPE``; every task's prompt (rendered by our chat template, as the in-process run
decodes it) is sent to its native ``/completion`` endpoint with the run's temperature (greedy
at 0; sampled with the repetition's seed and no top-k, top-p or min-p cut, as ours samples) and
``n_predict`` the run's ``max_tokens``. The modes' order rotates by repetition. The decode rate
is the server's own ``timings.predicted_per_second`` (tokens generated over the time from the
end of the prompt to the last token: the span the in-process rate is taken over, give or take
the first token), and ``draft_n`` / ``draft_n_accepted`` say what its drafts kept.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import httpx

from continuum.backends.models import ModelFile
from continuum.backends.progress import Progress
from continuum.bench.http import _free_port, _process
from continuum.params import GenerationParams

SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
PLAIN = "plain"


def _args(server: str, mf: ModelFile, port: int, threads: int, mode: str) -> list[str]:
    args = [server, "-m", str(mf.path), "--host", "127.0.0.1", "--port", str(port)]
    args += ["-c", "4096", "-np", "1", "-t", str(threads), "-tb", str(threads)]
    args += ["-fa", "off", "--swa-full"]
    return args if mode == PLAIN else [*args, "--spec-type", mode]


def _reply(client: httpx.Client, url: str, prompt: str, params: GenerationParams) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": params.max_tokens,
        "temperature": params.temperature,
        "cache_prompt": False,
        "return_tokens": True,
    }
    if params.temperature > 0:  # its samplers as ours: temperature alone, the same seed
        body.update(seed=params.seed, top_k=0, top_p=1.0, min_p=0.0)
    got = client.post(f"{url}/completion", json=body)
    got.raise_for_status()
    data = got.json()
    timings = data["timings"]
    return {
        "tokens": list(data.get("tokens") or ()),
        "decode_tok_s": float(timings["predicted_per_second"]),
        "drafted": int(timings.get("draft_n") or 0),
        "accepted": int(timings.get("draft_n_accepted") or 0),
    }


def run_peer(
    server: str,
    mf: ModelFile,
    threads: int,
    prompts: dict[str, str],
    each_rep: Sequence[GenerationParams],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every mode's replies to every task's prompt, once per repetition's parameters in
    ``each_rep`` (its temperature, seed and length), each mode's server alone."""
    reps = len(each_rep)
    modes = (PLAIN, *SPEC_TYPES)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        m: {task: [] for task in prompts} for m in modes
    }
    done = 0
    for rep in range(reps):
        for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
            if progress:
                progress(f"llama-server {mode}, run {rep + 1}", done, reps * len(modes))
            port = _free_port()
            url = f"http://127.0.0.1:{port}"
            with (
                _process(_args(server, mf, port, threads, mode), f"{url}/health"),
                httpx.Client(timeout=600) as client,
            ):
                for task, prompt in prompts.items():
                    runs[mode][task].append(_reply(client, url, prompt, each_rep[rep]))
            done += 1
    rows = [_row(task, runs) for task in prompts]
    for by_task in runs.values():  # kept: each reply's length, not its token ids
        for replies in by_task.values():
            for r in replies:
                r["tokens"] = len(r["tokens"])
    return {"modes": list(modes), "rows": rows, "runs": runs}


def _row(task: str, runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    plain = runs[PLAIN][task]
    rates = {m: statistics.median(r["decode_tok_s"] for r in runs[m][task]) for m in runs}
    best = max(SPEC_TYPES, key=lambda m: rates[m])
    drafted = sum(r["drafted"] for r in runs[best][task])
    return {
        "task": task,
        "tokens": len(plain[0]["tokens"]),
        "plain_tok_s": rates[PLAIN],
        "tok_s": {m: rates[m] for m in SPEC_TYPES},
        "best": best,
        "best_tok_s": rates[best],
        "speedup": rates[best] / rates[PLAIN] if rates[PLAIN] else float("nan"),
        "accepted_share": sum(r["accepted"] for r in runs[best][task]) / drafted
        if drafted
        else 0.0,
        "same_tokens": _same(plain, runs[best][task]),
        "runs": len(plain),
    }


def _same(plain: Sequence[dict[str, Any]], drafted: Sequence[dict[str, Any]]) -> int:
    return sum(p["tokens"] == d["tokens"] for p, d in zip(plain, drafted, strict=True))


def peer_lines(peer: dict[str, Any]) -> list[str]:
    """The peer's table: its plain rate, each drafting mode's, and its best."""
    head = " | ".join(SPEC_TYPES)
    lines = [
        f"| task | reply tokens | plain tok/s | {head} | best | speed-up | kept | same tokens |",
        "|---|---:|---:|" + "---:|" * len(SPEC_TYPES) + "---|---:|---:|---:|",
    ]
    for row in peer["rows"]:
        rates = " | ".join(f"{row['tok_s'][m]:.1f}" for m in SPEC_TYPES)
        lines.append(
            f"| {row['task']} | {row['tokens']} | {row['plain_tok_s']:.1f} | {rates} | "
            f"{row['best']} | {row['speedup']:.2f}x | {row['accepted_share']:.0%} | "
            f"{row['same_tokens']}/{row['runs']} |"
        )
    return lines
