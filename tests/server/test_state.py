"""The server's configuration and lifetime: values refused before anything loads, the defaults
it gives requests that leave a field out, and a close that ends in a bounded time with the
model busy."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from continuum.errors import InvalidRequest, SessionClosed, ShuttingDown
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.server.schemas import ChatRequest, RequestDefaults
from continuum.server.state import ServerConfig, ServerState, build_state


@pytest.mark.parametrize("bad", [-1, True, 1.5, "7"])
def test_a_bad_server_seed_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"seed must be an int >= 0"):
        ServerConfig(seed=bad)  # type: ignore[arg-type]


def test_requests_without_a_seed_get_the_servers_and_their_own_wins() -> None:
    defaults = ServerConfig(seed=7, default_max_tokens=33).request_defaults
    assert defaults == RequestDefaults(33, 7)
    bare = ChatRequest(model="m", messages=[]).params(defaults)
    assert (bare.seed, bare.max_tokens, bare.deterministic) == (7, 33, True)
    own = ChatRequest(model="m", messages=[], seed=3).params(defaults)
    assert own.seed == 3
    unseeded = ChatRequest(model="m", messages=[]).params(ServerConfig().request_defaults)
    assert unseeded.seed is None and not unseeded.deterministic


def _busy(state: ServerState, started: threading.Event) -> None:
    """A job that keeps the model generating until something stops it."""
    op = TokenOp("busy", messages=({"role": "user", "content": "Count to fifty."},), params=PARAMS)
    started.set()
    while True:
        state.engine.run(op, namespace="busy", policy=ReusePolicy.never())


PARAMS = GenerationParams(max_tokens=48)


@pytest.mark.parametrize("parallel", [1, 2])  # ops on the working sequence; ops in lanes
def test_close_is_bounded_with_the_model_busy_and_fails_what_it_stopped(
    tmp_path: Path, parallel: int
) -> None:
    state = build_state(
        ServerConfig.of(
            n_ctx=1024, parallel=parallel, store=tmp_path / "h.db", snapshot_dir=tmp_path / "s"
        )
    )
    started = threading.Event()
    job = state.executor.submit(lambda: _busy(state, started))
    assert started.wait(60)
    queued = [state.executor.submit(lambda: "never run") for _ in range(parallel + 1)]
    closer = threading.Thread(target=state.close, kwargs={"grace_s": 0.5})
    closer.start()
    closer.join(timeout=120)
    assert not closer.is_alive()
    with pytest.raises(ShuttingDown):
        job.result(timeout=0)
    for q in queued:  # the other job threads ran some of them before the stop
        assert q.exception(timeout=0) is None or isinstance(q.exception(), ShuttingDown)
    with pytest.raises(SessionClosed):  # the model was closed: nothing runs on it any more
        state.engine.backend.llama.tokenize("x")  # type: ignore[attr-defined]


def test_close_is_bounded_with_a_job_stuck_outside_the_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = build_state(ServerConfig.of(n_ctx=1024, parallel=1, store=tmp_path / "h.db"))
    release, started = threading.Event(), threading.Event()
    stuck = state.executor.submit(lambda: (started.set(), release.wait(60)))
    assert started.wait(30)
    try:
        state.close(grace_s=0.2)  # returns: the engine is left open for the process's exit
        assert "left open" in caplog.text
        assert state.engine.backend.llama.tokenize("x")  # type: ignore[attr-defined]
    finally:
        release.set()
    assert stuck.result(timeout=10)
    state.engine.close()


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
@pytest.mark.parametrize("parallel", [1, 2])  # the ops' slots beside one session; lanes
def test_an_exact_server_runs_an_exact_engine_and_exact_sessions(
    tmp_path: Path, parallel: int
) -> None:
    """``serve --exact``: the engine and its sessions reuse only exact KV, and the context
    keeps a KV stream per sequence (in a unified cache nothing is exact)."""
    state = build_state(
        ServerConfig.of(n_ctx=1024, parallel=parallel, store=tmp_path / "h.db", exact=True)
    )
    try:
        engine = state.engine
        assert engine.config.exact and engine.worker().config.exact
        assert engine.backend.llama.config.unified is False  # type: ignore[attr-defined]
        op = TokenOp("answer", prompt="The capital of France is Paris. The capital of Spain is")
        state.executor.submit(lambda: engine.run(op, namespace="t")).result(120)
        llama = engine.backend.llama  # type: ignore[attr-defined]
        n = len(engine.backend.prompt_tokens(None, op.prompt))  # type: ignore[attr-defined]
        assert max(llama.exact_tokens(s) for s in range(llama.config.n_seq_max)) == n  # no reply
    finally:
        state.close()
