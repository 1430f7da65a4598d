"""Moving a session between two workers with separate stores as one bundle, on the real model:
the moved session answers as the first worker would have, evaluating only the new message; a
bundle without KV, or with KV from another llama.cpp build, is rebuilt from its history,
visibly; and every refused import leaves the target store as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum import (
    BundleModelMismatch,
    BundleTenantMismatch,
    ContextOverflow,
    GenerationParams,
    ModelFile,
    SessionExists,
    SessionNotFound,
    Worker,
)
from continuum.stateful.bundle import export_session, import_session
from continuum.stateful.residency import snapshot_key
from continuum.stateful.session import ChatSession
from continuum.store.bundle_format import decode_bundle, encode_bundle
from continuum.store.snapshot_format import decode_snapshot, encode_snapshot
from tests.conftest import WorkerFactory, model

PARAMS = GenerationParams(max_tokens=16)
SYSTEM = "You are Eva, a concise assistant."
TURNS = ["My name is Priya.", "I have a dog named Biscuit.", "I live in Lisbon."]
ASK = [{"role": "user", "content": "What is my name?"}]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def three_turns(w: Worker, system: str = SYSTEM, tenant: str = "acme") -> ChatSession:
    s = w.create_session(system, tenant=tenant)
    for text in TURNS:
        s.append([user(text)], PARAMS)
    # the glue is decoded in the background: let it finish, so the first worker's next turn
    # and the second's decode the same batches (a batch of < 8 tokens gives other logits than
    # the same tokens inside a larger one)
    assert w.settle()
    return s


def worker(make_worker: WorkerFactory, tmp: Path, mf: ModelFile, **kw: object) -> Worker:
    """A worker with its own history store and snapshot directory under ``tmp``, decoding the
    next turn's opening template tokens while idle (as served)."""
    return make_worker(mf, store=tmp / "history.db", eager_glue=True, **kw)


