"""Contexts sharing one model's weights, and a decode stopped at its deadline (real model)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from continuum import BackendError, DecodeAborted, LlamaConfig, ModelFile
from continuum.backends.llama_process import Weights
from continuum.backends.llamacpp import LlamaCppBackend

CONFIG = LlamaConfig(n_ctx=512, n_threads=2, n_threads_batch=2)


def _prompt(b: LlamaCppBackend) -> list[int]:
    return b.tokenize("The quick brown fox jumps over the lazy dog. " * 3)


def test_a_sibling_shares_the_weights_and_outlives_its_owner(gemma: ModelFile) -> None:
    owner = LlamaCppBackend(gemma, CONFIG)
    sibling = owner.sibling(LlamaConfig(n_ctx=256, n_threads=2, n_threads_batch=2))
    assert sibling._weights is owner._weights and sibling.n_ctx == 256
    tokens = _prompt(owner)
    want, _ = owner.decode(tokens)
    assert want is not None
    want = want.copy()
    owner.close()  # the weights stay while the sibling holds them
    got, _ = sibling.decode(tokens)
    assert got is not None and np.array_equal(got, want)
    sibling.close()
    with pytest.raises(Exception, match="closed"):
        owner.sibling(CONFIG)


def test_a_decode_past_its_deadline_is_stopped_and_leaves_the_sequence_as_it_was(
    gemma: ModelFile,
) -> None:
    with LlamaCppBackend(gemma, CONFIG) as b:
        head = b.tokenize("Hello there.")
        b.decode(head)
        tokens = _prompt(b)
        with pytest.raises(DecodeAborted) as err:
            b.decode(tokens, deadline=time.monotonic() - 1)
        assert err.value.n_past == len(head) and err.value.n_tokens == len(tokens)
        assert b.seq_tokens(0) == head
        got, _ = b.decode(tokens, deadline=time.monotonic() + 60)  # in time: a normal decode
        assert got is not None
        got = got.copy()
        b.truncate(len(head))
        again, _ = b.decode(tokens)  # no deadline: the abort callback is gone
        assert again is not None and np.array_equal(again, got)


def test_contexts_on_one_file_share_its_weights_and_retained_keeps_them(
    gemma: ModelFile,
) -> None:
    first = LlamaCppBackend(gemma, CONFIG)
    second = LlamaCppBackend(gemma, CONFIG)
    weights = first._weights
    assert second._weights is weights  # one load for both
    first.close()
    second.close()
    with LlamaCppBackend(gemma, CONFIG) as third:  # the suite runs inside Weights.retained()
        assert third._weights is weights
        assert third.decode(_prompt(third))[0] is not None


def test_weights_are_freed_when_the_last_holder_closes_outside_retained(gemma: ModelFile) -> None:
    code = f"""
from pathlib import Path
from continuum.backends.llama_process import Weights
path = Path({str(gemma.path)!r})
a = Weights.open(path)
b = Weights.open(path)
assert a is b and a._holders == 2
a.release()
b.release()
assert Weights._live == {{}}, "freed at the last release"
c = Weights.open(path)
assert c is not a  # loaded again
with Weights.retained():
    c.release()
    assert Weights.open(path) is c  # kept, and reused
    c.release()
    assert list(Weights._live.values()) == [c]
assert Weights._live == {{}}, "freed at the end of the block"
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_missing_model_file_is_a_typed_error_saying_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"no model file at .*give an existing GGUF path"):
        Weights.open(tmp_path / "gone.gguf")
    with pytest.raises(BackendError, match="could not load"):
        Weights.open(tmp_path)  # a folder exists: llama.cpp refuses it, typed too
