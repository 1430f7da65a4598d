"""An exact engine (``EngineConfig(exact=True)``) answers every reuse hit exactly as a cold
prefill of the whole prompt does, on the real default model and on Gemma 3 270M: random
prompts, random suffixes of 1-64 tokens after the shared part, and every way the KV arrives —
a prefix slot, the last op's lane, a layer-KV snapshot, an op after an op's reply (the agent
loop), a session's next turn, a live session's tokens, a parked session brought back. Greedy
replies and the KV they leave are compared with cold, with no near-tie allowance; the tier
that served is checked too, so a pass cannot come from no reuse at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from continuum import Engine, EngineConfig, GenerationParams, ReusePolicy, TokenOp, WorkerConfig
from continuum.backends.base import SequenceView
from continuum.bench.conversation import long_system_prompt
from tests.conftest import model

pytestmark = pytest.mark.slow

MODELS = ("qwen2.5-coder-0.5b", "gemma3-270m")
GREEDY = GenerationParams(max_tokens=12)
WORDS = ("ledger", "river", "copper", "seven", "ship", "north", "quiet", "invoice", "table")
EXAMPLES = settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),  # a failure is reported as found, not shrunk
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_ns = itertools.count()
TempPaths = pytest.TempPathFactory


@pytest.fixture(scope="module", params=MODELS)
def slots(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp("slots")
    config = EngineConfig(exact=True, snapshot_dir=tmp / "layer")
    with Engine.open(
        model=model(request.param), n_ctx=2048, n_threads=2, n_slots=2, config=config
    ) as e:
        yield e


@pytest.fixture(scope="module", params=MODELS)
def lanes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp("lanes")
    with Engine.open(
        model=model(request.param),
        n_ctx=2048,
        n_threads=2,
        config=EngineConfig(exact=True, snapshot_dir=tmp / "layer"),
        worker=WorkerConfig(snapshot_dir=tmp / "snaps", parallel=2),
        store=tmp / "history.db",
    ) as e:
        yield e


def _text(data: st.DataObject, lo: int, hi: int, label: str) -> str:
    n = data.draw(st.integers(lo, hi), label=f"{label} words")
    return " ".join(data.draw(st.lists(st.sampled_from(WORDS), min_size=n, max_size=n)))


def _shared(data: st.DataObject) -> str:
    start = data.draw(st.integers(0, 2000), label="prompt offset")
    return long_system_prompt(600)[start : start + data.draw(st.integers(400, 1200))]


def _op(prompt: str) -> TokenOp:
    return TokenOp("answer", prompt=prompt, params=GREEDY)


def _kv(e: Engine, op: TokenOp) -> tuple[int, bytes]:
    """The sequence that holds ``op``'s prompt and reply, and its KV state as bytes."""
    llama = e.backend.llama  # type: ignore[attr-defined]
    prompt = e.backend.prompt_tokens(op.messages, op.prompt)  # type: ignore[attr-defined]
    held = [
        s for s in range(llama.config.n_seq_max) if llama.seq_tokens(s)[: len(prompt)] == prompt
    ]
    seq = max(held, key=lambda s: len(llama.seq_tokens(s)))
    return seq, bytes(llama.save_state(seq))


def _same_kv(seq: SequenceView, a: bytes, b: bytes) -> bool:
    """Whether two states of ``seq``'s tokens hold the same KV. A state names the KV stream it
    was taken from, so each is loaded into ``seq`` and taken again; ``b`` is left there."""
    tokens, again = list(seq.tokens), []
    for state in (a, b):
        seq.load_state(state, tokens)
        again.append(seq.save_state())
    return again[0] == again[1]


def _same_as_cold(e: Engine, op: TokenOp, ns: str, tiers: tuple[str, ...]) -> None:
    """``op`` served from reused KV gives the reply, and leaves the KV (its prompt's and its
    reply's, so every logit they were computed with), that reusing nothing gives."""
    hit = e.run(op, namespace=ns)
    _, warm = _kv(e, op)
    cold = e.run(op, namespace=f"{ns}-cold", policy=ReusePolicy.never())
    assert hit.metrics.hit_tier in tiers, hit.metrics
    assert hit.metrics.prompt_tokens_evaluated >= 8  # a whole batch after the reused KV
    assert hit.tokens == cold.tokens
    seq, kv = _kv(e, op)
    assert _same_kv(SequenceView(e.backend.llama, seq), warm, kv)  # type: ignore[attr-defined]


