"""An engine whose sessions run on lanes decoded together (``WorkerConfig(parallel=2)``), on the
real model (Gemma 3 270M): the lanes are a context apart on the same weights; stateless ops on
the engine's own context run between the lanes' steps and answer as they do alone; a parked
session's snapshot still serves the ops as layer KV."""

from __future__ import annotations

import threading
from pathlib import Path

from continuum import (
    Engine,
    EngineConfig,
    GenerationParams,
    ModelFile,
    ReusePolicy,
    TokenOp,
    WorkerConfig,
)
from continuum.bench.conversation import long_system_prompt

GREEDY = GenerationParams(max_tokens=16)
SYSTEM = long_system_prompt(300)


def _engine(mf: ModelFile, tmp: Path) -> Engine:
    return Engine(
        model=mf,
        n_ctx=2048,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp / "layer"),
        worker=WorkerConfig(snapshot_dir=tmp / "snaps", parallel=2),
        store=tmp / "history.db",
    )


def test_ops_and_two_sessions_at_once_on_one_set_of_weights(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        llama = e.backend.llama  # type: ignore[attr-defined]
        assert w.backend is not llama and w.backend.config.kv_unified is False
        assert w.backend.n_ctx == llama.n_ctx  # each lane has the context's room
        op = TokenOp("answer", prompt="The capital of France is", params=GREEDY)
        alone = e.run(op, namespace="ops", policy=ReusePolicy.never()).text
        sessions = [w.create_session(f"{SYSTEM} Agent {i}.") for i in range(2)]
        out: dict[str, str] = {}

        def talk(i: int) -> None:
            r = sessions[i].append([{"role": "user", "content": "Name three rivers."}], GREEDY)
            out[f"s{i}"] = r.text

        def ask() -> None:
            out["op"] = e.run(op, namespace="ops", policy=ReusePolicy.never()).text

        threads = [threading.Thread(target=talk, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=ask))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert out["op"] == alone and out["s0"] and out["s1"]
        assert e._live("default") == []  # lanes share no cells with the ops


def test_a_parked_lanes_snapshot_is_not_offered_to_the_ops_context(
    gemma: ModelFile, tmp_path: Path
) -> None:
    """A lane's state comes from a cache of one stream per lane, which llama.cpp will not load
    into the ops' unified cache: parked sessions are no layer KV entries for ops here (their
    context configs differ, so a snapshot is never tried against the other context)."""
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        assert w.backend.context_config() != e.backend.llama.context_config()  # type: ignore[attr-defined]
        s = w.create_session(SYSTEM, tenant="t1")
        s.append([{"role": "user", "content": "Name a colour."}], GREEDY)
        w.park_active()
        assert s.lane is None and e.layer.index.get("t1", s.wake_tokens(SYSTEM)) is None
        op = TokenOp(
            "answer",
            messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}),
            params=GREEDY,
        )
        r = e.run(op, namespace="t1")
        assert r.metrics.hit_tier == "cold"
        assert e.run(op, namespace="t1", policy=ReusePolicy.never()).text == r.text
        again = s.append([{"role": "user", "content": "Another?"}], GREEDY)
        assert again.metrics.hit_tier == "layer_kv"  # it came back from its own snapshot
