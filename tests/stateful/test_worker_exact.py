"""A worker of its own made exact (``WorkerConfig(exact=True)``, as ``bench eva --exact``):
its context keeps a KV stream per sequence, each turn reuses the exact tokens — the last
reply decoded again in the turn's batch — and every reply is the one a cold prefill gives
(Gemma 3 270M, greedy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum import GenerationParams, LlamaConfig, ModelFile, ReusePolicy, Worker, WorkerConfig

pytestmark = pytest.mark.slow

TURNS = ("My name is Ada.", "I live in Lyon and work on compilers.", "What is my name?")


def test_an_exact_workers_turns_reuse_exact_kv_and_reply_as_cold(
    gemma: ModelFile, tmp_path: Path
) -> None:
    config = WorkerConfig(llama=LlamaConfig(n_ctx=2048, n_threads=2), exact=True)
    with Worker(gemma, config, store=tmp_path / "h.db") as w:
        assert w.seq.backend.config.unified is False  # type: ignore[attr-defined]
        system = "You are a helpful assistant. Remember the facts the user gives you."
        warm, cold = w.create_session(system), w.create_session(system)
        cold.policy = ReusePolicy.never()
        for text in TURNS:
            msg = [{"role": "user", "content": text}]
            a = warm.append(msg, GenerationParams(max_tokens=24))
            exact = w.seq.exact
            b = cold.append(msg, GenerationParams(max_tokens=24))
            assert a.tokens == b.tokens
            m = a.metrics  # the prompt is exact, the reply (a token at a time) is not
            assert exact == m.tokens_reused + m.prompt_tokens_evaluated
            assert a.metrics.tokens_reused > 0 and a.metrics.prompt_tokens_evaluated >= 8
        assert a.metrics.prompt_tokens_evaluated < b.metrics.prompt_tokens_evaluated