@EXAMPLES
@given(data=st.data())
def test_a_prefix_slot_hit_is_cold(slots: Engine, data: st.DataObject) -> None:
    ns, shared = f"slot{next(_ns)}", _shared(data)
    slots.run(_op(f"{shared} Then {_text(data, 1, 8, 'first')}."), namespace=ns)
    _same_as_cold(slots, _op(f"{shared} Next {_text(data, 0, 40, 'suffix')}"), ns, ("prefix_kv",))


@EXAMPLES
@given(data=st.data())
def test_a_layer_kv_restore_is_cold(slots: Engine, data: st.DataObject) -> None:
    ns, shared = f"layer{next(_ns)}", _shared(data)
    slots.run(_op(f"{shared} Then {_text(data, 1, 8, 'first')}."), namespace=ns)
    slots.drop_resident()  # the pinned prompt goes to layer KV
    _same_as_cold(slots, _op(f"{shared} Next {_text(data, 0, 40, 'suffix')}"), ns, ("layer_kv",))


@EXAMPLES
@given(data=st.data())
def test_the_next_call_of_an_agent_loop_is_cold(lanes: Engine, data: st.DataObject) -> None:
    """The second call sends the first call's prompt and reply back, and a few words more: the
    reply's KV (decoded a token at a time) is decoded again, in the suffix's batch."""
    ns, shared = f"loop{next(_ns)}", _shared(data)
    first = _op(f"{shared} Then {_text(data, 1, 8, 'first')}.")
    reply = lanes.run(first, namespace=ns).text
    more = _op(f"{first.prompt}{reply} {_text(data, 0, 40, 'suffix')}")
    _same_as_cold(lanes, more, ns, ("prefix_kv",))


@EXAMPLES
@given(data=st.data())
def test_a_sessions_next_turn_is_cold(lanes: Engine, data: st.DataObject) -> None:
    """Two turns in a session that keeps its KV, against the same turns in a session that
    reuses nothing (a tenant of its own: nothing to borrow)."""
    n, system = next(_ns), _shared(data)
    turns = [_text(data, 1, 40, "turn 1"), _text(data, 1, 40, "turn 2")]
    w = lanes.worker()
    warm = w.create_session(system, tenant=f"warm{n}")
    cold = w.create_session(system, tenant=f"cold{n}")
    cold.policy = ReusePolicy.never()
    for text in turns:
        msg = [{"role": "user", "content": text}]
        a, b = warm.append(msg, GREEDY), cold.append(msg, GREEDY)
        assert a.tokens == b.tokens
        assert warm.lane is not None and cold.lane is not None
        assert _same_kv(cold.lane.seq, warm.lane.seq.save_state(), cold.lane.seq.save_state())
    assert a.metrics.tokens_reused > 0 and a.metrics.prompt_tokens_evaluated >= 8
    warm.close()
    cold.close()


@EXAMPLES
@given(data=st.data())
def test_an_op_starting_from_a_live_sessions_tokens_is_cold(
    lanes: Engine, data: st.DataObject
) -> None:
    """Exact without ``exact`` too: a live session offers its wake prefix, prompt batches."""
    n, system = next(_ns), _shared(data)
    session = lanes.worker().create_session(system, tenant=f"live{n}")
    session.append([{"role": "user", "content": _text(data, 1, 20, "turn")}], GREEDY)
    question = {"role": "user", "content": _text(data, 1, 40, "question")}
    op = TokenOp(
        "answer", messages=({"role": "system", "content": system}, question), params=GREEDY
    )
    _same_as_cold(lanes, op, f"live{n}", ("prefix_kv",))
    session.close()


@EXAMPLES
@given(data=st.data())
def test_a_parked_session_comes_back_exact(slots: Engine, data: st.DataObject) -> None:
    """One lane: each session's turn parks the other's KV, and the next turn restores it."""
    n, system = next(_ns), _shared(data)
    w = slots.worker()
    warm, other = (w.create_session(system, tenant=f"{t}{n}") for t in ("warm", "other"))
    cold = w.create_session(system, tenant=f"cold{n}")
    cold.policy = ReusePolicy.never()
    turns = [[{"role": "user", "content": _text(data, 1, 30, f"turn {i}")}] for i in (1, 2)]
    results, states = [], []
    for s in (warm, cold):
        for msg in turns:
            results.append(s.append(msg, GREEDY))
            other.append([{"role": "user", "content": "ledger"}], GREEDY)  # parks s
        s.append([{"role": "user", "content": "river"}], GREEDY)  # back, and one turn more
        assert s.lane is not None
        states.append(s.lane.seq.save_state())
    assert [r.tokens for r in results[:2]] == [r.tokens for r in results[2:]]
    assert results[1].metrics.hit_tier == "layer_kv"  # restored from the parked snapshot
    assert cold.lane is not None and _same_kv(cold.lane.seq, *states)
    for s in (warm, other, cold):
        s.close()
