"""``decode_rows``: a draft's tokens decoded in one call with the logits after every one of them
(what verifying a speculative draft needs), on the real model (Gemma 3 270M)."""

from __future__ import annotations

import numpy as np
import pytest

from continuum import ContextOverflow, InvalidRequest, LlamaConfig, ModelFile
from continuum.backends.llamacpp import LlamaCppBackend

CONFIG = LlamaConfig(n_ctx=256, n_threads=2, n_threads_batch=2, n_batch=64)


def test_every_row_is_scored_and_the_last_is_the_same_call_as_decode(gemma: ModelFile) -> None:
    with LlamaCppBackend(gemma, CONFIG) as b:
        head = [b.bos_id, *b.tokenize("The capital of France is")]
        draft = b.tokenize(" Paris, and the capital of Spain is Madrid.")
        b.decode(head)
        rows = b.decode_rows(draft)
        assert rows.shape == (len(draft), b.n_vocab)
        assert b.seq_tokens(0) == head + draft
        b.truncate(len(head))
        last, _ = b.decode(draft)  # one call of the same rows: the same last row
        assert last is not None and np.array_equal(rows[-1], last)
        b.truncate(len(head))
        one = b.decode_rows(draft[:1])  # one row is a plain decoding step
        b.truncate(len(head))
        step, _ = b.decode(draft[:1])
        assert step is not None and np.array_equal(one[0], step)
        # most likely next tokens follow the text: the rows are in order
        assert int(rows[0].argmax()) == int(step.argmax())


def test_a_draft_of_eight_rows_or_more_is_exact_and_fewer_is_not(gemma: ModelFile) -> None:
    """The exactness ledger's rule: rows that reach the batched kernels (8 or more) give the
    KV a cold prefill gives; fewer do not count as exact."""
    with LlamaCppBackend(gemma, CONFIG) as b:
        head = [b.bos_id, *b.tokenize("One two three four five six seven eight nine ten")]
        b.decode(head)
        assert b.exact_tokens(0) == len(head)
        words = b.tokenize(" eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen")
        assert len(words) >= 8
        b.decode_rows(words[:8])
        assert b.exact_tokens(0) == len(head) + 8
        b.decode_rows(words[8:] or words[:2])
        assert b.exact_tokens(0) == len(head) + 8  # a short call is not exact


def test_bad_drafts_are_refused_and_change_nothing(gemma: ModelFile) -> None:
    with LlamaCppBackend(gemma, LlamaConfig(n_ctx=64, n_threads=2, n_batch=32)) as b:
        head = [b.bos_id, *b.tokenize("Hello there.")]
        b.decode(head)
        with pytest.raises(InvalidRequest, match=r"1\.\.32 tokens"):
            b.decode_rows([])
        with pytest.raises(InvalidRequest, match=r"1\.\.32 tokens"):
            b.decode_rows([head[-1]] * 33)
        b.decode([head[-1]] * (b.n_ctx - len(head) - 10))
        full = list(b.seq_tokens(0))
        with pytest.raises(ContextOverflow):
            b.decode_rows([head[-1]] * 11)  # one past the context
        assert b.seq_tokens(0) == full
        got = b.decode_rows([head[-1]] * 10)  # and it still works, to the last cell
        assert got.shape == (10, b.n_vocab) and len(b.seq_tokens(0)) == b.n_ctx
