"""A KV snapshot is loaded only into the llama.cpp build (and cache types) that wrote it: on the
real model, a parked session whose snapshot header names another build is rebuilt from the
history, visibly (``restore_failed``), and one from this build is restored with no prompt token
evaluated again."""

from __future__ import annotations

from pathlib import Path

import pytest

from continuum import GenerationParams, ModelFile
from continuum.backends.llama_process import build_id
from continuum.stateful.residency import snapshot_key
from continuum.store.snapshot_format import decode_snapshot, encode_snapshot
from continuum.store.snapshots import file_name
from tests.conftest import WorkerFactory

PARAMS = GenerationParams(max_tokens=16)
SYSTEM = "You are Eva, a concise assistant."
TURNS = ["My name is Priya.", "I have a dog named Biscuit."]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_the_context_config_names_the_build_and_the_cache_types(
    make_worker: WorkerFactory, gemma: ModelFile
) -> None:
    ctx = make_worker(gemma).seq.backend.context_config()
    assert ctx["llama_build"] == build_id()
    assert build_id().startswith("llama-cpp-python ") and "llama.cpp " in build_id()
    assert (ctx["type_k"], ctx["type_v"]) == ("f16", "f16")  # what the context was made with


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_snapshot_from_another_build_is_refused_and_the_session_rebuilt(
    make_worker: WorkerFactory, gemma: ModelFile, tmp_path: Path
) -> None:
    store = tmp_path / "history.db"
    w = make_worker(gemma, store=store, eager_glue=False)
    ids, resident = [], {}
    for _ in range(2):  # the same conversation twice: one snapshot is altered, one is not
        s = w.create_session(SYSTEM)
        for text in TURNS:
            s.append([user(text)], PARAMS)
        ids.append(s.id)
        resident[s.id] = list(s.resident or w.seq.tokens)
    ctx = w.seq.backend.context_config()
    w.close()  # both sessions' KV is written to disk as snapshots
    foreign, same = ids
    path = tmp_path / "snapshots" / file_name(snapshot_key(foreign))
    snap = decode_snapshot(path.read_bytes(), model=gemma.digest, ctx=ctx)
    other = {**ctx, "llama_build": "llama-cpp-python 0.3.1; llama.cpp 1234567 (ggml 0.9.0)"}
    path.write_bytes(
        encode_snapshot(
            namespace=snap.namespace,
            model=gemma.digest,
            ctx=other,
            tokens=snap.tokens,
            payload=snap.payload,
            prefix=str(snap.header["prefix_hash"]),
            key=snapshot_key(foreign),
        )
    )

    w2 = make_worker(gemma, store=store, eager_glue=False)
    rebuilt = w2.open_session(foreign)
    assert not path.exists()  # refused and deleted: it would never load here
    r = rebuilt.append([user("What is my name?")], PARAMS)
    (reset,) = r.metrics.resets
    assert reset.reason.value == "restore_failed"
    assert "another llama.cpp build" in reset.detail and "1234567" in reset.detail
    assert reset.tokens_rebuilt >= len(resident[foreign])  # everything decoded again

    restored = w2.open_session(same)
    r2 = restored.append([user("What is my name?")], PARAMS)
    (ok,) = r2.metrics.resets
    assert ok.reason.value == "evicted" and f"restored {len(resident[same])} tokens" in ok.detail
    # no token that was resident is evaluated again: only the last reply's closing template
    # tokens (never decoded before) in the rebuild, then the new message in the turn
    assert ok.tokens_rebuilt == r2.metrics.tokens_reused - len(resident[same]) <= 4
    assert r2.metrics.prompt_tokens_evaluated == r.metrics.prompt_tokens_evaluated  # the message
    assert r2.metrics.tokens_reused == r.metrics.tokens_reused
    assert r2.text == r.text  # restored or rebuilt, the same state: the same greedy reply
