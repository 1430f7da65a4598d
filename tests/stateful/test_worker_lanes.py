"""Several sessions resident at once (``WorkerConfig.parallel``), decoded together, on the real
model (Gemma 3 270M): turns on different lanes run in the same batch steps and reply as they
would alone; a session beyond the lanes parks the least recently used idle one; nothing is
parked, deleted or closed under a running turn; glue rides in the next turn's own prefill."""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import numpy as np
import pytest

from continuum import (
    GenerationParams,
    InvalidRequest,
    LlamaConfig,
    ModelFile,
    Result,
    Worker,
    WorkerConfig,
)
from continuum.backends.llamacpp import LlamaCppBackend
from tests.conftest import WorkerFactory

PARAMS = GenerationParams(max_tokens=24)
SYSTEMS = (
    "You are a helpful assistant who answers about geography.",
    "You are a terse assistant for Python questions.",
    "You are a storyteller who writes one sentence at a time.",
)
ASKS = (
    ("What is the capital of France?", "And of Spain?"),
    ("How do I reverse a list?", "And a string?"),
    ("Begin a story about a fox.", "Continue it."),
)


class Turn(NamedTuple):
    prompt: tuple[int, ...]
    reply: tuple[int, ...]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _conversations(w: Worker, n: int, *, together: bool) -> list[list[Turn]]:
    """n sessions, two turns each: on one thread in order, or every session on its own
    thread at once. Returns each session's turns (prompt, reply)."""
    sessions = [w.create_session(SYSTEMS[i]) for i in range(n)]
    out: list[list[Turn]] = [[] for _ in range(n)]

    def talk(i: int) -> None:
        s = sessions[i]
        for ask in ASKS[i]:
            reply = s.append([user(ask)], PARAMS).tokens
            assert s.lane is not None
            resident = s.lane.seq.tokens  # the prompt, then the reply but its last token
            out[i].append(Turn(tuple(resident[: len(resident) - len(reply) + 1]), reply))

    if together:
        threads = [threading.Thread(target=talk, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    else:
        for i in range(n):
            talk(i)
    return out


def _forced(b: LlamaCppBackend, turn: Turn) -> None:
    """Teacher-force a reply through its prompt decoded alone (a clean context): each choice
    must be the alone argmax (batched steps are cut into calls that keep every token as it
    comes out alone: continuum.backends.passes)."""
    b.clear()
    logits, _ = b.decode(list(turn.prompt), 0)
    for j, tok in enumerate(turn.reply):
        assert logits is not None
        best = int(np.argmax(logits))
        assert tok == best, f"position {j}: alone prefers {best} by {logits[best] - logits[tok]}"
        logits, _ = b.decode([tok], 0)


def _as_alone(mf: ModelFile, convs: list[list[Turn]]) -> None:
    alone = LlamaCppBackend(mf, LlamaConfig(n_ctx=2048, n_threads=2))
    try:
        for turns in convs:
            for turn in turns:
                _forced(alone, turn)
    finally:
        alone.close()


@pytest.mark.slow
@pytest.mark.parametrize("share", ["oldest", "equal"])
def test_turns_on_two_lanes_share_steps_and_reply_as_alone(
    gemma: ModelFile, make_worker: WorkerFactory, share: str
) -> None:
    """Two sessions talking at once: their prefills and replies share steps, and each reply is
    token for token the one it would be alone. Both ways of sharing a step's prompt room (the
    prefills cut into other chunks) keep it so."""
    w = make_worker(gemma, parallel=2, prefill_share=share)
    assert w.scheduler is not None and len(w.lanes) == 2
    assert w.scheduler.planner.share.value == share
    together = _conversations(w, 2, together=True)
    assert w.scheduler.stats().max_replies == 2  # both in the same steps
    _as_alone(gemma, together)


@pytest.mark.slow
def test_a_session_beyond_the_lanes_parks_the_least_recently_used(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, parallel=2)
    sessions = [w.create_session(SYSTEMS[i]) for i in range(3)]  # the third parks the first
    assert sessions[0].lane is None and sessions[0].resident
    assert [lane.session for lane in w.lanes] == [sessions[2], sessions[1]]
    convs: list[list[Turn]] = [[] for _ in range(3)]
    for turn in range(2):
        for i, s in enumerate(sessions):
            reply = s.append([user(ASKS[i][turn])], PARAMS)
            assert s.lane is not None  # active while (and after) its turn
            resident = s.lane.seq.tokens
            convs[i].append(
                Turn(tuple(resident[: len(resident) - len(reply.tokens) + 1]), reply.tokens)
            )
            if turn == 0 and i == 0:
                assert reply.metrics.hit_tier == "layer_kv"  # back from its parked snapshot
    assert w.swaps >= 6 and sum(lane.session is not None for lane in w.lanes) == 2
    _as_alone(gemma, convs)  # parked, restored, beside another lane: as alone


@pytest.mark.slow
def test_the_session_parked_is_the_one_expected_back_last_not_the_least_recently_used(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    """With a lane needed, the session whose return costs least per second of lane freed is
    parked (its reload over its expected pause), here the one whose tool runs ten minutes
    rather than the least recently used one, due back in seconds; the one parked comes back
    from its snapshot and answers as a session never parked does."""
    w = make_worker(gemma, parallel=2)
    a, b, c = (w.create_session(SYSTEMS[i]) for i in range(3))  # c parks a: a park is timed
    assert a.lane is None and w.residency.costs.bytes_per_token
    b.append([user(ASKS[1][0])], PARAMS)  # b, then c: b is the least recently used
    b.pauses.hint(5.0)
    reply_c = c.append([user(ASKS[2][0])], PARAMS)
    c.pauses.hint(600.0)
    a.append([user(ASKS[0][0])], PARAMS)
    assert c.lane is None and b.lane is not None  # LRU would have parked b
    again = c.append([user(ASKS[2][1])], PARAMS)
    assert again.metrics.hit_tier == "layer_kv"  # back from its snapshot, nothing prefilled
    ref = make_worker(gemma, parallel=2).create_session(SYSTEMS[2])
    assert ref.append([user(ASKS[2][0])], PARAMS).text == reply_c.text
    assert ref.append([user(ASKS[2][1])], PARAMS).text == again.text


def test_a_turn_waits_for_a_lane_while_every_lane_is_held(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, parallel=2)
    sessions = [w.create_session(SYSTEMS[i]) for i in range(3)]
    first: dict[int, float] = {}
    ended: dict[int, float] = {}

    def talk(i: int, n: int) -> None:
        def on_text(_: str) -> None:
            first.setdefault(i, time.monotonic())

        sessions[i].append([user(ASKS[i][0])], GenerationParams(max_tokens=n), on_text)
        ended[i] = time.monotonic()

    long = [threading.Thread(target=talk, args=(i, 48)) for i in (1, 2)]  # hold both lanes
    for t in long:
        t.start()
    while len(first) < 2:
        time.sleep(0.005)
    third = threading.Thread(target=talk, args=(0, 8))
    third.start()
    for t in (*long, third):
        t.join(120)
    assert set(ended) == {0, 1, 2}
    assert first[0] > min(ended[1], ended[2])  # it got a lane only when a turn let one go


def test_delete_and_close_wait_for_the_running_turn(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, parallel=2)
    a, b = (w.create_session(SYSTEMS[i]) for i in range(2))
    for s, name in ((a, "delete"), (b, "close")):
        started, done = threading.Event(), threading.Event()
        result: list[Result] = []

        def run(s: Any = s, started: Any = started, done: Any = done, res: Any = result) -> None:
            res.append(
                s.append(
                    [user("Count to twenty.")],
                    GenerationParams(max_tokens=40),
                    lambda _: started.set(),
                )
            )
            done.set()

        t = threading.Thread(target=run)
        t.start()
        assert started.wait(60)
        if name == "delete":
            assert w.delete_session(s.id)
        else:
            s.close()
        assert done.is_set(), name  # it returned only after the turn had committed
        assert len(result[0].tokens) == 40
        t.join(60)
    assert w.sessions() == [] and all(lane.session is None for lane in w.lanes)
    assert w.store.turns(b.id)  # closed, not deleted: its history stays


def test_glue_rides_in_the_next_turns_prefill_when_it_comes_at_once(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    """An agent loop sends its next request at once: the glue is decoded in that request's
    own prefill (no separate batch to wait for). After a quiet gap it was decoded ahead."""
    w = make_worker(gemma, parallel=2, eager_glue=True, glue_quiet_ms=200.0)
    s = w.create_session(SYSTEMS[0])
    s.append([user(ASKS[0][0])], PARAMS)
    at_once = s.append([user(ASKS[0][1])], PARAMS).metrics
    assert at_once.eager_tokens_used == 0
    assert w.settle(10)  # the quiet gap passes; the glue is decoded ahead
    later = s.append([user("Thanks.")], PARAMS).metrics
    assert later.eager_tokens_used > 0


@pytest.mark.slow
def test_a_reply_ends_without_waiting_for_another_lanes_prefill_chunk(
    gemma: ModelFile, make_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's reply ends while B's long system prompt is prefilled in 512-token chunks (a step
    each): A's turn commits and returns before the next chunk's step, instead of giving the
    guard up for its SQLite commit and waiting for that whole step. The commit is slowed to
    50 ms (a disk that syncs), so that a step would surely start meanwhile."""
    w = make_worker(gemma, n_ctx=4096, parallel=2)
    assert w.scheduler is not None
    a = w.create_session(SYSTEMS[0])
    commit = w.store.commit_turn

    def slow_commit(*args: Any, **kw: Any) -> int:
        time.sleep(0.05)
        return commit(*args, **kw)

    monkeypatch.setattr(w.store, "commit_turn", slow_commit)
    steps: list[int] = []
    creating = threading.Thread(
        target=w.create_session, args=("You are a careful archivist. " * 500,)
    )

    def on_text(_: str) -> None:
        steps.append(w.scheduler.stats().steps)  # type: ignore[union-attr]
        if len(steps) == 1:
            creating.start()

    a.append([user("Count to twenty.")], GenerationParams(max_tokens=4), on_text)
    returned_at = w.scheduler.stats().steps
    assert creating.is_alive()  # B's prefill still has chunks to go
    creating.join(120)
    assert len(steps) == 4 and steps[-1] > steps[0] + 1  # A's tokens rode in B's chunk steps
    # A's last token streams inside a step (``steps`` then counts the steps before it); no
    # further step of B's ran between that token and A's end
    assert returned_at <= steps[-1] + 1


@pytest.mark.parametrize("bad", [0, 33, True, "2", 2.0])
def test_a_bad_parallel_is_a_typed_error_and_leaves_nothing_open(
    gemma: ModelFile, tmp_path: Any, bad: object
) -> None:
    with pytest.raises(InvalidRequest, match=r"parallel must be an int in 1\.\.32"):
        Worker(gemma, WorkerConfig(parallel=bad), store=tmp_path / "h.db")  # type: ignore[arg-type]
    with Worker(gemma, WorkerConfig(parallel=2), store=tmp_path / "h.db") as w:  # the store is free
        assert len(w.lanes) == 2


def test_a_bad_prefill_share_is_a_typed_error_and_leaves_nothing_open(
    gemma: ModelFile, tmp_path: Any
) -> None:
    for parallel in (2, 1):  # one lane has no steps to share, but a typo is still one
        bad = WorkerConfig(parallel=parallel, prefill_share="fastest")
        with pytest.raises(InvalidRequest, match=r"prefill_share must be one of 'oldest', 'eq"):
            Worker(gemma, bad, store=tmp_path / "h.db")
    with Worker(gemma, WorkerConfig(parallel=2), store=tmp_path / "h.db") as w:  # the store is free
        assert w.scheduler is not None and w.scheduler.planner.share.value == "oldest"


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("step_linger_ms", -1),
        ("step_linger_ms", "30"),
        ("glue_quiet_ms", True),
        ("glue_quiet_ms", 61_000),
        ("speculate_after_ms", float("nan")),
    ],
)
def test_a_bad_worker_timing_is_a_typed_error_naming_its_setting(name: str, bad: object) -> None:
    with pytest.raises(InvalidRequest, match=rf"^{name} must be a number of ms in 0\.\.60000"):
        WorkerConfig(**{name: bad})  # type: ignore[arg-type]
    assert (
        WorkerConfig(speculate_after_ms=None, step_linger_ms=0, glue_quiet_ms=0.5).step_linger_ms
        == 0
    )
