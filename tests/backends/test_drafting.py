"""Prompt-lookup drafts and the adaptive draft length (no model: token lists)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum.backends.drafting import (
    CLEAR_STREAK,
    MARGIN,
    MAX_DRAFT,
    DraftLength,
    DraftSources,
    DraftStats,
    PromptLookup,
    ReplyDraft,
    ReplyIndex,
    VerifyCost,
    check_draft,
    clear_choice,
    drafted_reply,
)
from continuum.backends.sampling import distribution, sample, speculative_choice
from continuum.errors import InvalidRequest
from continuum.params import GenerationParams


def naive_draft(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The definition, by brute force: the longest n-gram ending the tokens that occurred
    before; the tokens after its latest earlier occurrence."""
    for n in range(hi, lo - 1, -1):
        if len(tokens) < n:
            continue
        gram = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # ends before the sequence's own
            if tokens[end - n : end] == gram:
                return tokens[end : end + k]
    return []


def test_a_quoted_run_is_drafted_from_where_it_was_seen() -> None:
    look = PromptLookup()
    file = [10, 11, 12, 13, 14, 15, 16, 17]
    look.extend([1, 2, *file, 3, 4])
    look.extend([11, 12])  # the reply starts quoting the file
    assert look.draft(4) == [13, 14, 15, 16]
    assert look.draft(100) == [13, 14, 15, 16, 17, 3, 4, 11, 12]
    look.extend([99])  # something never seen: no draft
    assert look.draft(4) == []
    assert look.draft(0) == []


def test_the_longest_gram_and_the_latest_occurrence_win() -> None:
    look = PromptLookup(min_ngram=1, max_ngram=3)
    look.extend([5, 6, 7, 1, 6, 7, 2, 9, 6, 7])
    assert look.draft(1) == [2]  # (6, 7) last seen before 2; (9, 6, 7) never
    look.reset([5, 6, 7, 1, 9, 6, 7, 2, 9, 6, 7])
    assert look.draft(1) == [2]  # (9, 6, 7) at its latest occurrence
    look.reset([4, 4])
    assert look.draft(3) == [4]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=60),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(0, 2),
)
def test_drafts_equal_the_brute_force_definition(
    tokens: list[int], k: int, lo: int, extra: int
) -> None:
    hi = lo + extra
    look = PromptLookup(min_ngram=lo, max_ngram=hi)
    for i, tok in enumerate(tokens):  # grown one token at a time, as a reply is
        look.extend([tok])
        assert look.draft(k) == naive_draft(tokens[: i + 1], k, lo, hi)
    again = PromptLookup(min_ngram=lo, max_ngram=hi)
    again.reset(tokens)  # or all at once
    assert again.draft(k) == naive_draft(tokens, k, lo, hi)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=30), min_size=1, max_size=6), st.data())
def test_a_kept_index_synced_to_a_sequence_is_the_index_a_rebuild_makes(
    grows: list[list[int]], data: st.DataObject
) -> None:
    """A sequence's index kept across its replies (the batch scheduler's, per sequence): each
    sync extends it when the sequence only grew, and rebuilds it when the sequence was cut (a
    stop string, an edited history) or holds another session now. Either way its tables are
    those of an index built from the tokens at once, and so are its drafts."""
    kept, seq = PromptLookup(), list[int]()
    for grow in grows:
        cut = data.draw(st.integers(0, len(seq)))  # 0..len: len keeps everything
        seq = seq[:cut] + grow
        kept.sync(seq)
        fresh = PromptLookup()
        fresh.reset(seq)
        assert kept.tokens == seq and kept._last == fresh._last
        assert kept.draft(4) == fresh.draft(4) == naive_draft(seq, 4, 2, 12)


def test_syncing_a_grown_sequence_extends_and_a_cut_one_rebuilds() -> None:
    look = PromptLookup()
    look.sync([1, 2, 3, 1, 2])
    built = look.rebuilds
    look.sync([1, 2, 3, 1, 2, 3, 1])  # grew: the same tables, extended
    assert look.rebuilds == built and look.draft(2) == [2, 3]
    look.sync([1, 2, 3, 1])  # cut: rebuilt from the tokens now
    assert look.rebuilds == built + 1
    assert look.tokens == [1, 2, 3, 1] and look.draft(3) == []


