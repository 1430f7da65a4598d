"""How a batch step is cut into llama_decode calls (continuum.backends.passes): every item in
exactly one call, small items in calls under 8 tokens, each larger chunk with its own length."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.backends.base import MIN_BATCH
from continuum.backends.passes import SMALL, passes


@given(st.lists(st.one_of(st.integers(1, 7), st.integers(8, 200)), max_size=40))
def test_every_item_once_small_calls_under_8_and_large_chunks_by_length(sizes: list[int]) -> None:
    calls = passes(sizes)
    assert sorted(i for call in calls for i in call) == list(range(len(sizes)))
    assert all(call for call in calls)
    for call in calls:
        lengths = {sizes[i] for i in call}
        if min(lengths) < MIN_BATCH:  # small items only, under 8 tokens in all
            assert max(lengths) < MIN_BATCH and sum(sizes[i] for i in call) <= SMALL
        else:  # one equal ubatch: every item the same length
            assert len(lengths) == 1
    small = sum(n for n in sizes if n < MIN_BATCH)
    large = {n for n in sizes if n >= MIN_BATCH}
    generated = all(n == 1 for n in sizes if n < MIN_BATCH)
    if generated:  # one-token items pack with no room left over: the fewest calls
        assert len(calls) == -(-small // SMALL) + len(large)


@pytest.mark.parametrize(
    ("sizes", "calls"),
    [
        ([1, 1, 1, 1], [[0, 1, 2, 3]]),  # four generated tokens: one call, as before
        ([1] * 8, [[0, 2, 4, 6], [1, 3, 5, 7]]),  # eight: two even calls, not 7 + 1
        ([1, 1, 1, 20], [[0, 1, 2], [3]]),  # a prompt beside generated tokens: its own call
        ([20, 25, 20], [[0, 2], [1]]),  # chunks of one length share a call
        ([1, 1, 5], [[0, 1, 2]]),  # a short prompt rides with generated tokens
        ([512], [[0]]),
        ([], []),
    ],
)
def test_calls_of_typical_steps(sizes: list[int], calls: list[list[int]]) -> None:
    assert passes(sizes) == calls


@pytest.mark.parametrize("sizes", [[0], [1, 0], [-3]])
def test_an_empty_item_is_refused(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        passes(sizes)
