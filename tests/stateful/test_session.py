"""Stateful sessions on the real models: only the delta is decoded, and nothing is lost.

Every test here runs llama.cpp on the real default model (and, where parametrised, on
SmolLM2-135M-Instruct, whose ChatML template comes from its GGUF).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from continuum import (
    ContextOverflow,
    GenerationParams,
    InvalidRequest,
    LlamaConfig,
    ModelFile,
    ResetReason,
    Result,
    Worker,
    WorkerConfig,
)
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.bench.conversation import SYSTEM, TURNS
from tests.conftest import WorkerFactory

PARAMS = GenerationParams(max_tokens=24)
# Logits of the same prompt differ by up to ~1.3 between llama.cpp's single-token and batched
# kernels (max |Δlogit| over the vocabulary, measured 0.9-1.3; near-tie gaps seen: <= 0.09).
# A greedy choice that differs between stateful and cold must be the runner-up within this
# margin: a floating-point near-tie, never a silent mismatch.
NEAR_TIE = 0.5


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def turn_marker(worker: Worker) -> int:
    """The token that opens every message segment in the model's chat format."""
    text = "<start_of_turn>" if worker.backend.chat_format.name == "gemma" else "<|im_start|>"
    (tok,) = worker.backend.tokenize(text)
    return tok


def run_turns(session, n: int, params: GenerationParams = PARAMS) -> list[Result]:  # type: ignore[no-untyped-def]
    return [session.append([user(t.content)], params) for t in TURNS[:n]]


@pytest.mark.slow
def test_sixteen_turns_decode_exactly_the_new_messages_and_glue(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file)
    fmt, backend = w.backend.chat_format, w.backend
    s = w.create_session(SYSTEM)
    msgs: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    resident_text = fmt.render(msgs, add_generation_prompt=False)
    wake = backend.tokenize(resident_text)
    if backend.add_bos and wake[:1] != [backend.bos_id]:
        wake.insert(0, backend.bos_id)
    assert backend.tokens == wake  # the wake phase prefilled the system prompt
    pending: list[int] = []  # a generated token not yet decoded (reply cut by max_tokens)
    for turn in TURNS:
        before = list(backend.tokens)
        msgs.append(user(turn.content))
        full = fmt.render(msgs, add_generation_prompt=True)
        assert full.startswith(resident_text)
        expected_delta = pending + backend.tokenize(full[len(resident_text) :])

        r = s.append([user(turn.content)], PARAMS)

        m = r.metrics
        after = backend.tokens
        assert m.tokens_reused == len(before)
        assert m.tokens_truncated == 0
        assert m.resets == ()
        assert m.prompt_tokens_evaluated == len(expected_delta)
        assert after[: len(before)] == before
        n_prompt = len(before) + len(expected_delta)
        assert after[len(before) : n_prompt] == expected_delta
        # generated tokens stay resident exactly as generated
        assert after[n_prompt:] == list(r.tokens)[: len(after) - n_prompt]
        assert m.context_used == len(after)
        assert m.context_limit == backend.n_ctx
        assert m.completion_tokens == len(r.tokens) > 0
        assert m.wire_chars < 200  # only the new message crossed the boundary
        pending = list(r.tokens[len(after) - n_prompt :])
        msgs.append({"role": "assistant", "content": r.text})
        resident_text = full + r.text
    assert [m["content"] for m in s.history[1:]] == [m["content"] for m in msgs[1:]]


def _check_against_cold(
    cold: LlamaCppBackend, prompt: list[int], r: Result, gaps: list[float]
) -> int:
    """Teacher-force the stateful reply through a cold full recompute of the same prompt;
    every stateful choice must be the cold argmax or a near-tie runner-up. Returns ties."""
    cold.clear()
    logits, _ = cold.decode(prompt)
    chosen = list(r.tokens)
    ties = 0
    for j in range(len(chosen) + (1 if r.finish_reason == "stop" else 0)):
        assert logits is not None
        top2 = np.argsort(-logits)[:2]
        if j < len(chosen):
            tok = chosen[j]
            ok = tok == top2[0]
        else:  # the stateful run stopped here: cold must also pick an end-of-generation token
            tok = int(top2[0]) if cold.is_eog(int(top2[0])) else int(top2[1])
            ok = cold.is_eog(int(top2[0]))
        if not ok:
            gap = float(logits[top2[0]] - logits[tok])
            assert tok == top2[1], f"position {j}: stateful token is not cold's top-2"
            assert gap < NEAR_TIE, f"position {j}: cold prefers another token by {gap:.3f}"
            gaps.append(gap)
            ties += 1
        if j < len(chosen):
            logits, _ = cold.decode([tok])
    return ties


