"""A batch step's calls chosen one at a time (continuum.backends.batching), on the real model
(Gemma 3 270M): a first token streams as soon as its call is done, a prompt that comes while a
call runs joins the step, and callers waiting for the context go between calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from continuum import GenerationParams, LlamaConfig, ModelFile
from continuum.backends.batching import BatchScheduler
from continuum.backends.llamacpp import LlamaCppBackend


@pytest.fixture
def ctx(gemma: ModelFile) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend(gemma, LlamaConfig(n_ctx=2048, n_threads=2, n_seq_max=4))
    yield b
    b.close()


def _tokens(b: LlamaCppBackend, n: int) -> list[int]:
    return [b.bos_id, *b.tokenize(" the" * 400)][:n]


def _wait_until(cond: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.005)


def test_a_first_token_streams_before_the_steps_later_calls_and_a_prompt_joins_meanwhile(
    ctx: LlamaCppBackend,
) -> None:
    """Step 1 has sequence 0's 20-token turn (a reply) and sequence 1's 40-token prefill, two
    calls (shortest first). Sequence 0's first token streams after the first call, before the
    prefill is in; a 3-token prefill of sequence 2 sent at that moment goes in between the calls
    and is decoded in step 1 too, in the room left."""
    events: list[str] = []
    joined: list[int] = []
    late: list[threading.Thread] = []
    with BatchScheduler(ctx, step_tokens=64) as sched:

        def send_late() -> None:
            f = sched.prefill(2, _tokens(ctx, 3))
            f.add_done_callback(lambda _: joined.append(sched.stats().steps))

        def on_text(_: str) -> None:
            if not events:  # the first token: a caller comes while the step is under way
                late.append(threading.Thread(target=send_late))
                late[0].start()
                _wait_until(lambda: sched.guard.waiting)
            events.append("text")

        with sched.exclusive():  # both queued before the first step
            reply = sched.submit(
                0, _tokens(ctx, 20), GenerationParams(max_tokens=2), on_text=on_text
            )
            pre = sched.prefill(1, _tokens(ctx, 40))
            pre.add_done_callback(lambda _: events.append("prefill"))
        assert len(reply.result(timeout=60).tokens) == 2
        late[0].join(10)
        _wait_until(lambda: joined)
        stats = sched.stats()
    assert events[:2] == ["text", "prefill"]
    assert joined == [0]  # done inside the first step (no step counted yet)
    assert ctx.seq_tokens(2) == _tokens(ctx, 3) and ctx.seq_tokens(1) == _tokens(ctx, 40)
    assert stats.tokens == 20 + 40 + 3 + 1 and stats.steps == 2  # then one generated token


def test_the_replys_end_goes_before_the_steps_next_call(ctx: LlamaCppBackend) -> None:
    """A reply that ends in a step's first call returns to its caller (who then holds the
    context) before the step's next call: sequence 1's 100-token prefill (the step's second
    call) is not yet in when sequence 0's caller has its reply back and reads it."""
    with BatchScheduler(ctx, step_tokens=128) as sched:
        with sched.exclusive():
            reply = sched.submit(0, _tokens(ctx, 20), GenerationParams(max_tokens=1))
            pre = sched.prefill(1, _tokens(ctx, 100))
        with sched.exclusive():
            out = sched.guard.wait(reply)
            resident = len(ctx.seq_tokens(1))  # between the step's calls: nothing of it yet
        pre.result(timeout=60)
    assert len(out.tokens) == 1 and resident == 0