def timed(per_row: float, step: float = 0.04) -> VerifyCost:
    """A cost table as if calls of 1, 2, 4, 8 and 16 rows had been timed: each row past the
    first adds ``per_row`` steps."""
    cost = VerifyCost()
    for rows in (1, 2, 4, 8, 16):
        cost.observe(rows, step * (1 + per_row * (rows - 1)))
    return cost


def test_the_verify_cost_is_timed_per_length_and_read_off_the_nearest_before() -> None:
    cost = VerifyCost()
    assert cost.steps(1) == 1.0
    assert cost.steps(5) == pytest.approx(1 + VerifyCost.PRIOR_ROW * 4)  # nothing timed yet
    cost.observe(1, 0.040)
    cost.observe(4, 0.064)  # 1.6 steps: 0.2 a row past the first
    assert cost.steps(4) == pytest.approx(1.6)
    assert cost.steps(9) == pytest.approx(2.6)  # along the nearest timed length's line
    cost.observe(4, 0.104)  # a moving average, not the last call alone
    assert 1.6 < cost.steps(4) < 2.6
    cost.observe(0, 1.0)
    cost.observe(3, -1.0)  # nothing to learn from
    assert cost.steps(3) == pytest.approx(1 + (cost.steps(4) - 1) * 2 / 3)


def test_an_untimed_length_lies_between_timed_ones_and_past_the_longest_is_guessed_cheap() -> None:
    """A call's cost grows slower than its rows, so past the longest timed length the table
    guesses at most the prior's cost a row, not the line through a short call's dear one."""
    cost = VerifyCost()
    cost.observe(1, 0.040)
    cost.observe(2, 0.076)  # 1.9 steps: 0.9 a row past the first
    assert cost.steps(17) == pytest.approx(1.9 + VerifyCost.PRIOR_ROW * 15)
    cost.observe(17, 0.400)  # timed: 10 steps
    assert cost.steps(17) == pytest.approx(10.0)
    assert cost.steps(7) == pytest.approx(1.9 + (10.0 - 1.9) * 5 / 15)  # between 2 and 17
    assert cost.steps(21) == pytest.approx(10.0 + VerifyCost.PRIOR_ROW * 4)
    cheap = VerifyCost()
    cheap.observe(1, 0.040)
    cheap.observe(17, 0.200)  # 5 steps: 0.25 a row, under the prior's 0.45
    assert cheap.steps(21) == pytest.approx(5.0 + 0.25 * 4)


def test_a_reply_that_only_timed_one_token_drafts_tries_a_longer_one() -> None:
    """Only calls of 2 rows timed, at 1.9 steps, and the last drafted tokens kept: a longer
    draft pays by the guess, so it is tried (and then timed), not one token a call forever."""
    cost = VerifyCost()
    cost.observe(1, 0.040)
    cost.observe(2, 0.076)
    d = DraftLength(16, cost=cost)
    for _ in range(3):
        d.accepted(1, 0)
        for _ in range(4):
            d.accepted(1, 1)
    assert 0.95 < d.p < 0.98
    assert d.next() >= 8  # (priced along the 2-row call's line: 2)


def test_the_draft_length_follows_the_acceptance_and_the_cost_of_a_call() -> None:
    cheap, dear = timed(0.2), timed(0.9)
    d = DraftLength(16, cost=cheap)
    first = d.next()
    assert 1 <= first <= 4  # from the prior odds
    for _ in range(12):  # every draft kept whole: longer drafts pay
        d.accepted(d.next(), d.next())
    assert d.next() >= 8 and d.p > 0.9
    assert DraftLength(4, cost=cheap).next() <= 4  # never past max_draft
    # two of every three drafted tokens kept: pays where a row costs 0.2 steps, not at 0.9
    some, dear_some = DraftLength(16, cost=cheap), DraftLength(16, cost=dear)
    for length in (some, dear_some):
        for _ in range(12):
            length.accepted(4, 2)
        assert length.p == pytest.approx(2 / 3, abs=0.01)
    assert some.next() >= 1 and dear_some.next() == 0
    k, calls = d.next(), 0
    while k:  # nothing accepted: drafting turns itself off within a few calls
        d.accepted(k, 0)
        k, calls = d.next(), calls + 1
    assert calls <= 8
    assert [d.next() for _ in range(14)] == [0] * 14  # 15 plain steps in all
    assert d.next() >= 1  # then it tries again, from the prior odds
    assert DraftLength(0).next() == 0