@pytest.mark.slow
def test_greedy_stateful_equals_cold_recompute_or_is_a_measured_near_tie(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file)
    s = w.create_session(SYSTEM)
    gaps: list[float] = []
    positions = 0
    with LlamaCppBackend(model_file, LlamaConfig(n_ctx=2048)) as cold:
        for turn in TURNS[:8]:
            r = s.append([user(turn.content)], PARAMS)
            n_prompt = r.metrics.tokens_reused + r.metrics.prompt_tokens_evaluated
            prompt = w.seq.tokens[:n_prompt]
            positions += len(r.tokens)
            _check_against_cold(cold, prompt, r, gaps)
    print(f"\n{model_file.name}: {len(gaps)} near-ties in {positions} positions, gaps {gaps}")
    assert len(gaps) <= positions // 10  # ties are rare; a systematic mismatch would fail


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_editing_an_earlier_message_truncates_there_and_decodes_only_from_it(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file)
    s = w.create_session(SYSTEM)
    run_turns(s, 4)
    history = s.history  # system, u0, a0, u1, a1, u2, a2, u3, a3
    resident = list(w.seq.tokens)
    marker = turn_marker(w)
    starts = [i for i, t in enumerate(resident) if t == marker]
    # gemma renders u0 inside the turn the system segment opened: markers open system, a0, u1;
    # chatml opens a turn per message: system, u0, a0, u1
    u1_start = starts[2] if w.backend.chat_format.name == "gemma" else starts[3]
    edited = [*history[:3], user("Actually, my name is Ravi and I am a chef.")]

    r = s.turn(edited, PARAMS)

    assert r.metrics.tokens_reused == u1_start
    assert r.metrics.tokens_truncated == len(resident) - u1_start
    assert r.metrics.resets == ()
    assert w.seq.tokens[:u1_start] == resident[:u1_start]
    assert [m["content"] for m in s.history] == [
        *(m["content"] for m in edited),
        r.text,
    ]
    # and the next turn appends again
    before = len(w.seq.tokens)
    r2 = s.append([user("What is my job?")], PARAMS)
    assert r2.metrics.tokens_reused == before and r2.metrics.tokens_truncated == 0


def test_regenerate_drops_the_last_reply_and_decodes_only_the_reply_header(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file)
    s = w.create_session(SYSTEM)
    run_turns(s, 3)
    history = s.history
    assert history[-1]["role"] == "assistant"
    fmt = w.backend.chat_format
    header = w.backend.tokenize(fmt.generation_prompt(history[:-1]))
    turns_before = s.turns

    r = s.turn(history[:-1], PARAMS)

    assert r.metrics.prompt_tokens_evaluated == len(header)
    assert r.metrics.resets == ()
    assert len(s.history) == len(history)
    assert s.history[:-1] == history[:-1]
    assert s.turns == turns_before + 1


def test_changing_the_system_prompt_rebuilds_visibly(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file)
    s = w.create_session(SYSTEM)
    run_turns(s, 2)
    history = s.history
    changed = [{"role": "system", "content": "You are a pirate."}, *history[1:], user("Hello?")]

    r = s.turn(changed, PARAMS)

    assert r.metrics.tokens_reused == 0
    assert [x.reason for x in r.metrics.resets] == [ResetReason.DIVERGENCE]
    assert r.metrics.prompt_tokens_evaluated == r.metrics.context_used - (
        len(r.tokens) - (1 if r.finish_reason == "length" else 0)
    )
    assert s.system == "You are a pirate."
    assert w.store.load_session(s.id).system == "You are a pirate."
    assert w.store.resets(s.id)[-1]["reason"] == "divergence"


