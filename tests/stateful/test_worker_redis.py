"""A session's history and KV in Redis (``store=redis://…``): another process — another worker
of a fleet — continues it, from the shared snapshot when the first closed cleanly (no prompt
token evaluated beyond the new message), or rebuilt from the shared history when it crashed."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from continuum.store.redis_client import RedisTarget

_PROCESS = """
import json, os, signal, sys
from continuum import GenerationParams, LlamaConfig, Worker, WorkerConfig
store, session_id, end = sys.argv[1], sys.argv[2], sys.argv[3]
params = GenerationParams(max_tokens=16)
cfg = WorkerConfig(llama=LlamaConfig(n_ctx=2048), eager_glue=False)
w = Worker("gemma3-270m", cfg, store=store)
if session_id == "new":
    s = w.create_session("You are Eva, a concise assistant.")
    for text in ["My name is Priya.", "I have a dog named Biscuit."]:
        s.append([{"role": "user", "content": text}], params)
    out = {"id": s.id, "tokens": w.seq.tokens, "history": s.history}
else:
    s = w.open_session(session_id)
    opened = list(w.seq.tokens)
    r = s.append([{"role": "user", "content": "What is my name?"}], params)
    out = {"opened": opened, "history": s.history, "metrics": r.metrics.to_dict(), "turn": r.turn,
           "new_tokens": r.metrics.prompt_tokens_evaluated}
print(json.dumps(out), flush=True)
if end == "crash":
    os.kill(os.getpid(), signal.SIGKILL)  # no close: nothing parked, nothing flushed
w.close()
"""


def worker_process(store: str, session_id: str, end: str = "close") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PROCESS, store, session_id, end],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == (-9 if end == "crash" else 0), done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.slow
def test_a_session_moves_to_another_worker_through_the_shared_snapshot(redis_url: str) -> None:
    first = worker_process(redis_url, "new")
    second = worker_process(redis_url, first["id"])
    opened = second["opened"]
    assert opened[: len(first["tokens"])] == first["tokens"]  # the same causal sequence
    m = second["metrics"]
    assert [r["reason"] for r in m["resets"]] == ["evicted"]
    assert "restored" in m["resets"][0]["detail"]
    assert m["tokens_reused"] == len(opened)  # nothing before the new message evaluated again
    assert second["history"][: len(first["history"])] == first["history"]
    assert second["turn"] == 3
    target = RedisTarget(redis_url)
    assert target.client.zcard(target.key("kv", "lru")) >= 1  # parked again at the second close


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_crashed_workers_session_is_rebuilt_from_the_shared_history(redis_url: str) -> None:
    first = worker_process(redis_url, "new", end="crash")
    second = worker_process(redis_url, first["id"])
    m = second["metrics"]
    assert second["history"][: len(first["history"])] == first["history"]  # no turn lost
    assert second["turn"] == 3
    (reset,) = m["resets"]
    assert reset["reason"] == "evicted" and "rebuilt from the history log" in reset["detail"]
    assert reset["tokens_rebuilt"] == len(second["opened"])  # visibly rebuilt, every token
    # and the rebuild reproduces the first worker's causal sequence, generated tokens included
    assert second["opened"][: len(first["tokens"])] == first["tokens"]


def test_a_session_another_worker_moved_on_is_reopened_not_refused(
    gemma: Any, make_worker: Any, redis_url: str
) -> None:
    from continuum import GenerationParams, ResetReason

    params = GenerationParams(max_tokens=6)
    a = make_worker(gemma, store=redis_url, eager_glue=False)  # type: ignore[arg-type]
    b = make_worker(gemma, store=redis_url, eager_glue=False)  # type: ignore[arg-type]
    s = a.create_session("You are Eva, a concise assistant.")
    s.append([{"role": "user", "content": "My name is Priya."}], params)
    b.open_session(s.id).append([{"role": "user", "content": "I live in Lisbon."}], params)
    again = a.open_session(s.id)  # a still holds turn 1 only: stale
    assert again is not s and s.closed
    r = again.append([{"role": "user", "content": "Where do I live?"}], params)
    assert r.turn == 3  # not a TurnConflict: the history b wrote is there
    assert [m["content"] for m in again.history if m["role"] == "user"] == [
        "My name is Priya.",
        "I live in Lisbon.",
        "Where do I live?",
    ]
    assert [x.reason for x in r.metrics.resets] == [ResetReason.EVICTED]
    assert a.open_session(s.id) is again  # up to date now: the same object
