"""How a batch step is cut into llama_decode calls (continuum.backends.passes): every item in
exactly one call, small items in calls under 8 tokens, each larger chunk with its own length."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.backends.base import MIN_BATCH
from continuum.backends.passes import FIRST_ROWS, SMALL, chunk, passes


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


@given(
    st.lists(
        st.tuples(st.one_of(st.integers(1, 7), st.integers(8, 200)), st.booleans()), max_size=40
    )
)
def test_prompts_whose_first_token_waits_go_in_calls_of_at_most_first_rows(
    items: list[tuple[int, bool]],
) -> None:
    """Items that end a prompt with a reply to start are cut into calls of at most FIRST_ROWS
    tokens (one prompt at least); the other chunks of their length ride in the last of them;
    small items and the equal-ubatch rule are as without firsts."""
    sizes, firsts = [n for n, _ in items], [f for _, f in items]
    calls = passes(sizes, firsts)
    assert sorted(i for call in calls for i in call) == list(range(len(sizes)))
    plain = passes(sizes)
    assert [c for c in calls if sizes[c[0]] < MIN_BATCH] == [
        c for c in plain if sizes[c[0]] < MIN_BATCH
    ]
    for n in {n for n in sizes if n >= MIN_BATCH}:
        mine = [c for c in calls if sizes[c[0]] == n]
        wait = sum(1 for i, m in enumerate(sizes) if m == n and firsts[i])
        per = max(1, FIRST_ROWS // n)
        assert len(mine) == max(1, -(-wait // per))
        assert all(sum(firsts[i] for i in c) <= per for c in mine)


@pytest.mark.parametrize(
    ("sizes", "firsts", "calls"),
    [
        ([20] * 4, [True] * 4, [[0, 1], [2, 3]]),  # four turns: first tokens two at a time
        ([20, 20, 20], [True, False, True], [[0, 1, 2]]),  # a chunk rides with the last two
        ([16] * 4, [True] * 4, [[0, 1, 2], [3]]),
        ([64, 64], [True, True], [[0], [1]]),  # longer than FIRST_ROWS: one each
        ([64, 64, 64], [False] * 3, [[0, 1, 2]]),  # prefill chunks: one equal ubatch
        ([1, 1, 20, 20], [False, False, True, True], [[0, 1], [2, 3]]),
    ],
)
def test_calls_of_steps_with_first_tokens(
    sizes: list[int], firsts: list[bool], calls: list[list[int]]
) -> None:
    assert passes(sizes, firsts) == calls


@pytest.mark.parametrize(
    ("pending", "share", "room", "n"),
    [
        (100, 64, 64, 64),  # the share
        (70, 64, 100, 70),  # all of it rather than a 6-token tail
        (70, 64, 64, 62),  # the room cannot hold it all: leave 8
        (5, 64, 64, 5),  # a short prompt whole
        (12, 8, 8, 0),  # 8 would leave a 4-token tail, 4 is under 8: nothing this step
    ],
)
def test_a_chunk_never_leaves_a_tail_under_8(pending: int, share: int, room: int, n: int) -> None:
    assert chunk(pending, share, room) == n


@pytest.mark.parametrize("sizes", [[0], [1, 0], [-3]])
def test_an_empty_item_is_refused(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        passes(sizes)