def test_a_draft_weighs_a_call_of_its_own_against_a_token_riding_with_other_replies() -> None:
    """In a batch step a plain token rides in the other replies' call for about one row's
    cost, and a draft takes a call of its own: two of three drafted tokens kept pays alone
    where a row costs 0.2 steps, not beside seven other replies."""
    d = DraftLength(16, cost=timed(0.2))
    for _ in range(12):
        d.accepted(4, 2)
    assert d.next(others=0) >= 1
    assert d.best(others=7)[0] == 0
    assert d.best(others=0) == d.best()  # alone: the rule as it was
    for _ in range(12):  # every draft kept whole: pays beside others too
        d.accepted(16, 16)
    assert d.next(others=3) >= 8


@pytest.mark.parametrize("bad", [-1, MAX_DRAFT + 1, 2.5, True, "4"])
def test_a_draft_length_outside_0_to_32_is_refused_naming_the_setting(bad: object) -> None:
    with pytest.raises(InvalidRequest, match=r"max_draft must be an integer in 0\.\.32"):
        check_draft("max_draft", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="max_draft"):
        DraftLength(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="n-gram"):
        PromptLookup(min_ngram=3, max_ngram=2)


def test_a_choice_is_clear_only_with_a_lead_of_the_margin() -> None:
    row = np.zeros(10, dtype=np.float32)
    row[3], row[7] = 5.0, 5.0 - MARGIN
    assert clear_choice(row) == 3
    row[7] = 5.0 - MARGIN + 0.01
    assert clear_choice(row) is None  # a close call: plain decoding's logits decide
    row[7] = 6.0
    assert clear_choice(row) is None
    row[3] = 8.5
    assert clear_choice(row) == 3


class Scripted:
    """A fake context for :func:`drafted_reply`'s orchestration (no model): after the prompt,
    the model's choice at reply position i is ``reply[i]``, led by ``margins[i]``; a call of
    several rows gives the same logits as steps (what it decides is when to call)."""

    n_ctx, n_batch, vocab = 4096, 512, 64

    def __init__(self, prompt: list[int], reply: list[int], margins: list[float]) -> None:
        self.prompt, self.reply, self.margins = prompt, reply, margins
        self.tokens = list(prompt)
        self.calls: list[tuple[int, int]] = []  # (reply position of the first row, rows)

    def row(self, held: int) -> np.ndarray:
        i = held - len(self.prompt)
        out = np.zeros(self.vocab, dtype=np.float32)
        if i < len(self.reply):  # past the reply's end (a draft verified beyond it): token 0
            out[self.reply[i]] = self.margins[i]
        return out

    def seq_tokens(self, seq: int) -> list[int]:
        return self.tokens

    def decode(self, tokens: list[int] | tuple[int, ...], seq: int = 0, **_: object) -> tuple:
        return self.decode_rows(tokens)[-1], 0.0

    def decode_rows(self, tokens: Sequence[int], seq: int = 0) -> np.ndarray:
        self.calls.append((len(self.tokens) - len(self.prompt), len(tokens)))
        self.tokens += tokens
        return np.stack(
            [self.row(len(self.tokens) - len(tokens) + j + 1) for j in range(len(tokens))]
        )

    def truncate(self, n: int, seq: int = 0) -> None:
        del self.tokens[n:]


class Choices:
    """Stands in for :class:`Decoding`: takes each logits row's best token, ``n`` in all."""

    def __init__(self, first: int, n: int) -> None:
        self.got, self.n, self.resident, self.rng = [first], n, None, None
        self.gen = self.got  # the reply's tokens so far, as Decoding's

    def step(self, logits: np.ndarray) -> int | None:
        if len(self.got) == self.n:
            return None
        self.got.append(int(logits.argmax()))
        return self.got[-1]


class Untimed(VerifyCost):
    """The cost table of :func:`timed`, kept as it is (the fake's calls take no time)."""

    def __init__(self, per_row: float) -> None:
        super().__init__()
        self._seconds = dict(timed(per_row)._seconds)

    def observe(self, rows: int, seconds: float) -> None:
        pass


