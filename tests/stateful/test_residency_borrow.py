"""Sessions that start alike decode what they share once (``Residency.borrow``), on the real
model (Gemma 3 270M): a new session of the same tenant copies another lane's KV for the longest
prefix of its wake instead of decoding it, and replies exactly as a session that decoded it all;
another tenant's KV is never a source; a short shared prefix is decoded, not copied."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from continuum import GenerationParams, ModelFile
from tests.conftest import WorkerFactory

# long enough that the copy is worth it: a system prompt of a few hundred tokens
SYSTEM = "You are a careful assistant for a small coding team. " + " ".join(
    f"Rule {i}: keep answers short and name the file you change." for i in range(40)
)
ASK = [{"role": "user", "content": "Which file holds the tests?"}]
PARAMS = GenerationParams(max_tokens=16)


def test_a_second_session_copies_the_shared_wake_and_replies_as_if_it_decoded_it(
    make_worker: WorkerFactory, gemma: ModelFile
) -> None:
    w = make_worker(gemma, n_ctx=4096, parallel=3)
    first = w.create_session(SYSTEM, tenant="acme")
    wake = len(first.transcript.wake or ())
    assert first.wake_decoded == wake > 300
    second = w.create_session(SYSTEM, tenant="acme")
    assert second.wake_decoded == 0
    assert w.residency.borrowed == wake
    a = first.append(ASK, PARAMS)
    b = second.append(ASK, PARAMS)
    assert b.tokens == a.tokens
    # a short question: fewer than BORROW_MIN more tokens to copy, so both decode it
    assert b.metrics.prompt_tokens_evaluated == a.metrics.prompt_tokens_evaluated


# what every session of one agent sends first after its instructions: the same environment
ENV = "<environment>\n" + "\n".join(f"file src/module_{i}.py: {i * 7} lines" for i in range(60))


@pytest.mark.slow
def test_a_new_sessions_first_turn_copies_what_another_session_holds_beyond_the_wake(
    make_worker: WorkerFactory, gemma: ModelFile
) -> None:
    """Codex's shape: the same system prompt, then the same environment message, then each
    session's own task. The second session decodes only its task, and replies exactly as a
    session of another tenant that decoded everything."""
    w = make_worker(gemma, n_ctx=4096, parallel=3)
    first = w.create_session(SYSTEM, tenant="acme")
    first.append([{"role": "user", "content": ENV + "\nTask: list the files."}], PARAMS)
    shared = len(w.backend.tokenize(ENV))
    borrowed = w.residency.borrowed
    task = [{"role": "user", "content": ENV + "\nTask: which module is longest?"}]
    second = w.create_session(SYSTEM, tenant="acme")
    got = second.append(task, PARAMS)
    assert w.residency.borrowed - borrowed >= len(second.transcript.wake or ()) + shared - 8
    assert got.metrics.prompt_tokens_evaluated < 40
    assert got.metrics.tokens_reused > shared
    cold = w.create_session(SYSTEM, tenant="globex").append(task, PARAMS)
    assert cold.metrics.prompt_tokens_evaluated > shared
    assert got.tokens == cold.tokens


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_another_tenants_kv_is_never_borrowed(make_worker: WorkerFactory, gemma: ModelFile) -> None:
    w = make_worker(gemma, n_ctx=4096, parallel=2)
    w.create_session(SYSTEM, tenant="acme")
    other = w.create_session(SYSTEM, tenant="globex")
    assert other.wake_decoded == len(other.transcript.wake or ())
    assert w.residency.borrowed == 0


def test_a_prefix_shorter_than_the_minimum_is_decoded_not_copied(
    make_worker: WorkerFactory, gemma: ModelFile
) -> None:
    w = make_worker(gemma, n_ctx=4096, parallel=2)
    w.create_session("Be brief.", tenant="acme")
    second = w.create_session("Be brief, and kind.", tenant="acme")
    assert second.wake_decoded > 0
    assert w.residency.borrowed == 0


@pytest.mark.slow
def test_sessions_that_borrow_under_concurrent_load_reply_as_cold(
    make_worker: WorkerFactory, gemma: ModelFile
) -> None:
    """Issue 37's fault list: shared-prefix sequences under concurrent load. Three new sessions
    of one tenant start at once, each borrowing the first session's KV (its wake and the shared
    environment), while the first session keeps generating in its lane; on an exact worker
    each one's reply equals the reply of a session of another tenant that decoded everything
    alone, and none decodes the shared part again."""
    w = make_worker(gemma, n_ctx=4096, parallel=4, exact=True)
    first = w.create_session(SYSTEM, tenant="acme")
    first.append([{"role": "user", "content": ENV + "\nTask: list the files."}], PARAMS)
    shared = len(w.backend.tokenize(ENV))
    tasks = [
        [{"role": "user", "content": ENV + f"\nTask: which module is the {which}?"}]
        for which in ("longest", "shortest", "third")
    ]
    start = threading.Barrier(len(tasks) + 1, timeout=60)

    def load() -> object:  # the first session generates while the others start
        start.wait()
        return first.append(
            [{"role": "user", "content": "Now describe each file."}],
            GenerationParams(max_tokens=48),
        )

    def new_session(task: list[dict[str, str]]) -> tuple[list[int], int]:
        start.wait()
        r = w.create_session(SYSTEM, tenant="acme").append(task, PARAMS)
        return list(r.tokens), r.metrics.prompt_tokens_evaluated

    with ThreadPoolExecutor(len(tasks) + 1) as pool:
        busy = pool.submit(load)
        got = [f.result(timeout=300) for f in [pool.submit(new_session, t) for t in tasks]]
        busy.result(timeout=300)
    for task, (tokens, evaluated) in zip(tasks, got, strict=True):
        assert evaluated < shared  # the shared environment was copied, not decoded
        cold = w.create_session(SYSTEM, tenant="globex")
        want = cold.append(task, PARAMS)
        assert want.metrics.prompt_tokens_evaluated > shared
        assert tokens == list(want.tokens)
        cold.close()