def test_a_moved_session_answers_as_it_would_have_with_no_prefill(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    a = worker(make_worker, tmp_path / "a", gemma)
    s = three_turns(a)
    resident = list(a.seq.tokens)
    blob = export_session(a, s.id)
    exported = decode_bundle(blob)
    assert exported.snapshot is not None and exported.record.tenant == "acme"
    history, turns, resets = s.history, a.store.turns(s.id), a.store.resets(s.id)
    on_a = s.append(ASK, PARAMS)  # what the first worker answers next

    b = worker(make_worker, tmp_path / "b", gemma)
    done = import_session(b, blob)
    assert (done.kv, done.session.id, done.session.tenant) == ("restored", s.id, "acme")
    assert done.session.history == history
    assert b.store.turns(s.id) == turns and b.store.resets(s.id) == resets
    assert b.store.session_tenant(s.id) == "acme"
    on_b = done.session.append(ASK, PARAMS)
    assert on_b.text == on_a.text and on_b.tokens == on_a.tokens
    (reset,) = on_b.metrics.resets
    # the whole history restored from A's KV and nothing of it decoded again; B's turn
    # evaluates what A's next turn did (the new message alone) on what A had resident
    assert reset.reason.value == "evicted" and "restored" in reset.detail
    assert reset.tokens_rebuilt == 0
    m_a, m_b = on_a.metrics, on_b.metrics
    assert m_b.prompt_tokens_evaluated == m_a.prompt_tokens_evaluated < 30
    assert m_b.tokens_reused == m_a.tokens_reused == len(resident)
    assert on_b.turn == on_a.turn == 4


def test_a_bundle_without_kv_is_rebuilt_from_its_history_visibly(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    a = worker(make_worker, tmp_path / "a", gemma)
    s = three_turns(a)
    blob = export_session(a, s.id, kv=False)
    assert decode_bundle(blob).snapshot is None
    b = worker(make_worker, tmp_path / "b", gemma)
    done = import_session(b, blob)
    assert done.kv == "none"
    r = done.session.append(ASK, PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason.value == "evicted" and "restored" not in reset.detail
    # the whole conversation decoded again (all A had resident but the next turn's opening)
    assert reset.tokens_rebuilt >= len(a.seq.tokens) - 4


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_kv_from_another_llama_cpp_build_is_dropped_and_the_session_rebuilt(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    a = worker(make_worker, tmp_path / "a", gemma)
    s = three_turns(a)
    good = decode_bundle(export_session(a, s.id))
    assert good.snapshot is not None
    ctx = a.seq.backend.context_config()
    snap = decode_snapshot(good.snapshot, model=gemma.digest, ctx=ctx)
    other = {**ctx, "llama_build": "llama-cpp-python 0.2.0; llama.cpp 7654321"}
    foreign = encode_snapshot(
        namespace=snap.namespace,
        model=gemma.digest,
        ctx=other,
        tokens=snap.tokens,
        payload=snap.payload,
        prefix=str(snap.header["prefix_hash"]),
        key=snapshot_key(s.id),
    )
    blob = encode_bundle(
        type(good)(good.record, good.messages, good.turns, good.resets, foreign, 0.0)
    )
    b = worker(make_worker, tmp_path / "b", gemma)
    done = import_session(b, blob)
    assert done.kv == "dropped" and "another llama.cpp build" in done.detail
    assert "7654321" in done.detail
    assert snapshot_key(s.id) not in b.snapshots  # never registered
    r = done.session.append(ASK, PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason.value == "restore_failed" and "7654321" in reset.detail
    assert reset.tokens_rebuilt >= len(snap.tokens) - 4  # all but the next turn's opening


@pytest.mark.slow
def test_refused_imports_leave_the_target_store_as_it_was(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    a = worker(make_worker, tmp_path / "a", gemma, n_ctx=2048)
    s = three_turns(a, system=SYSTEM + " Keep every answer short and kind." * 60)
    blob = export_session(a, s.id)

    b = worker(make_worker, tmp_path / "b", gemma)
    with pytest.raises(BundleTenantMismatch):
        import_session(b, blob, tenant="other")
    taken = b.create_session(SYSTEM, session_id=s.id, tenant="acme")
    taken.append([user("mine")], PARAMS)
    with pytest.raises(SessionExists):
        import_session(b, blob, tenant="acme")
    assert b.store.load_session(s.id).turns == 1
    assert b.store.messages(s.id)[0].message == user("mine")
    assert b.store.count_sessions("other") == 0 and b.store.count_sessions("acme") == 1

    smol = worker(make_worker, tmp_path / "c", model("smollm2-135m"))
    with pytest.raises(BundleModelMismatch) as info:
        import_session(smol, blob)
    assert info.value.model == gemma.digest and "import it on a worker serving" in str(info.value)
    assert smol.store.count_sessions("acme") == 0

    small = worker(make_worker, tmp_path / "d", gemma, n_ctx=256)  # the history cannot fit
    with pytest.raises(ContextOverflow):
        import_session(small, blob)
    with pytest.raises(SessionNotFound):  # written, then deleted again: nothing half-imported
        small.store.load_session(s.id)
    assert small.sessions() == [] and small.snapshots.keys() == []


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_kv_llama_cpp_refuses_to_load_is_dropped_and_forgotten(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    """Same build and cache types, but a context too small for the snapshot's cells: llama.cpp
    refuses the state, the session is rebuilt within this worker's window, visibly, and the
    snapshot is not kept to be refused again at every reopen."""
    a = worker(make_worker, tmp_path / "a", gemma, n_ctx=2048)
    s = three_turns(a, system=SYSTEM + " Keep every answer short and kind." * 30)
    assert len(a.seq.tokens) > 256
    small = worker(make_worker, tmp_path / "b", gemma, n_ctx=256)
    done = import_session(small, export_session(a, s.id))
    assert done.kv == "dropped" and "rejected" in done.detail
    assert snapshot_key(s.id) not in small.snapshots
    r = done.session.append(ASK, PARAMS)
    reasons = [x.reason.value for x in r.metrics.resets]
    assert reasons[0] == "restore_failed" and set(reasons) <= {"restore_failed", "high_water"}
    assert r.metrics.context_limit == 256 and small.store.load_session(s.id).turns == 4