def _drafted(margins: list[float]) -> tuple[Scripted, Choices, DraftStats]:
    reply = [1 + i % 40 for i in range(len(margins))]  # all quoted from the prompt below
    b = Scripted([50, *reply, 51], reply, margins)
    d = Choices(reply[0], len(reply) - 1)
    stats = drafted_reply(b, d, reply[0], 0, DraftLength(8, cost=Untimed(0.2)))  # type: ignore[arg-type]
    assert d.got == reply[:-1]  # what plain decoding chooses
    return b, d, stats


def test_a_run_of_drafts_starts_only_after_a_streak_of_clear_choices() -> None:
    clear = 2 * MARGIN
    b, _, stats = _drafted([clear] * 60)
    first = next(at for at, rows in b.calls if rows > 1)
    assert first == CLEAR_STREAK  # the choices at 1..16 were clear: the 17th call drafts
    assert stats.accepted > 0 and stats.redone == 0
    close = [clear] * 60
    close[10] = close[20] = MARGIN / 2  # a close call resets the streak
    b, _, stats = _drafted(close)
    drafts = [at for at, rows in b.calls if rows > 1]
    assert drafts and drafts[0] == 20 + CLEAR_STREAK  # not 10 + 16: the choice at 20 was close
    assert stats.redone == 0  # no run was open at either close call


def test_a_close_call_inside_a_run_decodes_it_again_and_waits_for_a_new_streak() -> None:
    clear = 2 * MARGIN
    margins = [clear] * 80
    margins[40] = MARGIN / 2
    b, _, stats = _drafted(margins)
    assert stats.redone > 0  # the run opened at 16 was decoded again at 40
    later = [at for at, rows in b.calls if rows > 1 and at >= 40]
    assert later and later[0] >= 40 + CLEAR_STREAK


@pytest.mark.parametrize("draft", [0, 1, 3, 4])
def test_a_speculative_choice_is_distributed_as_the_row(draft: int) -> None:
    """Kept with p[draft], else drawn from the rest: every token's frequency is p's (within
    five standard errors over 40,000 draws); a rule that kept every draft, or drew the rest
    without taking the draft out, would not be."""
    p = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    rng = np.random.default_rng(draft)
    n = 40_000
    counts = np.bincount([speculative_choice(p, draft, rng) for _ in range(n)], minlength=p.size)
    freq = counts / n
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12), (draft, freq)


def test_a_sure_draft_is_always_kept_and_an_impossible_one_never() -> None:
    rng = np.random.default_rng(0)
    assert {speculative_choice(np.array([0.0, 1.0, 0.0]), 1, rng) for _ in range(200)} == {1}
    drawn = {speculative_choice(np.array([0.6, 0.0, 0.4]), 1, rng) for _ in range(200)}
    assert drawn == {0, 2}


def test_sample_draws_from_the_distribution_with_the_same_random_stream() -> None:
    """``sample`` is one draw from ``distribution`` (seeded replies keep their tokens)."""
    logits = np.random.default_rng(1).normal(size=200).astype(np.float32)
    params = GenerationParams(max_tokens=1, temperature=0.7, top_k=40, top_p=0.9)
    p = distribution(logits, params)
    assert p.sum() == pytest.approx(1.0) and np.count_nonzero(p) <= 40
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert [sample(logits, params, a) for _ in range(50)] == [
        int(b.choice(p.size, p=p)) for _ in range(50)
    ]


def test_earlier_replies_are_drafted_after_another_sequences_tokens() -> None:
    index = ReplyIndex()
    index.add([5, 6, 7, 8, 9, 10])
    index.add([1, 2, 3, 4, 11])
    assert index.follow([40, 5, 6, 7, 8], 8) == [9, 10]  # up to the end of that reply
    assert index.follow([1, 2, 3, 4], 1) == [11]
    assert index.follow([8, 9, 10, 1], 4) == []  # no n-gram runs from one reply into the next
    assert index.follow([6, 7, 8], 4) == []  # a match under 4 tokens is not followed
    assert index.follow([5, 6, 7, 8], 0) == []


