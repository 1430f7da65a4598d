"""One engine on the real default model: sessions and ops share one model load and one
context, a session turn walks the result tiers, and the tiers see each other's state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from continuum import (
    Engine,
    EngineConfig,
    GenerationParams,
    MemoryGraph,
    ModelFile,
    ReusePolicy,
    TokenOp,
    UnknownBackend,
    WorkerConfig,
)
from continuum.backends.llamacpp_ops import LlamaCppOpBackend
from continuum.bench.conversation import long_system_prompt

GREEDY = GenerationParams(max_tokens=10)
SYSTEM = long_system_prompt(300)


def make_engine(mf: ModelFile, tmp: Path, **kw: Any) -> Engine:
    return Engine.open(
        model=mf,
        n_ctx=kw.pop("n_ctx", 4096),
        n_slots=kw.pop("n_slots", 3),
        config=EngineConfig(snapshot_dir=tmp / "layer"),
        worker=WorkerConfig(snapshot_dir=tmp / "snaps"),
        store=tmp / "history.db",
        **kw,
    )


@pytest.fixture
def engine(gemma: ModelFile, tmp_path: Path) -> Iterator[Engine]:
    e = make_engine(gemma, tmp_path)
    yield e
    e.close()


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_sessions_and_ops_share_one_model_and_one_context(
    gemma: ModelFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[object] = []
    contexts: list[object] = []
    real_load, real_init = llama_cpp.llama_model_load_from_file, llama_cpp.llama_init_from_model

    def load(*a: Any) -> Any:
        loads.append(a)
        return real_load(*a)

    def init(*a: Any) -> Any:
        contexts.append(a)
        return real_init(*a)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", load)
    monkeypatch.setattr(llama_cpp, "llama_init_from_model", init)
    with make_engine(gemma, tmp_path) as e:
        s = e.worker().create_session(SYSTEM)
        s.append(user("Name a colour."), GREEDY)
        e.run(TokenOp("answer", prompt="Hello", params=GREEDY), namespace="default")
        b = e.backend
        assert isinstance(b, LlamaCppOpBackend)
        assert e.worker().backend is b.llama  # the worker decodes into the ops' context
        assert e.worker().seq.seq not in (b.work, *range(2, 2 + b.n_slots))
    # one context; its weights loaded once, or not at all when this process holds them
    # already (the suite keeps each model's weights loaded: Weights.retained)
    assert len(loads) <= 1 and len(contexts) == 1


@pytest.mark.slow
def test_a_repeated_deterministic_turn_is_a_memo_hit_and_the_next_turn_catches_up(
    engine: Engine, gemma: ModelFile, tmp_path: Path
) -> None:
    w = engine.worker()
    a = w.create_session(SYSTEM)
    first = a.append(user("What is rule one?"), GREEDY)
    assert first.metrics.hit_tier == "prefix_kv"  # the wake prefix was resident
    assert first.metrics.tiers[0].tier == "memo" and first.metrics.tiers[0].outcome == "miss"
    b = w.create_session(SYSTEM)
    again = b.append(user("What is rule one?"), GREEDY)
    m = again.metrics
    assert m.hit_tier == "memo" and m.prompt_tokens_evaluated == 0
    assert again.text == first.text and again.tokens == first.tokens
    assert b.history[-1] == {"role": "assistant", "content": first.text}  # committed
    # the next turn decodes what the memo hit skipped and answers as a session that decoded
    # every turn would
    nxt = b.append(user("And rule two?"), GREEDY)
    assert nxt.metrics.hit_tier == "prefix_kv" and nxt.metrics.prompt_tokens_evaluated > 0
    with make_engine(gemma, tmp_path / "plain") as plain:
        ref = plain.worker().create_session(SYSTEM)
        ref.policy = ReusePolicy.threshold(min_len=1)
        ref.append(user("What is rule one?"), GREEDY)
        assert ref.append(user("And rule two?"), GREEDY).text == nxt.text


def test_sampled_turns_are_not_served_from_the_memo(engine: Engine) -> None:
    w = engine.worker()
    sampled = GenerationParams(max_tokens=6, temperature=0.9)
    w.create_session(SYSTEM).append(user("Say a word."), sampled)
    r = w.create_session(SYSTEM).append(user("Say a word."), sampled)
    assert r.metrics.hit_tier != "memo" and r.metrics.prompt_tokens_evaluated > 0
    assert r.metrics.tiers[0].outcome == "skipped" and r.metrics.tiers[0].reason


def test_policy_never_on_a_session_recomputes_everything(engine: Engine) -> None:
    w = engine.worker()
    s = w.create_session(SYSTEM)
    s.append(user("Name a river."), GREEDY)
    s.policy = ReusePolicy.never()
    r = s.append(user("Name a lake."), GREEDY)
    assert r.metrics.hit_tier == "cold" and r.metrics.tokens_reused == 0
    assert r.metrics.prompt_tokens_evaluated > 300  # the whole prompt, system included
    assert [t.tier for t in r.metrics.tiers] == ["prefix_kv", "layer_kv"]  # no result tier


def test_an_op_reuses_a_resident_sessions_wake_prefix_and_equals_cold(engine: Engine) -> None:
    s = engine.worker().create_session(SYSTEM)
    s.tenant = "default"
    op = TokenOp(
        "answer",
        messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}),
        params=GREEDY,
    )
    r = engine.run(op, namespace="default")
    wake = len(s.wake_tokens(SYSTEM))
    assert r.metrics.hit_tier == "prefix_kv" and r.metrics.tokens_reused >= wake - 8
    cold = engine.run(op, namespace="default", policy=ReusePolicy.never())
    assert cold.text == r.text
    other = engine.run(op, namespace="another-tenant")  # never another tenant's sequence
    assert other.metrics.hit_tier == "cold"


@pytest.mark.slow
def test_an_op_that_needs_the_room_parks_the_session_which_comes_back(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with make_engine(gemma, tmp_path, n_ctx=2048, n_slots=1) as e:
        s = e.worker().create_session(long_system_prompt(900))
        first = s.append(user("What is rule one?"), GREEDY)
        big = TokenOp("answer", prompt=long_system_prompt(1400), params=GREEDY)
        e.run(big, namespace="default")  # does not fit next to the session: it is parked
        assert e.worker().seq.tokens == []
        r = s.append(user("And rule two?"), GREEDY)
        assert r.metrics.hit_tier == "layer_kv" and r.metrics.tokens_reused > 900
        assert {"tier": "layer_kv", "outcome": "hit", "source": "ram"}.items() <= (
            r.metrics.tiers[-1].to_dict().items()
        )
        assert first.metrics.context_used < r.metrics.context_used


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_the_memory_graph_answers_a_session_turn_in_a_later_run(
    gemma: ModelFile, tmp_path: Path
) -> None:
    graph_path = tmp_path / "graph.db"
    with make_engine(gemma, tmp_path / "one", graph=MemoryGraph(graph_path)) as e:
        s = e.worker().create_session(SYSTEM)
        first = s.append(user("What is rule one?"), GREEDY)
        assert first.metrics.hit_tier == "prefix_kv"
    with make_engine(gemma, tmp_path / "two", graph=MemoryGraph(graph_path)) as e:
        s = e.worker().create_session(SYSTEM)
        again = s.append(user("What is rule one?"), GREEDY)
        assert again.metrics.hit_tier == "memory_graph"
        assert again.metrics.prompt_tokens_evaluated == 0 and again.text == first.text


def test_an_unknown_backend_name_is_a_typed_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownBackend) as e:
        Engine.open(backend="vllm-typo")
    assert "llamacpp" in str(e.value) and "openai_http" in str(e.value)


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_an_op_restores_a_parked_sessions_wake_prefix_and_equals_cold(engine: Engine) -> None:
    w = engine.worker()
    s = w.create_session(SYSTEM, tenant="t1")
    s.append(user("Name a colour."), GREEDY)
    w.park_active()  # its KV is a snapshot now: a layer KV entry under its wake prefix
    wake = s.wake_tokens(SYSTEM)
    ref = engine.layer.index.get("t1", wake)
    assert ref is not None and ref.borrowed
    op = TokenOp(
        "answer",
        messages=({"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi."}),
        params=GREEDY,
    )
    r = engine.run(op, namespace="t1")
    m = r.metrics
    assert m.hit_tier == "layer_kv" and m.tokens_reused == min(len(wake), m.prompt_tokens - 8)
    assert m.tier("layer_kv").source == "ram"
    assert engine.run(op, namespace="t1", policy=ReusePolicy.never()).text == r.text
    assert engine.run(op, namespace="t2").metrics.hit_tier == "cold"  # never another tenant's
    # the session comes back from its snapshot unharmed, and its entry leaves the index
    nxt = s.append(user("And another?"), GREEDY)
    assert nxt.metrics.prompt_tokens_evaluated < 40
    assert engine.layer.index.get("t1", wake) is None


def test_an_engine_without_prefix_slots_still_serves_ops_and_sessions(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with make_engine(gemma, tmp_path, n_slots=0) as e:
        s = e.create_session(SYSTEM)
        assert s.append(user("Name a colour."), GREEDY).text
        op = TokenOp("answer", prompt="Hello there, how are you?", params=GREEDY)
        first = e.run(op, namespace="default")
        assert first.metrics.hit_tier == "cold" and len(e.prefix or ()) == 0  # nothing pinned
        assert e.run(op, namespace="default").metrics.hit_tier == "memo"


def test_a_stateless_conversation_reuses_the_reply_it_sends_back(engine: Engine) -> None:
    chat: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}, *user("Name a colour.")]
    first = engine.run(TokenOp("chat", messages=tuple(chat), params=GREEDY), namespace="t")
    chat += [{"role": "assistant", "content": first.text}, *user("And another one?")]
    op = TokenOp("chat", messages=tuple(chat), params=GREEDY)
    second = engine.run(op, namespace="t")
    # the slot holds the first prompt and its reply as generated: the reply sent back as the
    # assistant message is not decoded again (up to where its re-tokenisation differs)
    assert second.metrics.hit_tier == "prefix_kv"
    assert second.metrics.tokens_reused > first.metrics.prompt_tokens + len(first.tokens) // 2
    assert engine.run(op, namespace="t", policy=ReusePolicy.never()).text == second.text