@pytest.mark.slow
def test_crossing_the_high_water_mark_rebuilds_then_appends_again(
    model_file: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(model_file, n_ctx=512, high_water=0.6)  # 307 tokens
    s = w.create_session(SYSTEM)
    params = GenerationParams(max_tokens=32)
    results = [s.append([user(t.content)], params) for t in TURNS[:12]]
    rebuilt = [i for i, r in enumerate(results) if r.metrics.resets]
    assert rebuilt, "12 turns of ~60 tokens must cross a 307-token high-water mark"
    first = results[rebuilt[0]]
    (reset,) = first.metrics.resets
    assert reset.reason == ResetReason.HIGH_WATER
    assert first.metrics.tokens_reused == len(s.wake_tokens(SYSTEM))  # the wake prefix survives
    assert first.metrics.context_used <= 307 + 1
    following = results[rebuilt[0] + 1]
    if rebuilt[0] + 1 not in rebuilt:
        assert following.metrics.tokens_reused == first.metrics.context_used
    # the history stays whole: authoritative, even where the KV window dropped turns
    assert len(s.history) == 1 + 2 * 12
    assert all(r.metrics.context_used < 512 for r in results)


@pytest.mark.slow
def test_a_moving_window_goes_down_to_the_low_water_mark_and_moves_less_often(
    gemma: ModelFile, make_worker: WorkerFactory, tmp_path: Path
) -> None:
    params = GenerationParams(max_tokens=32)
    moves = {}
    for low in (1.0, 0.6):
        w = make_worker(gemma, n_ctx=512, high_water=0.6, low_water=low, store=tmp_path / f"{low}")
        s = w.create_session(SYSTEM)
        results = [s.append([user(t.content)], params) for t in TURNS[:14]]
        moved = [r for r in results if r.metrics.resets]
        assert moved and all(r.metrics.resets[0].reason == ResetReason.HIGH_WATER for r in moved)
        mark = int(307 * low)  # the high-water mark is 307 tokens
        assert all(r.metrics.context_used <= mark for r in moved)
        moves[low] = len(moved)
    assert moves[0.6] < moves[1.0]


@pytest.mark.slow
def test_the_turn_after_a_move_reevaluates_no_glue(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, n_ctx=512, high_water=0.6, eager_glue=True)
    s = w.create_session(SYSTEM)
    params = GenerationParams(max_tokens=32)
    moved = False
    for t in TURNS[:14]:
        assert w.settle()  # the glue decoded while idle, as between an agent's requests
        resident = len(w.seq.tokens)
        r = s.append([user(t.content)], params)
        m = r.metrics
        if moved:  # everything resident after the move, its glue included, is reused
            assert (m.tokens_reused, m.eager_tokens_discarded) == (resident, 0)
            assert m.eager_tokens_used > 0
            return
        moved = bool(m.resets)
    pytest.fail("14 turns of ~60 tokens must cross a 307-token high-water mark")


@pytest.mark.parametrize("bad", [0, 1.5, -0.2, True, "0.5"])
def test_a_low_water_mark_outside_the_high_water_mark_is_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="low_water must be a share"):
        WorkerConfig(low_water=bad)  # type: ignore[arg-type]


def test_one_message_larger_than_the_context_is_a_typed_error_that_loses_nothing(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma, n_ctx=256)
    s = w.create_session(SYSTEM)
    s.append([user("Hello.")], GenerationParams(max_tokens=8))
    history, resident = s.history, list(w.seq.tokens)
    with pytest.raises(ContextOverflow) as e:
        s.append([user("word " * 400)], GenerationParams(max_tokens=8))
    assert e.value.n_ctx == 256 and e.value.n_requested > 256
    assert "256" in str(e.value) and "Shorten" in str(e.value)
    assert s.history == history
    assert w.seq.tokens == resident
    r = s.append([user("Still there?")], GenerationParams(max_tokens=8))
    assert r.metrics.tokens_reused == len(resident)


def test_streaming_pieces_join_to_the_reply(gemma: ModelFile, make_worker: WorkerFactory) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    pieces: list[str] = []
    r = s.append([user("Tell me about the sea.")], PARAMS, on_text=pieces.append)
    assert "".join(pieces) == r.text
    assert len(pieces) > 1


