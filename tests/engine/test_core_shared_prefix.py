"""A new session starts from a *parked* session's KV too (one prefix index over every resident
and parked sequence of a tenant), on the real model (Gemma 3 270M). Sessions that start alike
already copy a live lane's KV (tests/stateful/test_residency_borrow.py); here no lane holds the
shared prefix — one lane (``--parallel 1``: the session before it was parked to make room), or
every lane's session parked — and the new session's wake comes from the parked snapshot the
engine's layer KV tier indexes. It replies exactly as a session that decoded everything; the
parked session comes back unharmed; another tenant's snapshot is never a source; a corrupt
snapshot is decoded past, not trusted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from continuum import (
    Engine,
    EngineConfig,
    GenerationParams,
    ModelFile,
    Result,
    Worker,
    WorkerConfig,
)
from continuum.bench.conversation import long_system_prompt
from tests.conftest import corrupt_files

GREEDY = GenerationParams(max_tokens=12)
SYSTEM = long_system_prompt(400)
ASK = [{"role": "user", "content": "Name the first rule."}]


def _engine(mf: ModelFile, tmp: Path, parallel: int, ram: int = 512 << 20) -> Engine:
    return Engine.open(
        model=mf,
        n_ctx=2048,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp / "layer", snapshot_ram_bytes=ram),
        worker=WorkerConfig(snapshot_dir=tmp / "snaps", parallel=parallel),
        store=tmp / "history.db",
    )


def _paused_sibling(e: Engine) -> tuple[Worker, int, Result]:
    """The engine's worker once a session of tenant acme asked ``ASK`` and was parked (an
    agent paused for a tool: its KV a snapshot, no lane holding any of it); its wake's
    length and its reply."""
    w = e.worker()
    first = w.create_session(SYSTEM, tenant="acme")
    reply = first.append(ASK, GREEDY)
    w.park_active()
    for lane in w.lanes:
        lane.seq.clear()
    return w, len(first.transcript.wake or ()), reply


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_on_one_lane_a_new_session_starts_from_the_parked_sessions_wake(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path, parallel=1) as e:
        w = e.worker()
        first = w.create_session(SYSTEM, tenant="acme")
        wake = len(first.transcript.wake or ())
        assert first.wake_decoded == wake > 300
        a = first.append(ASK, GREEDY)
        second = w.create_session(SYSTEM, tenant="acme")  # parks the first: its lane is needed
        assert first.lane is None and second.wake_decoded == 0
        assert w.residency.borrowed == wake and w.residency.borrowed_parked == wake
        b = second.append(ASK, GREEDY)
        assert b.tokens == a.tokens  # as if it had decoded its wake itself
        cold = w.create_session(SYSTEM, tenant="globex")  # another tenant: nothing to start from
        assert cold.wake_decoded == wake
        assert cold.append(ASK, GREEDY).tokens == a.tokens
        # the parked session's snapshot was only read: it comes back whole
        again = first.append([{"role": "user", "content": "And the next?"}], GREEDY)
        assert again.metrics.resets == () and again.metrics.tokens_reused > wake


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_in_lanes_a_new_session_starts_from_a_parked_sibling_when_no_lane_holds_it(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path, parallel=2) as e:
        w, wake, a = _paused_sibling(e)
        second = w.create_session(SYSTEM, tenant="acme")
        assert second.wake_decoded == 0 and w.residency.borrowed_parked == wake
        assert second.append(ASK, GREEDY).tokens == a.tokens


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_sessions_created_at_once_start_from_a_parked_sibling_and_reply_as_cold(
    gemma: ModelFile, tmp_path: Path
) -> None:
    """Four sessions of the tenant created and asked at once on two lanes, their sibling
    parked: those that find no lane holding the prompt load it from the snapshot, the others
    copy it from a lane; every reply is the one the sibling gave."""
    with _engine(gemma, tmp_path, parallel=2) as e:
        w, wake, a = _paused_sibling(e)

        def agent(_: int) -> tuple[int, tuple[int, ...]]:
            s = w.create_session(SYSTEM, tenant="acme")
            return s.wake_decoded, s.append(ASK, GREEDY).tokens

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(agent, range(4)))
        assert all(tokens == a.tokens for _, tokens in got)
        assert all(decoded == 0 for decoded, _ in got)  # nobody prefilled the prompt again
        assert w.residency.borrowed_parked >= wake and w.residency.borrowed == 4 * wake


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_corrupt_parked_snapshot_is_decoded_past_and_forgotten(
    gemma: ModelFile, tmp_path: Path
) -> None:
    with _engine(gemma, tmp_path, parallel=1, ram=1) as e:  # every snapshot goes to disk
        w, wake, a = _paused_sibling(e)
        assert corrupt_files(tmp_path / "layer")
        second = w.create_session(SYSTEM, tenant="acme")
        assert second.wake_decoded == wake and w.residency.borrowed_parked == 0
        assert e.layer.index.get("acme", second.wake_tokens(SYSTEM)) is None  # forgotten
        assert second.append(ASK, GREEDY).tokens == a.tokens
