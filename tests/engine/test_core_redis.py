"""Two processes sharing one Redis (``store=redis://…``): the memo results one process stored
serve the other, never another tenant, and the memo version is shared (DESIGN.md §3.10)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from continuum import Engine, GenerationParams, ModelFile, Session, TokenOp
from continuum.errors import StoreUnavailable
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_results import RedisResultStore
from continuum.tiers.memo import MemoEntry, MemoTier
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]


def child(url: str, namespace: str, passes: int) -> list[list[list[str]]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.engine.shared_child", url, namespace, str(passes)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: list[list[list[str]]] = json.loads(done.stdout)
    return out


def test_a_second_process_is_served_the_first_ones_results_and_no_tenant_anothers(
    redis_url: str,
) -> None:
    alone = child(redis_url + "x", "solo", 2)  # one process, its own prefix: the baseline
    solo_rate = sum(t == "memo" for t, _ in alone[1]) / len(alone[1])
    (first,) = child(redis_url, "acme", 1)
    (second,) = child(redis_url, "acme", 1)
    (other,) = child(redis_url, "globex", 1)  # the probe: same ops, another tenant
    assert "memo" not in [t for t, _ in first]
    shared_rate = sum(t == "memo" for t, _ in second) / len(second)
    assert solo_rate == 1.0 and shared_rate >= 0.95 * solo_rate
    assert [text for _, text in second] == [text for _, text in first]  # the stored answers
    assert "memo" not in [t for t, _ in other]  # cross-tenant hits: 0


def _entry(tier: MemoTier, key: str, text: str) -> MemoEntry:
    return MemoEntry(key, tier.version, text, (1, 2), "stop", 5)  # type: ignore[arg-type]


def test_the_memo_version_is_shared_and_only_grows(redis_url: str) -> None:
    a = MemoTier(shared=RedisResultStore(RedisTarget(redis_url)))
    b = MemoTier(shared=RedisResultStore(RedisTarget(redis_url)))
    a.put(_entry(a, "k", "old"))
    assert b.get("k") is not None and b.shared_hits == 1  # type: ignore[arg-type]
    assert a.bump_version(at_least=5) == 6  # a resumed run saved at version 5
    c = MemoTier(shared=RedisResultStore(RedisTarget(redis_url)))
    assert c.version == 6 and c.get("k") is None  # type: ignore[arg-type]
    assert b.bump_version() == 7  # b was at 1: it moves past the shared 6, not to 2


def test_an_unreachable_redis_degrades_the_memo_to_this_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "r").start()
    tier = MemoTier(shared=RedisResultStore(RedisTarget(server.url)))
    server.kill()
    with caplog.at_level(logging.WARNING):
        tier.put(_entry(tier, "k", "kept"))
        got = tier.get("k")  # type: ignore[arg-type]
        assert tier.get("absent") is None  # type: ignore[arg-type]
    assert got is not None and got.text == "kept"
    assert tier.shared_errors >= 1 and "serving from this process only" in caplog.text


def test_an_engine_on_an_unreachable_redis_fails_at_start(gemma: ModelFile) -> None:
    with pytest.raises(StoreUnavailable, match="start Redis"):
        Engine.open(model=gemma, n_ctx=1024, store=f"redis://127.0.0.1:{free_port()}/0")


def test_an_engine_serves_memo_hits_from_redis_after_a_restart(
    gemma: ModelFile, redis_url: str
) -> None:
    op = TokenOp("answer", prompt="The capital of France is", params=GenerationParams(max_tokens=6))
    runs: list[Any] = []
    for _ in range(2):  # two engines in turn: the second starts with an empty RAM memo
        with Session("t", model=gemma, n_ctx=1024, store=redis_url) as s:
            runs.append(s.run(op))
    assert [r.metrics.hit_tier for r in runs] == ["cold", "memo"]
    assert runs[0].text == runs[1].text
