"""The decode plan, without a model: what a turn keeps and what it decodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from continuum.backends.base import MIN_BATCH
from continuum.stateful.plan import Ahead, common_prefix, plan_decode

tokens = st.lists(st.integers(0, 5), max_size=40)


@given(tokens, tokens)
def test_common_prefix_matches_a_linear_scan(a: list[int], b: list[int]) -> None:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix(a, b) == n


def test_keeps_the_verified_resident_prefix_and_decodes_the_rest() -> None:
    resident = [1, 2, 3, 4, 5, 6]
    full = [1, 2, 3, 4, 9, 9, 9]
    p = plan_decode(resident, full, verified=4)
    assert (p.keep, p.decode_from, p.use_spec) == (4, 4, False)
    assert full[p.decode_from :] == [9, 9, 9]


def test_never_keeps_tokens_beyond_the_verified_segments_without_ahead_state() -> None:
    # the resident tokens equal the prompt past the verified end, but nothing was decoded
    # ahead: they are not trusted (they may be another message's tokens)
    p = plan_decode([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], verified=3)
    assert p.keep == 3


def test_at_least_one_token_is_decoded_for_fresh_logits() -> None:
    full = [1, 2, 3]
    p = plan_decode([1, 2, 3], full, verified=3)
    assert p.keep == 3 and p.decode_from == 2 and p.reused == 2


def test_tokens_fed_ahead_are_kept_where_they_match_and_the_last_batch_is_not_short() -> None:
    verified = 10
    full = list(range(40))
    resident = full[:38]  # fed as the message arrived
    ahead = Ahead(spec_from=verified, floor=verified)
    p = plan_decode(resident, full, verified, ahead)
    assert len(full) - p.decode_from >= MIN_BATCH  # backed off: no 1-7-token last batch
    assert p.keep == len(full) - MIN_BATCH and p.fed_tokens == p.keep - verified


def test_eager_glue_is_counted_used_or_discarded() -> None:
    full = [1, 2, 3, 7, 8, *range(100, 120)]
    glue = (3, 5)  # tokens 7, 8 decoded while idle
    used = plan_decode([1, 2, 3, 7, 8], full, 3, Ahead(glue=glue, spec_from=3, floor=5))
    assert used.eager_used == 2 and used.eager_discarded == 0
    other = [1, 2, 3, 6, *range(100, 120)]  # the message opened differently
    gone = plan_decode([1, 2, 3, 7, 8], other, 3, Ahead(glue=glue, spec_from=3, floor=5))
    assert gone.eager_used == 0 and gone.eager_discarded == 2 and gone.keep == 3


def test_a_speculative_finish_that_decoded_this_prompt_is_used_as_is() -> None:
    full = list(range(30))
    p = plan_decode(full, full, 12, Ahead(spec_from=12, floor=12, spec_ready=True))
    assert p.use_spec and p.keep == p.decode_from == 30


def test_the_policy_threshold_drops_a_short_reuse() -> None:
    resident, full = [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]
    assert plan_decode(resident, full, 4, min_reuse=4).keep == 4
    p = plan_decode(resident, full, 4, min_reuse=5)
    assert p.keep == 0 and p.decode_from == 0  # everything is decoded


@given(st.integers(0, 120), st.integers(0, 120), st.integers(1, 120), st.integers(0, 120))
def test_an_exact_plan_keeps_only_exact_tokens_and_decodes_a_whole_batch(
    resident_len: int, verified: int, extra: int, exact: int
) -> None:
    full = list(range(verified + extra))
    resident = full[: min(resident_len, len(full))]
    p = plan_decode(resident, full, min(verified, len(full)), Ahead(exact=exact))
    assert p.keep <= exact and p.decode_from == p.keep
    assert p.keep == 0 or len(full) - p.keep >= MIN_BATCH


def test_an_exact_plan_decodes_the_last_reply_again() -> None:
    prompt, reply, message = list(range(60)), list(range(60, 80)), list(range(80, 85))
    resident = prompt + reply  # the reply was decoded a token at a time: not exact
    full = prompt + reply + message
    p = plan_decode(resident, full, len(prompt) + len(reply), Ahead(exact=len(prompt)))
    assert p.keep == len(prompt) and full[p.decode_from :] == reply + message
    assert plan_decode(resident, full, 80).keep == 80  # without exact: the reply is kept


def test_an_exact_plan_ignores_a_speculation_past_the_exact_tokens() -> None:
    full = list(range(30))
    ahead = Ahead(spec_from=12, floor=12, spec_ready=True, exact=12)
    p = plan_decode(full, full, 12, ahead)
    assert not p.use_spec and p.keep == 12
    exact = Ahead(spec_from=12, floor=12, spec_ready=True, exact=30)
    assert plan_decode(full, full, 12, exact).use_spec
