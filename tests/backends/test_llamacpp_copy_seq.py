"""One sequence's KV copied into another (``LlamaCppBackend.copy_seq``) on the real model
(Gemma 3 270M), with a KV stream per sequence (a worker's lanes, where a new session borrows
what another holds): llama.cpp copies the stream at the next decode. The copy holds exactly
the prefix asked for and continues bit for bit as the source does, and a state save or load
before the next decode sees the copy already made. (In a unified cache the copy shares cells;
the prefix-KV tier's tests cover that layout.)"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from continuum import GenerationParams, LlamaConfig, ModelFile
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.errors import BackendError

TEXT = "A small library for caching the work of language-model agents. " * 12
ASK = " Question: what does it cache? Answer:"
GREEDY = GenerationParams(max_tokens=12)


@pytest.fixture
def llama(gemma: ModelFile) -> Iterator[LlamaCppBackend]:
    config = LlamaConfig(n_ctx=1024, n_threads=2, n_seq_max=3, kv_unified=False)
    with LlamaCppBackend(gemma, config) as b:
        yield b


def _logits(b: LlamaCppBackend, tokens: list[int], seq: int) -> np.ndarray:
    logits, _ = b.decode(tokens, seq)
    assert logits is not None
    return logits.copy()


def test_a_copied_prefix_continues_exactly_as_the_source_decoded_it(
    llama: LlamaCppBackend,
) -> None:
    shared = [llama.bos_id, *llama.tokenize(TEXT)]
    ask = llama.tokenize(ASK)
    llama.decode(shared + llama.tokenize(" Something else entirely."), 0)  # goes on otherwise
    llama.copy_seq(0, 1, len(shared))
    assert llama.seq_tokens(1) == shared
    got = _logits(llama, ask, 1)
    llama.truncate(len(shared), 0)
    expected = _logits(llama, ask, 0)
    assert np.array_equal(got, expected)
    reply = llama.generate(got, GREEDY, seq=1).tokens
    assert reply == llama.generate(expected, GREEDY, seq=0).tokens


def test_a_state_saved_before_the_next_decode_holds_the_copy(llama: LlamaCppBackend) -> None:
    """With a stream per sequence llama.cpp defers the data copy to the next decode; a save
    right after the copy must not read the destination's old cells."""
    shared = [llama.bos_id, *llama.tokenize(TEXT)]
    ask = llama.tokenize(ASK)
    llama.decode(llama.tokenize("Unrelated words that sequence one held before."), 1)
    llama.decode(shared, 0)
    llama.copy_seq(0, 1, len(shared))
    saved = llama.save_state(1)
    assert llama.seq_tokens(1) == shared  # settling the copy left every sequence as it was
    assert llama.seq_tokens(0) == shared
    llama.load_state(saved, shared, 2)
    assert np.array_equal(_logits(llama, ask, 2), _logits(llama, ask, 0))


def test_a_source_reloaded_before_the_next_decode_does_not_change_the_copy(
    llama: LlamaCppBackend,
) -> None:
    shared = [llama.bos_id, *llama.tokenize(TEXT)]
    ask = llama.tokenize(ASK)
    other = [llama.bos_id, *llama.tokenize("A different document about gardening. " * 8)]
    llama.decode(other, 2)
    elsewhere = llama.save_state(2)
    llama.decode(shared, 0)
    llama.copy_seq(0, 1, len(shared))
    llama.load_state(elsewhere, other, 0)  # the source overwritten before any decode
    got = _logits(llama, ask, 1)
    llama.clear_seq(0)
    llama.decode(shared, 0)
    assert np.array_equal(got, _logits(llama, ask, 0))


@pytest.mark.parametrize(("src", "dst", "n"), [(0, 0, 4), (0, 1, 0), (0, 1, 99), (0, 1, -1)])
def test_a_copy_that_cannot_be_made_is_a_typed_error_and_changes_nothing(
    llama: LlamaCppBackend, src: int, dst: int, n: int
) -> None:
    llama.decode([llama.bos_id, *llama.tokenize("Five or six tokens here.")], 0)
    llama.decode([llama.bos_id, *llama.tokenize("Kept.")], 1)
    before = (list(llama.seq_tokens(0)), list(llama.seq_tokens(1)))
    with pytest.raises(BackendError, match="cannot copy"):
        llama.copy_seq(src, dst, n)
    assert (llama.seq_tokens(0), llama.seq_tokens(1)) == before