def test_the_reply_index_keeps_the_latest_replies_within_its_size() -> None:
    index = ReplyIndex(max_tokens=60)
    for i in range(30):
        index.add([1000 + i, 2000 + i, 3000 + i, 4000 + i, 5000 + i])
    assert len(index.look.tokens) <= 2 * 60 + 6  # rebuilt once over twice its size
    assert index.follow([1029, 2029, 3029, 4029], 1) == [5029]  # the latest stays
    assert index.follow([1000, 2000, 3000, 4000], 1) == []  # the oldest went
    with pytest.raises(InvalidRequest, match="max_tokens"):
        ReplyIndex(max_tokens=0)


def test_the_sources_keep_each_sequences_index_and_the_latest_tenants_replies() -> None:
    sources = DraftSources(tenants=2)
    assert sources.lookup(3) is sources.lookup(3) is not sources.lookup(4)
    a = sources.replies("a")
    a.add([1, 2, 3, 4, 5])
    sources.replies("b")
    assert sources.replies("a") is a  # served again: now the most recent
    sources.replies("c")  # a third tenant: b, served longest ago, goes
    assert sources.replies("a") is a and sources.replies("a").follow([1, 2, 3, 4], 1) == [5]
    assert set(sources._earlier) == {"a", "c"}
    assert sources.replies("") is None  # a caller that names no tenant shares with nobody


def test_a_sequences_draft_length_carries_into_its_next_reply_until_it_starts_anew() -> None:
    """The length adapts per session: the acceptance a reply learnt is where the sequence's
    next reply starts; a sequence cut or taken by another session starts from a fresh one."""
    sources = DraftSources()
    cost = Untimed(0.2)
    first = sources.length(0, DraftLength(8, cost=cost), anew=False)
    for _ in range(6):
        first.accepted(8, 8)  # every drafted token kept
    learnt = first.p
    assert learnt > DraftLength(8, cost=cost).p
    again = sources.length(0, DraftLength(8, cost=cost), anew=False)
    assert again is first and again.p == learnt  # its next reply
    assert sources.length(1, DraftLength(8, cost=cost), anew=False) is not first  # another seq
    fresh = DraftLength(8, cost=cost)
    assert sources.length(0, fresh, anew=True) is fresh  # cut, or another session's now
    other = DraftLength(8, cost=Untimed(0.5))
    assert sources.length(0, other, anew=False) is other  # another cost table: not carried


def test_a_drafted_reply_starts_from_what_the_sequences_last_reply_learnt() -> None:
    reply = list(range(1, 61))
    margins = [2 * MARGIN] * len(reply)
    sources, lengths, cost = DraftSources(), [], Untimed(0.2)  # the context's one cost table
    held = [*reply, 50]  # the prompt holds the reply: all of it quoted
    for _ in range(2):
        b = Scripted(held, reply, margins)  # the second turn: what the first left, and more
        d = Choices(reply[0], len(reply) - 1)
        length = DraftLength(8, cost=cost)
        draft = ReplyDraft(b, d, 0, length, DraftStats(), sources)  # type: ignore[arg-type]
        lengths.append((draft.length, draft.length.p))
        tok: int | None = reply[0]
        while tok is not None:
            toks = draft.item(tok)
            tok = draft.advance(b.decode_rows(toks, 0))
        held = [*b.tokens, 50]
    (first, p0), (second, p1) = lengths
    assert second is first and p1 > p0  # the second reply began where the first left off


def test_a_reply_with_nothing_to_quote_drafts_from_earlier_replies() -> None:
    """The prompt holds nothing of the reply; an earlier reply of the tenant was the same:
    after the streak, drafts come from it and are kept, and the reply is plain decoding's."""
    reply = list(range(1, 61))  # no token repeats: the sequence's own lookup finds nothing
    margins = [2 * MARGIN] * len(reply)
    sources = DraftSources()
    runs = (("", False), ("", False), ("a", False), ("a", True), ("b", False))
    for tenant, kept in runs:  # "": no tenant named; b: another tenant's
        b = Scripted([50, 51], reply, margins)
        d = Choices(reply[0], len(reply) - 1)
        length = DraftLength(8, cost=Untimed(0.2))
        stats = drafted_reply(b, d, reply[0], 0, length, sources, tenant)  # type: ignore[arg-type]
        assert d.got == reply[:-1]
        assert (stats.accepted > 0) is kept  # the second drafts from the first, which it joined
