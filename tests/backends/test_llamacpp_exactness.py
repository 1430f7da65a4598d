"""Which KV gives the logits a cold decode gives, bit for bit, on the real model (Gemma 3
270M): the rules every reuse path is built on (``MIN_BATCH``, the decode plan, the lanes), and
the layout that breaks them (issue "cache invariance").

- With a KV stream per sequence, a prefix decoded in batches of 8 or more tokens — in this
  sequence or copied from another — followed by a suffix of 8 or more gives exactly the cold
  logits, wherever the cut falls.
- A suffix of 1-7 tokens does not (llama.cpp's small-batch kernels sum in another order), nor
  does a prefix some of whose tokens were decoded one at a time (a generated reply).
- In a unified KV cache the cold logits themselves depend on where the sequence's cells start:
  a start on a multiple of the CPU's vector width in f16 values gives the same sums, another
  start does not (8 with AVX2, 16 with AVX-512: a start at cell 8 keeps the sums on one and
  not on the other, so the cases below use 16 and 256), and the cells a sequence gets depend
  on what the other sequences hold.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from continuum import LlamaConfig, ModelFile
from continuum.backends.base import MIN_BATCH
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.bench.conversation import long_system_prompt
from tests.conftest import model


def _context(mf: ModelFile, unified: bool) -> LlamaCppBackend:
    config = LlamaConfig(n_ctx=2048, n_threads=2, n_seq_max=3, kv_unified=unified)
    return LlamaCppBackend(mf, config)


@pytest.fixture(scope="module")
def streams() -> Iterator[LlamaCppBackend]:
    with _context(model("gemma3-270m"), unified=False) as b:
        yield b


@pytest.fixture(scope="module")
def unified() -> Iterator[LlamaCppBackend]:
    with _context(model("gemma3-270m"), unified=True) as b:
        yield b


@pytest.fixture(scope="module")
def prompt(streams: LlamaCppBackend) -> list[int]:
    return [streams.bos_id, *streams.tokenize(long_system_prompt(1200))][:700]


def last_logits(b: LlamaCppBackend, tokens: list[int], seq: int) -> np.ndarray:
    logits, _ = b.decode(tokens, seq)
    assert logits is not None
    return logits.copy()


def cold(b: LlamaCppBackend, tokens: list[int], seq: int = 1) -> np.ndarray:
    for s in range(3):
        b.clear_seq(s)
    return last_logits(b, tokens, seq)


def copied(b: LlamaCppBackend, tokens: list[int], cut: int) -> np.ndarray:
    """``tokens[:cut]`` decoded in sequence 2 and copied into 1, then the rest decoded in 1."""
    for s in range(3):
        b.clear_seq(s)
    b.decode(tokens[:cut], 2)
    b.copy_seq(2, 1, cut)
    return last_logits(b, tokens[cut:], 1)


@pytest.mark.slow
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_prefix_in_batches_and_a_suffix_of_eight_or_more_give_the_cold_logits(
    streams: LlamaCppBackend, prompt: list[int], data: st.DataObject
) -> None:
    n = data.draw(st.integers(MIN_BATCH * 3, len(prompt)), label="prompt length")
    cut = data.draw(st.integers(MIN_BATCH, n - MIN_BATCH), label="prefix length")
    tokens = prompt[:n]
    expected = cold(streams, tokens)
    assert np.array_equal(copied(streams, tokens, cut), expected)
    streams.clear_seq(1)
    streams.decode(tokens[:cut], 1)  # the same sequence, decoded in two calls
    assert np.array_equal(last_logits(streams, tokens[cut:], 1), expected)


@pytest.mark.parametrize(
    "suffix",
    [1, *(pytest.param(n, marks=pytest.mark.slow) for n in (5, MIN_BATCH - 1))],  # 4 s each
)
def test_a_suffix_under_eight_tokens_parts_from_cold(
    streams: LlamaCppBackend, prompt: list[int], suffix: int
) -> None:
    expected = cold(streams, prompt)
    assert not np.array_equal(copied(streams, prompt, len(prompt) - suffix), expected)


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_a_prefix_with_tokens_decoded_one_at_a_time_parts_from_cold(
    streams: LlamaCppBackend, prompt: list[int]
) -> None:
    expected = cold(streams, prompt)
    streams.clear_seq(1)
    streams.decode(prompt[:600], 1)
    for token in prompt[600:620]:  # as a generated reply is decoded
        streams.decode([token], 1)
    assert not np.array_equal(last_logits(streams, prompt[620:], 1), expected)


@pytest.mark.slow
@pytest.mark.parametrize(("held", "equal"), [(16, True), (256, True), (257, False), (5, False)])
def test_in_a_unified_cache_cold_logits_depend_on_where_the_cells_start(
    unified: LlamaCppBackend, prompt: list[int], held: int, equal: bool
) -> None:
    expected = cold(unified, prompt)
    unified.clear_seq(1)
    unified.decode(prompt[:held], 2)  # another sequence holds the first cells
    got = last_logits(unified, prompt, 1)
    assert np.array_equal(got, expected) is equal


def test_the_backend_counts_the_exact_tokens_of_each_sequence(
    streams: LlamaCppBackend, unified: LlamaCppBackend, prompt: list[int]
) -> None:
    """The ledger the reuse paths read (continuum.backends.exactness), kept by the backend
    itself: prompt batches count, a reply's one-token decodes do not, a cut or a copy keeps
    what it keeps, and nothing counts in a unified cache."""
    cold(streams, prompt[:300])
    assert streams.exact_tokens(1) == 300
    for token in prompt[300:305]:  # as a generated reply is decoded
        streams.decode([token], 1)
    streams.decode(prompt[305:400], 1)
    assert streams.exact_tokens(1) == 300
    streams.copy_seq(1, 2, 350)
    assert streams.exact_tokens(2) == 300
    streams.truncate(200, 1)
    streams.decode(prompt[200:400], 1)
    assert streams.exact_tokens(1) == 400
    cold(unified, prompt[:300])
    assert unified.exact_tokens(1) == 0
