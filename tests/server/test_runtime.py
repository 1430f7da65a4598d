"""The server's job threads: requests of different conversations run at once (their decodes
batched together on the model's lanes), the bounded queue still answers 429, and agents that
stream through the official OpenAI SDK at the same time get their first tokens while each
other's replies are still arriving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from continuum.errors import Overloaded, ShuttingDown
from continuum.server.runtime import Executor
from continuum.stateful.lane_order import LaneOrder
from tests.server.test_app import SYSTEM, Running, _serve


def test_jobs_run_on_every_thread_at_once_and_in_order_of_arrival() -> None:
    ex = Executor(max_queue=4, threads=3)
    try:
        meet = threading.Barrier(3, timeout=10)  # only passes with three jobs running at once
        got = [ex.submit(meet.wait) for _ in range(3)]
        assert sorted(f.result(timeout=10) for f in got) == [0, 1, 2]
        order: list[int] = []
        single = Executor(max_queue=8, threads=1)
        try:
            done = [single.submit(lambda i=i: order.append(i)) for i in range(5)]
            for f in done:
                f.result(timeout=10)
        finally:
            single.close()
        assert order == [0, 1, 2, 3, 4]
    finally:
        ex.close()


@pytest.mark.parametrize(
    ("order", "want"),
    [
        (LaneOrder.ARRIVAL, ["young", "old", "none", "short"]),
        (LaneOrder.AGE, ["old", "young", "none", "short"]),  # "short" opened after "none"
        (LaneOrder.LAS, ["none", "short", "young", "old"]),  # fewest tokens first
    ],
)
def test_queued_jobs_run_in_the_lane_order_of_their_programs(
    order: LaneOrder, want: list[str]
) -> None:
    """With more requests than job threads they wait here, not for a lane: the queue keeps
    the workers' order, by the program (session) each job names — its start, or the tokens it
    holds; a job of no known program starts when it is queued."""
    now = time.monotonic()
    programs = {"old": (now - 100.0, 9000), "young": (now - 10.0, 500), "short": (now, 40)}
    ex = Executor(max_queue=8, threads=1, order=order)
    ex.programs = programs.get
    try:
        release, started = threading.Event(), threading.Event()
        ex.submit(lambda: (started.set(), release.wait(10)))
        assert started.wait(10)
        ran: list[str] = []
        names = ["young", "old", "none", "short"]
        done = [
            ex.submit(lambda n=n: ran.append(n), program=None if n == "none" else n) for n in names
        ]
        time.sleep(0.01)
        programs["short"] = (time.monotonic(), 40)  # opened after "none" was queued
        release.set()
        for f in done:
            f.result(timeout=10)
        assert ran == want
    finally:
        ex.close()


def test_a_full_queue_is_refused_at_once_but_cleanup_jobs_never_are() -> None:
    ex = Executor(max_queue=1, threads=1)
    release, started = threading.Event(), threading.Event()
    try:
        ex.submit(lambda: (started.set(), release.wait(10)))
        assert started.wait(10)
        ex.submit(lambda: None)  # waits: the queue is full now
        with pytest.raises(Overloaded):
            ex.submit(lambda: None)
        assert (ex.depth, ex.queued) == (1, 1)
        cleanup = ex.submit(lambda: "dropped", bounded=False)
        assert (ex.depth, ex.queued) == (1, 2)  # a cleanup job waits uncounted by the bound
        release.set()
        assert cleanup.result(timeout=10) == "dropped"
    finally:
        release.set()
        ex.close()
    with pytest.raises(ValueError, match="threads"):
        Executor(threads=0)
    with pytest.raises(ShuttingDown):
        ex.submit(lambda: None)


def test_stopping_fails_queued_jobs_and_waits_a_bounded_time_for_running_ones() -> None:
    ex = Executor(max_queue=4, threads=1)
    release, started = threading.Event(), threading.Event()
    running = ex.submit(lambda: (started.set(), release.wait(30), "finished")[-1])
    assert started.wait(10)
    queued = ex.submit(lambda: "never run")
    try:
        assert ex.stop(0.2) is False  # the running job holds its thread past the grace
        with pytest.raises(ShuttingDown):
            queued.result(timeout=5)
        with pytest.raises(ShuttingDown):
            ex.submit(lambda: None)
        assert ex.depth == 0
    finally:
        release.set()
    assert ex.stop(10) is True
    assert running.result(timeout=1) == "finished"


@pytest.fixture(scope="module", params=["oldest", "equal"])
def srv(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Running]:
    yield from _serve(
        tmp_path_factory.mktemp("lanes"), parallel=2, max_queue=8, prefill_share=request.param
    )


def test_two_agents_streaming_at_once_share_the_steps(srv: Running) -> None:
    """Two conversations (session hints), streamed at once through the OpenAI SDK: each one's
    first token comes before the other's reply is over, and the worker's scheduler decoded
    both in the same steps; with either way of sharing a step's prompt room (the server's
    ``prefill_share`` reaches the scheduler)."""
    worker = srv.state.worker
    assert worker is not None and worker.scheduler is not None and len(worker.lanes) == 2
    assert worker.scheduler.planner.share.value == srv.state.config.engine.lanes.prefill_share
    start = threading.Barrier(2)
    stamps: dict[str, list[float]] = {"a": [], "b": []}

    def agent(name: str) -> None:
        client = srv.client()
        start.wait(30)
        stream = client.chat.completions.create(
            model=srv.state.model_id,
            messages=[
                {"role": "system", "content": f"{SYSTEM} You are agent {name}."},
                {"role": "user", "content": "Count slowly from one to thirty, in words."},
            ],
            max_tokens=40,
            temperature=0,
            stream=True,
            extra_headers={"X-Session-ID": f"agent-{name}"},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                stamps[name].append(time.monotonic())

    threads = [threading.Thread(target=agent, args=(n,)) for n in stamps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    a, b = stamps["a"], stamps["b"]
    assert len(a) > 10 and len(b) > 10
    assert a[0] < b[-1] and b[0] < a[-1]  # neither waited for the other's reply to end
    assert worker.scheduler.stats().max_replies == 2
    assert sorted(lane.session.id for lane in worker.lanes if lane.session) == sorted(
        worker.sessions()
    )  # both resident, one lane each
