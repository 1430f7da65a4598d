"""One owner of the context (issue 37): on a server-shaped engine (sessions on lanes, stateless
ops lent a lane, parked sessions' snapshots), every llama.cpp action on the context — each
decode, truncate, copy, snapshot save and restore — is made by the batch step loop's thread,
whichever thread asked for it (a request's, the idle-glue runner's). Another thread's action is
a command the loop applies between its steps (``ContextGuard.apply``). Real model: Gemma 3
270M, and the default model, Qwen2.5-Coder 0.5B."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from continuum import Engine, EngineConfig, GenerationParams, TokenOp, WorkerConfig
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.errors import BackendError
from tests.conftest import model
from tests.engine.test_core_lanes import SYSTEM

GREEDY = GenerationParams(max_tokens=12)
# the context's llama.cpp calls the backend makes (vocabulary reads are not actions on it)
ACTIONS = (
    "llama_memory_seq_rm",
    "llama_memory_seq_cp",
    "llama_memory_clear",
    "llama_state_seq_get_size",
    "llama_state_seq_get_data",
    "llama_state_seq_set_data",
    "llama_get_logits_ith",
)


@pytest.fixture(
    params=[
        "gemma3-270m",
        pytest.param("qwen2.5-coder-0.5b", marks=pytest.mark.slow),  # the default model
    ]
)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(
        model=model(request.param),
        n_ctx=2048,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp_path / "layer"),
        worker=WorkerConfig(snapshot_dir=tmp_path / "snaps", parallel=2),
        store=tmp_path / "history.db",
    ) as e:
        yield e


def _record(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, int]]:
    """Count every action on a context by (what, the thread that made it)."""
    seen: Counter[tuple[str, int]] = Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any) -> Any:
            seen[name, threading.get_ident()] += 1
            return fn(*args)

        return recorded

    for name in ACTIONS:
        monkeypatch.setattr(llama_cpp, name, wrap(name, getattr(llama_cpp, name)))
    decode = LlamaCppBackend._llama_decode
    monkeypatch.setattr(LlamaCppBackend, "_llama_decode", wrap("llama_decode", decode))
    return seen


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_every_action_on_the_context_is_made_by_the_step_loop(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = engine.worker()
    assert w.scheduler is not None
    loop = w.scheduler._thread.ident
    seen = _record(monkeypatch)
    sessions = [w.create_session(f"{SYSTEM} Agent {i}.", tenant="t1") for i in range(3)]
    assert sessions[0].lane is None  # the third parked the first: a snapshot saved
    errors: list[BaseException] = []

    def talk(i: int) -> None:
        try:
            s = sessions[i]
            first = s.append([_user("Name a river.")], GREEDY)
            s.append([_user("And a mountain?")], GREEDY)
            # an edited history: the session truncates back to the first turn and replies
            edited = [_user("Name a river."), {"role": "assistant", "content": first.text}]
            s.turn([*edited, _user("And a lake?")], GREEDY)
        except BaseException as e:
            errors.append(e)

    def ask() -> None:
        try:
            op = TokenOp("answer", prompt="The capital of France is", params=GREEDY)
            engine.run(op, namespace="t1")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(i,)) for i in range(3)]
    threads.append(threading.Thread(target=ask))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert w.swaps >= 2  # parked and restored on the way: snapshots saved and loaded
    actions = Counter(name for name, _ in seen.elements())
    wanted = ("llama_decode", "llama_memory_seq_rm", "llama_state_seq_get_data")
    for name in (*wanted, "llama_state_seq_set_data"):
        assert actions[name] > 0, f"the workload made no {name}"
    off_loop = {key: n for key, n in seen.items() if key[1] != loop}
    assert not off_loop, f"actions made off the step loop's thread: {off_loop}"


def test_a_failed_command_reaches_its_caller_and_the_loop_goes_on(engine: Engine) -> None:
    w = engine.worker()
    s = w.create_session(SYSTEM, tenant="t1")
    assert s.lane is not None
    seq = s.lane.seq
    held = list(seq.tokens)
    with pytest.raises(BackendError):
        seq.load_state(b"not a snapshot", held)  # from this thread: applied by the loop
    r = s.append([_user("Name a river.")], GREEDY)  # the loop and the session go on
    assert r.text
