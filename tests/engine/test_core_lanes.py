"""An engine whose sessions run on lanes decoded together (``WorkerConfig(parallel=2)``), on the
real model (Gemma 3 270M): one context holds the lanes, and stateless ops run in them — lent a
lane each, their decodes riding in the same batch steps as the sessions'. Ops start from what a
live session or an earlier op of their tenant holds, sessions borrow from an op's leftovers, a
parked session's snapshot serves the ops as layer KV, and every answer is the one a cold
prefill gives (greedy), under concurrent load; another tenant's KV is never a source."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from continuum import (
    Engine,
    EngineConfig,
    GenerationParams,
    ModelFile,
    Result,
    ReusePolicy,
    TokenOp,
    ToolOp,
    WorkerConfig,
)
from continuum.bench.conversation import long_system_prompt

GREEDY = GenerationParams(max_tokens=16)
SYSTEM = long_system_prompt(300)


def _engine(mf: ModelFile, tmp: Path, parallel: int = 2) -> Engine:
    return Engine.open(
        model=mf,
        n_ctx=2048,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp / "layer"),
        worker=WorkerConfig(snapshot_dir=tmp / "snaps", parallel=parallel),
        store=tmp / "history.db",
    )


def _ask(system: str, question: str, params: GenerationParams = GREEDY) -> TokenOp:
    msgs = ({"role": "system", "content": system}, {"role": "user", "content": question})
    return TokenOp("answer", messages=msgs, params=params)


def test_one_context_holds_the_lanes_and_the_ops(gemma: ModelFile, tmp_path: Path) -> None:
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        llama = e.backend.llama  # type: ignore[attr-defined]
        assert e.op_lanes and w.backend is llama and w.scheduler is not None
        assert w.scheduler.backend is llama  # one step loop on the one context
        assert llama.config.n_seq_max == 2 and llama.config.kv_unified is False
        assert e.backend.n_slots == 0  # type: ignore[attr-defined]  # no KV beside the lanes
        op = TokenOp("answer", prompt="The capital of France is", params=GREEDY)
        alone = e.run(op, namespace="ops", policy=ReusePolicy.never()).text
        sessions = [w.create_session(f"{SYSTEM} Agent {i}.") for i in range(2)]
        out: dict[str, str] = {}

        def talk(i: int) -> None:
            r = sessions[i].append([{"role": "user", "content": "Name three rivers."}], GREEDY)
            out[f"s{i}"] = r.text

        def ask() -> None:
            out["op"] = e.run(op, namespace="ops").text

        threads = [threading.Thread(target=talk, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=ask))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert out["op"] == alone and out["s0"] and out["s1"]


def test_an_op_starts_from_a_live_sessions_prefix(gemma: ModelFile, tmp_path: Path) -> None:
    with _engine(gemma, tmp_path) as e:
        s = e.worker().create_session(SYSTEM, tenant="t1")
        wake = len(s.wake_tokens(SYSTEM))
        op = _ask(SYSTEM, "What is the first step?")
        r = e.run(op, namespace="t1")
        assert r.metrics.hit_tier == "prefix_kv" and r.metrics.tokens_reused >= wake - 1
        assert r.text == e.run(op, namespace="t1", policy=ReusePolicy.never()).text
        assert s.lane is not None  # a free lane ran the op: the session stayed resident


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_an_op_starts_from_the_last_ops_prompt_of_its_tenant(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path) as e:
        first = e.run(_ask(SYSTEM, "What is the first step?"), namespace="t1")
        assert first.metrics.hit_tier == "cold"
        op = _ask(SYSTEM, "What is the last step?")
        r = e.run(op, namespace="t1")
        assert r.metrics.hit_tier == "prefix_kv" and r.metrics.tokens_reused > 300
        assert r.text == e.run(op, namespace="t1", policy=ReusePolicy.never()).text


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_another_tenants_leftovers_are_never_a_source(gemma: ModelFile, tmp_path: Path) -> None:
    with _engine(gemma, tmp_path, parallel=2) as e:
        w = e.worker()
        op = _ask(SYSTEM, "What is the first step?")
        e.run(op, namespace="t1")
        t1_lane = next(lane for lane in w.lanes if lane.left_by == "t1")
        s = w.create_session(SYSTEM, tenant="t3")  # the other lane: t1's prompt is no source
        assert w.residency.borrowed == 0 and s.lane is not t1_lane
        r = e.run(op, namespace="t2")  # only t1's lane is free: cleared, then decoded cold
        assert r.metrics.hit_tier == "cold" and r.metrics.tokens_reused == 0
        assert t1_lane.left_by == "t2"


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_session_borrows_what_an_op_left(gemma: ModelFile, tmp_path: Path) -> None:
    system = long_system_prompt(500)
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        e.run(_ask(system, "What is the first step?"), namespace="t1")
        s = w.create_session(system, tenant="t1")
        assert w.residency.borrowed > 400  # its wake copied the op's prompt, not decoded it
        cold = w.create_session(system, tenant="t2")  # nothing of t2's to borrow from
        msg = [{"role": "user", "content": "Name a colour."}]
        assert s.append(msg, GREEDY).text == cold.append(msg, GREEDY).text


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_parked_sessions_snapshot_serves_the_ops(gemma: ModelFile, tmp_path: Path) -> None:
    """A lane's state loads into another lane of the same context: a parked session's wake
    prefix is a layer KV entry for its tenant's ops."""
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        s = w.create_session(SYSTEM, tenant="t1")
        s.append([{"role": "user", "content": "Name a colour."}], GREEDY)
        w.park_active()
        assert s.lane is None and e.layer.index.get("t1", s.wake_tokens(SYSTEM)) is not None
        for lane in w.lanes:
            lane.seq.clear()
        op = _ask(SYSTEM, "Hi.")
        r = e.run(op, namespace="t1")
        assert r.metrics.hit_tier == "layer_kv"
        assert e.run(op, namespace="t1", policy=ReusePolicy.never()).text == r.text
        again = s.append([{"role": "user", "content": "Another?"}], GREEDY)
        assert again.metrics.hit_tier in ("layer_kv", "prefix_kv")


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_an_op_parks_an_idle_session_when_every_lane_is_taken(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        sessions = [w.create_session(f"{SYSTEM} Agent {i}.", tenant="t1") for i in range(2)]
        assert all(s.lane is not None for s in sessions)
        op = TokenOp("answer", prompt="The capital of France is", params=GREEDY)
        r = e.run(op, namespace="t1")
        assert r.text == e.run(op, namespace="t1", policy=ReusePolicy.never()).text
        assert sum(s.lane is None for s in sessions) == 1  # one parked, its KV a snapshot
        back = [s.append([{"role": "user", "content": "Hi."}], GREEDY) for s in sessions]
        assert all(b.text for b in back)
        assert any(b.metrics.resets == () and b.metrics.tokens_reused > 0 for b in back)


@pytest.mark.slow
def test_a_long_stateless_prefill_shares_the_steps_with_a_reply(
    gemma: ModelFile, tmp_path: Path
) -> None:
    """While an op's 1.5k-token prompt is decoded, a session's reply goes on getting tokens
    (its steps carry the prompt's chunks beside the reply's next token), and both answer as
    they do alone."""
    long_op = _ask(long_system_prompt(1500), "Summarise.", GenerationParams(max_tokens=8))
    reply_params = GenerationParams(max_tokens=160)
    msg = [{"role": "user", "content": "Count from one to one hundred in words."}]
    with _engine(gemma, tmp_path) as e:
        w = e.worker()
        alone_op = e.run(long_op, namespace="ops", policy=ReusePolicy.never()).text
        s = w.create_session(SYSTEM)
        ref = w.create_session(SYSTEM, tenant="ref")  # another tenant: no memo hit for s
        alone_reply = ref.append(msg, reply_params).text
        ref.close()
        got: list[str] = []
        started = threading.Event()
        marks: dict[str, int] = {}

        def on_reply(text: str) -> None:
            got.append(text)
            started.set()

        def on_op(_: str) -> None:
            marks.setdefault("op_first", len(got))

        out: dict[str, str] = {}
        talk = threading.Thread(
            target=lambda: out.update(s=s.append(msg, reply_params, on_text=on_reply).text)
        )
        mixed = w.scheduler.stats().mixed_steps  # type: ignore[union-attr]
        talk.start()
        assert started.wait(60)
        marks["op_start"] = len(got)
        out["op"] = e.run(long_op, on_op, namespace="ops").text
        talk.join(120)
        assert out["op"] == alone_op and out["s"] == alone_reply
        assert w.scheduler.stats().mixed_steps > mixed  # type: ignore[union-attr]
        assert marks["op_first"] > marks["op_start"]  # the reply went on during the prefill


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_stateless_ops_run_at_once_each_in_its_lane(gemma: ModelFile, tmp_path: Path) -> None:
    """Two stateless requests (agents sending no session key) generate together, their
    tokens in the same steps, not one after the other; each answers as it does alone, and a
    third op of a tenant starts from what its last op left while the other op still runs."""
    params = GenerationParams(max_tokens=40)
    ops = {
        "a": _ask(SYSTEM, "Count from one to forty in words.", params),
        "b": _ask(f"{SYSTEM} Agent b.", "List the days of the week, then the months.", params),
    }
    with _engine(gemma, tmp_path) as e:
        alone = {
            k: e.run(op, namespace="ref", policy=ReusePolicy.never()).text for k, op in ops.items()
        }
        order: list[str] = []
        out: dict[str, str] = {}
        start = threading.Barrier(2)

        def run(k: str) -> None:
            start.wait(30)
            out[k] = e.run(ops[k], lambda _: order.append(k), namespace=k).text

        threads = [threading.Thread(target=run, args=(k,)) for k in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert out == alone
        # interleaved: after the first piece of the op that started second, the first still
        # had text to send (it did not run to its end first)
        first = order[0]
        second = "b" if first == "a" else "a"
        assert first in order[order.index(second) :], order
        # the tenant's leftovers serve its next op
        follow = _ask(SYSTEM, "Count from one to forty in words. Then stop.", GREEDY)
        m = e.run(follow, namespace="a").metrics
        assert m.hit_tier == "prefix_kv" and m.tokens_reused > 0


def test_a_tool_that_hangs_holds_up_no_op_and_no_session(gemma: ModelFile, tmp_path: Path) -> None:
    """User code never runs under the context guard: while a tool blocks, an op and a session
    turn run to the end; a tool that raises loses nothing for the others."""
    entered, release = threading.Event(), threading.Event()

    def slow(x: int) -> int:
        entered.set()
        assert release.wait(120)
        return x * 2

    def broken() -> int:
        raise RuntimeError("the tool failed")

    with _engine(gemma, tmp_path) as e:
        s = e.worker().create_session(SYSTEM, tenant="t1")
        got: dict[str, object] = {}
        tool = threading.Thread(
            target=lambda: got.update(tool=e.run(ToolOp("slow", slow, {"x": 4}), namespace="t1"))
        )
        tool.start()
        assert entered.wait(60)
        op = TokenOp("answer", prompt="The capital of France is", params=GREEDY)
        assert e.run(op, namespace="t1").text
        assert s.append([{"role": "user", "content": "Name a colour."}], GREEDY).text
        with pytest.raises(RuntimeError, match="the tool failed"):
            e.run(ToolOp("broken", broken, {}), namespace="t1")
        assert "tool" not in got  # still blocked: everything above ran beside it
        release.set()
        tool.join(60)
        result = got["tool"]
        assert isinstance(result, Result) and result.value == 8
        assert e.run(op, namespace="t1").metrics.hit_tier == "memo"


@pytest.mark.parametrize("bad", [0, 33, True, "4"])
def test_bad_lanes_are_a_typed_error_before_any_model_loads(bad: object) -> None:
    from continuum.backends.llamacpp_ops import LlamaCppOpBackend
    from continuum.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match=r"lanes must be an int in 1\.\.32"):
        LlamaCppOpBackend("no-such-model.gguf", lanes=bad)  # type: ignore[arg-type]
