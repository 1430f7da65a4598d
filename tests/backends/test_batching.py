"""Continuous batching on the real model (Gemma 3 270M): several sequences' replies decoded in
the same steps, a new prompt starting while others generate, and failures kept to their reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from continuum import ContextOverflow, GenerationParams, InvalidRequest, LlamaConfig, ModelFile
from continuum.backends.batching import BatchScheduler
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.backends.step_plan import PrefillShare, Program
from continuum.errors import BackendError, SessionClosed

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
)
MORE = (
    "The three primary colors are",
    "import numpy as np\n",
    "In 1969, the first humans",
    "My favourite recipe for pancakes:",
)
GREEDY = GenerationParams(max_tokens=24)
NEAR_TIE = 1.0  # how far a unified cache's batched steps may move a chosen token's logit


@pytest.fixture
def ctx(gemma: ModelFile) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend(gemma, LlamaConfig(n_ctx=2048, n_threads=2, n_seq_max=8))
    yield b
    b.close()


def _prompt(b: LlamaCppBackend, text: str) -> list[int]:
    return [b.bos_id, *b.tokenize(text)] if b.add_bos else b.tokenize(text)


def _forced(b: LlamaCppBackend, prompt: list[int], reply: tuple[int, ...]) -> list[float]:
    """Teacher-force a batched reply through the prompt decoded alone in a clean context
    (sequence 0, every other cleared): each choice must be the alone argmax or trail it by less
    than NEAR_TIE (a near-tie may be three-way: the choice need not be the runner-up). Returns
    the gaps of the near-ties."""
    b.clear()
    logits, _ = b.decode(prompt, 0)
    gaps = []
    for j, tok in enumerate(reply):
        assert logits is not None
        best = int(np.argmax(logits))
        if tok != best:
            gap = float(logits[best] - logits[tok])
            assert gap < NEAR_TIE, f"position {j}: alone prefers {best} to {tok} by {gap:.3f}"
            gaps.append(gap)
        logits, _ = b.decode([tok], 0)
    b.clear()
    return gaps


@pytest.mark.slow
def test_replies_decoded_together_are_each_alone_or_a_measured_near_tie(
    ctx: LlamaCppBackend,
) -> None:
    """Eight replies in the same steps on one unified KV cache, where a sequence's attention
    spans the cells of every sequence (masked) and so sums in another order than alone:
    teacher-forced against each prompt alone, each choice is the same or a near-tie (with a
    KV stream per sequence, as lanes have, they are bit-equal: the test below)."""
    prompts = [_prompt(ctx, p) for p in PROMPTS + MORE]
    with BatchScheduler(ctx) as sched:
        futures = [sched.submit(i, p, GREEDY) for i, p in enumerate(prompts)]
        together = [f.result(timeout=120).tokens for f in futures]
        stats = sched.stats()
        for i, (p, t) in enumerate(zip(prompts, together, strict=True)):  # each stays resident
            assert ctx.seq_tokens(i) == [*p, *t[:-1]]
    assert stats.max_replies == len(prompts)  # all of them in one step
    assert stats.steps < sum(len(t) for t in together)  # fewer steps than tokens: batched
    gaps = [g for p, t in zip(prompts, together, strict=True) for g in _forced(ctx, p, t)]
    print(
        f"batched vs alone: {len(gaps)} near-ties in {sum(map(len, together))} positions, "
        f"largest gap {max(gaps, default=0.0):.3f}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("share", ["oldest", "equal"])
def test_replies_decoded_together_on_kv_streams_are_bit_equal_to_alone(
    gemma: ModelFile, share: str
) -> None:
    """Ten replies at once on a context with a KV stream per sequence (as a worker's lanes):
    ten generated tokens a step (one ubatch of >= 8 rows, were they one call), and a long
    prompt chunked beside them (its first token in a small ubatch, were they one call). Cut
    into calls by continuum.backends.passes, every reply is token for token the one decoded
    alone (decoded as one call a step, some are not)."""
    b = LlamaCppBackend(gemma, LlamaConfig(n_ctx=2048, n_threads=2, n_seq_max=10, kv_unified=False))
    try:
        texts = [*PROMPTS, *MORE, "Rust and Go compared:", "The printing press. " * 40]
        prompts = [_prompt(b, t) for t in texts]
        alone = []
        for p in prompts:
            b.clear_seq(0)
            logits, _ = b.decode(p, 0)
            assert logits is not None
            alone.append(b.generate(logits, GREEDY, seq=0).tokens)
        b.clear_seq(0)
        with BatchScheduler(b, step_tokens=64, prefill_share=share) as sched:
            futures = [sched.submit(i, p, GREEDY) for i, p in enumerate(prompts)]
            together = [f.result(timeout=300).tokens for f in futures]
            stats = sched.stats()
        assert stats.max_replies == 10 and stats.mixed_steps > 0
        assert together == alone
    finally:
        b.close()


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_a_new_prompt_starts_at_the_next_step_not_after_the_running_reply(
    ctx: LlamaCppBackend,
) -> None:
    """B's 600-token prompt arrives while A generates 64 tokens: B is prefilled in chunks that
    ride along with A's tokens, and B's first token comes before A's reply is over."""
    events: list[str] = []
    started = threading.Event()

    def on_a(text: str) -> None:
        events.append("a")
        started.set()

    long = "The history of the printing press. " * 75
    with BatchScheduler(ctx, step_tokens=64) as sched:
        a = sched.submit(
            0, _prompt(ctx, "1, 2, 3, 4, 5,"), GenerationParams(max_tokens=64), on_text=on_a
        )
        assert started.wait(60)
        b = sched.submit(
            1,
            _prompt(ctx, long),
            GenerationParams(max_tokens=4),
            on_text=lambda _: events.append("b"),
        )
        ra, _ = a.result(timeout=120), b.result(timeout=120)
        stats = sched.stats()
    assert len(_prompt(ctx, long)) > 500 and len(ra.tokens) == 64
    assert "b" in events and events.index("b") < len(events) - 1 - events[::-1].index("a")
    assert stats.mixed_steps >= 8  # B's chunks and A's tokens in the same steps


def test_bad_input_and_failures_stay_with_their_reply(ctx: LlamaCppBackend) -> None:
    with BatchScheduler(ctx) as sched:
        with pytest.raises(InvalidRequest, match="at least one"):
            sched.submit(0, [], GREEDY)
        with pytest.raises(InvalidRequest, match="no sequence 9"):
            sched.submit(9, _prompt(ctx, "hi"), GREEDY)
        with pytest.raises(ContextOverflow):
            sched.submit(0, [ctx.bos_id] * 2048, GREEDY)

        checked = threading.Event()

        def boom(_: str) -> None:
            checked.wait(30)  # still in progress while the second submit is refused
            raise RuntimeError("the client went away")

        bad = sched.submit(0, _prompt(ctx, PROMPTS[0]), GREEDY, on_text=boom)
        with pytest.raises(InvalidRequest, match="already has a reply"):
            sched.submit(0, _prompt(ctx, PROMPTS[1]), GREEDY)
        checked.set()
        good = sched.submit(1, _prompt(ctx, PROMPTS[1]), GREEDY)
        with pytest.raises(RuntimeError, match="went away"):
            bad.result(timeout=60)
        assert good.result(timeout=60).tokens
    with pytest.raises(SessionClosed):
        sched.submit(2, _prompt(ctx, "hi"), GREEDY)
    with pytest.raises(InvalidRequest, match="step_tokens"):
        BatchScheduler(ctx, step_tokens=4)


def test_decode_many_refuses_what_one_step_cannot_hold(ctx: LlamaCppBackend) -> None:
    hi = _prompt(ctx, "hi")
    with pytest.raises(BackendError, match="one item per sequence"):
        ctx.decode_many([(0, hi, True), (0, hi, True)])
    with pytest.raises(BackendError, match="tokens in all"):
        ctx.decode_many([(0, [ctx.bos_id] * (ctx.n_batch + 1), True)])
    with pytest.raises(ContextOverflow):
        ctx.decode_many([(0, hi, True), (1, [], True)])
    assert ctx.seq_tokens(0) == [] and ctx.seq_tokens(1) == []  # nothing was decoded


def test_a_prefill_and_a_reply_from_given_logits_match_the_direct_calls(
    ctx: LlamaCppBackend,
) -> None:
    """One sequence alone in the steps decodes exactly as the backend's own calls do."""
    p = _prompt(ctx, PROMPTS[2])
    direct, _ = ctx.decode(p, 1)
    assert direct is not None
    want = ctx.generate(direct.copy(), GREEDY, seq=1).tokens
    with BatchScheduler(ctx) as sched:
        logits = sched.prefill(0, p).result(timeout=60)
        assert ctx.seq_tokens(0) == p
        assert np.array_equal(logits, direct)
        got = sched.submit(0, (), GREEDY, logits=logits).result(timeout=60)
        with pytest.raises(InvalidRequest, match="not both"):
            sched.submit(2, p, GREEDY, logits=logits)
        with pytest.raises(InvalidRequest, match="at least one token"):
            sched.prefill(2, [])
    assert got.tokens == want


@pytest.mark.parametrize("share", ["oldest", "equal"])
def test_prompts_of_two_tenants_share_the_steps_in_turn(ctx: LlamaCppBackend, share: str) -> None:
    """Tenant a queues three 40-token prompts, then tenant b one: with 16 tokens a step, b's
    prompt ends with a's first instead of after all of a's. Oldest first: the tenants take
    whole steps in turn; equal shares: each tenant gets half of every step (a's half goes to
    its oldest prompt: too small to split)."""
    done: list[str] = []
    prompt = [ctx.bos_id, *ctx.tokenize(" the" * 39)][:40]
    assert len(prompt) == 40
    with BatchScheduler(ctx, step_tokens=16, prefill_share=share) as sched:
        with sched.exclusive():  # every prompt is queued before the first step
            for seq, name in enumerate(("a0", "a1", "a2", "b")):
                f = sched.prefill(seq, prompt, program=Program(name[0]))
                f.add_done_callback(lambda _, name=name: done.append(name))
        deadline = time.monotonic() + 60
        while len(done) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert done == ["a0", "b", "a1", "a2"]  # first come first served would put b last


def test_a_prefill_no_step_has_started_can_be_withdrawn(ctx: LlamaCppBackend) -> None:
    p = _prompt(ctx, PROMPTS[0])
    with BatchScheduler(ctx) as sched:
        with sched.exclusive():  # no step runs while the guard is held
            queued = sched.prefill(0, p)
            assert sched.cancel(queued) and queued.cancelled()
            assert not sched.cancel(queued)  # gone already
        assert ctx.seq_tokens(0) == []  # nothing was decoded
        done = sched.prefill(0, p)
        done.result(timeout=60)
        assert not sched.cancel(done) and ctx.seq_tokens(0) == p
        sched.prefill(1, p).result(timeout=60)  # the step loop goes on


def test_a_short_prompt_is_not_held_behind_a_long_prefill(ctx: LlamaCppBackend) -> None:
    """A 300-token prefill is queued first, then three short prompts (the shortest last): with
    64 tokens a step the short ones are decoded whole in the first step, shortest first, and
    the long one in chunks after them; first come first served would put them after it."""
    done: list[str] = []
    long = [ctx.bos_id, *ctx.tokenize(" the" * 400)][:300]
    short = {"s20": long[:20], "s12": long[:12], "s5": long[:5]}
    with BatchScheduler(ctx, step_tokens=64) as sched:
        with sched.exclusive():  # every prompt is queued before the first step
            for seq, (name, prompt) in enumerate([("long", long), *short.items()]):
                f = sched.prefill(seq, prompt)
                f.add_done_callback(lambda _, name=name: done.append(name))
        deadline = time.monotonic() + 60
        while len(done) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = sched.stats()
    assert set(done[:3]) == {"s5", "s12", "s20"} and done[3] == "long"
    assert ctx.seq_tokens(0) == long and ctx.seq_tokens(3) == short["s5"]
    # 37 tokens whole in step 1 (the long prompt takes the 27 left), then 273 in chunks of 64
    assert stats.tokens == 337 and stats.steps == 1 + 5


@pytest.mark.parametrize(("share", "steps"), [("equal", {0: 4, 1: 4}), ("oldest", {0: 2, 1: 4})])
def test_prefills_that_start_together_end_together_with_equal_shares(
    ctx: LlamaCppBackend, share: str, steps: dict[int, int]
) -> None:
    """Two 160-token prefills queued together, 64 tokens a step: in equal shares (32 tokens
    each a step) both end in step 5, so their sessions' next turns can share a step; oldest
    first ends the first in step 3 (64 + 64 + 32) and the second in step 5. A prefill ends as
    soon as its call is done, inside its step (``steps`` then counts the steps before it). The
    same tokens are resident either way."""
    long = [ctx.bos_id, *ctx.tokenize(" the" * 400)][:160]
    ended: dict[int, int] = {}
    with BatchScheduler(ctx, step_tokens=64, prefill_share=share) as sched:
        with sched.exclusive():  # both queued before the first step
            for seq in (0, 1):
                f = sched.prefill(seq, long)
                f.add_done_callback(lambda _, s=seq: ended.setdefault(s, sched.stats().steps))
        deadline = time.monotonic() + 60
        while len(ended) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = sched.stats()
    assert ended == steps and stats.steps == 5 and stats.tokens == 320
    assert ctx.seq_tokens(0) == ctx.seq_tokens(1) == long


@pytest.mark.slow
@pytest.mark.parametrize("linger_ms", [0.0, 5000.0])
def test_a_step_of_prompts_alone_waits_for_the_next_request_of_a_sequence_just_done(
    ctx: LlamaCppBackend, linger_ms: float
) -> None:
    """Sequence 0's 64-token prompt fills step 1, then sequence 1's 300-token prefill goes on
    in 64-token chunks; sequence 0's next prompt comes 20 ms after step 1 (an agent loop's
    turnaround). With a linger, step 2 (prompts alone) waits for it, and it rides in step 2
    beside the chunk; without one, step 2 has started and the prompt waits for step 3. (It
    ends inside its step, when ``steps`` counts the steps before it.)"""
    long = [ctx.bos_id, *ctx.tokenize(" the" * 400)][:300]
    first, second = long[:64], [ctx.bos_id, *ctx.tokenize(" a")]
    at: list[int] = []
    with BatchScheduler(ctx, step_tokens=64, linger_ms=linger_ms) as sched:

        def next_prompt() -> None:
            f = sched.prefill(0, second)
            f.add_done_callback(lambda _: at.append(sched.stats().steps))

        with sched.exclusive():  # both queued before the first step
            head = sched.prefill(0, first)
            head.add_done_callback(lambda _: threading.Timer(0.02, next_prompt).start())
            tail = sched.prefill(1, long)
        tail.result(timeout=60)
        deadline = time.monotonic() + 60
        while not at and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ctx.seq_tokens(0) == [*first, *second] and ctx.seq_tokens(1) == long
    assert at == ([1] if linger_ms else [2])


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_a_linger_never_holds_a_generating_reply(ctx: LlamaCppBackend) -> None:
    """Sequence 0's prefill ends and it never sends another request: sequence 1's reply goes on
    without waiting (a 3 s linger before each of its 8 steps would outlast the timeout), and a
    step of a prompt alone waits no longer than the linger."""
    with BatchScheduler(ctx, linger_ms=3000.0) as sched:
        with sched.exclusive():
            sched.prefill(0, _prompt(ctx, PROMPTS[0]))
            reply = sched.submit(1, _prompt(ctx, PROMPTS[1]), GenerationParams(max_tokens=8))
        assert len(reply.result(timeout=15).tokens) == 8
        lone = sched.prefill(2, _prompt(ctx, PROMPTS[2]))  # waits out what is left of 3 s
        lone.result(timeout=20)


@pytest.mark.parametrize("bad", [-1.0, 60_001, "30", True, None])
def test_a_bad_linger_is_a_typed_error(ctx: LlamaCppBackend, bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"linger_ms must be a number of ms in 0\.\.60000"):
        BatchScheduler(ctx, linger_ms=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["fair", "EQUAL", None, 1, ["equal"]])
def test_a_bad_prefill_share_is_a_typed_error(ctx: LlamaCppBackend, bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"prefill_share must be one of 'oldest', 'equal'"):
        BatchScheduler(ctx, prefill_share=bad)  # type: ignore[arg-type]
    with BatchScheduler(ctx, prefill_share="equal") as sched:
        assert sched.planner.share is PrefillShare.EQUAL


# -- a step's calls chosen one at a time ------------------------------------------------------
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