def test_stop_strings_end_the_reply_before_the_stop(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    free = s.append([user("Count from one to ten.")], GenerationParams(max_tokens=24))
    words = free.text.split()
    assert len(words) > 3
    stop = words[2]
    s2 = w.create_session(SYSTEM)
    pieces: list[str] = []
    r = s2.append(
        [user("Count from one to ten.")],
        GenerationParams(max_tokens=24, stop=(stop,)),
        on_text=pieces.append,
    )
    assert r.finish_reason == "stop"
    assert stop not in r.text
    assert free.text.startswith(r.text)
    assert "".join(pieces) == r.text
    # what stays of the reply is its text before the stop string: in the tokens stored with
    # it, and in the KV (none of the stop string's tokens stay resident)
    b = w.backend
    assert b.detokenize(r.tokens) == r.text
    prompt = r.metrics.prompt_tokens_evaluated + r.metrics.tokens_reused
    tail = list(w.seq.tokens)[prompt:]  # the reply's tokens that stayed resident
    assert tail == list(r.tokens[: len(tail)]) and stop not in b.detokenize(tail)
    again = s2.append([user("Go on.")], GenerationParams(max_tokens=4))
    assert again.metrics.tokens_truncated == 0  # the next turn appends to what is resident


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_an_abandoned_turn_commits_nothing_and_the_session_recovers(
    gemma: ModelFile, make_worker: WorkerFactory
) -> None:
    w = make_worker(gemma)
    s = w.create_session(SYSTEM)
    s.append([user("Hello.")], PARAMS)
    history, turns = s.history, len(w.store.turns(s.id))

    class ClientGone(Exception):
        pass

    def disconnect(_: str) -> None:
        raise ClientGone

    with pytest.raises(ClientGone):
        s.append([user("Write a long poem.")], PARAMS, on_text=disconnect)
    assert s.history == history
    assert len(w.store.turns(s.id)) == turns
    assert len(w.store.messages(s.id)) == len(history) - 1
    # the KV holds the abandoned message; resending it reuses it, verified by identity
    r = s.append([user("Write a long poem.")], PARAMS)
    assert r.metrics.tokens_truncated > 0  # the partial reply was cut away
    assert s.history[-2]["content"] == "Write a long poem."
    w2 = make_worker(gemma, store=w.store.path.parent / "other.db")
    fresh = w2.create_session(SYSTEM)
    fresh.append([user("Hello.")], PARAMS)
    again = fresh.append([user("Write a long poem.")], PARAMS)
    n_prompt = again.metrics.tokens_reused + again.metrics.prompt_tokens_evaluated
    assert r.metrics.tokens_reused + r.metrics.prompt_tokens_evaluated == n_prompt
    assert w.seq.tokens[:n_prompt] == w2.backend.tokens[:n_prompt]


def test_every_decode_in_the_process_runs_on_one_compute_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ggml keeps an OpenMP team per calling thread and a second live team halves decode
    speed here, so decodes from any thread (request threads, the idle runner) and any context
    hop to one thread."""
    import threading

    import llama_cpp

    from continuum.backends.llama_process import compute_thread_ident
    from continuum.backends.models import resolve_model

    seen: list[int] = []
    real = llama_cpp.llama_decode

    def observed(ctx, batch):  # type: ignore[no-untyped-def]
        seen.append(threading.get_ident())
        return real(ctx, batch)

    monkeypatch.setattr(llama_cpp, "llama_decode", observed)
    model = resolve_model(None)
    with LlamaCppBackend(model) as one, LlamaCppBackend(model) as two:
        tokens = one.tokenize("The same context, decoded from two threads.")
        one.decode(tokens[:4])
        other = threading.Thread(target=lambda: one.decode(tokens[4:]))
        other.start()
        other.join()
        two.decode(tokens)
        assert len(seen) == 3 and set(seen) == {compute_thread_ident()}
        assert threading.get_ident() not in seen
        assert one.tokens == two.tokens == tokens  # every piece landed, in order


def test_a_session_without_a_system_prompt_on_the_default_model(
    make_worker: WorkerFactory,
) -> None:
    """Qwen's template cannot render an empty conversation (it reads messages[0]) and injects
    its own system prompt: the wake prefix is empty, and the second turn appends only."""
    from tests.conftest import model

    w = make_worker(model("qwen2.5-coder-0.5b"))
    s = w.create_session(None)
    p = GenerationParams(max_tokens=6)
    first = s.append([{"role": "user", "content": "My name is Ada."}], p)
    assert first.metrics.tokens_reused == 0 and first.metrics.prompt_tokens_evaluated > 20
    second = s.append([{"role": "user", "content": "What is my name?"}], p)
    assert second.metrics.tokens_reused > first.metrics.prompt_tokens_evaluated
    assert second.metrics.prompt_tokens_evaluated < 20
