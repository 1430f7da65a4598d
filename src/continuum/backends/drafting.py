"""Drafts from a sequence's own tokens, and how long a draft to ask for (issue 41).

A reply that quotes its context (a file's lines in an edit, ids and paths in tool arguments,
JSON it was given) repeats token runs the sequence already holds. :class:`PromptLookup` finds the
longest n-gram that ends the sequence and occurred before, and proposes the tokens that followed
its latest earlier occurrence: prompt lookup decoding (transformers'
``prompt_lookup_num_tokens``, llama.cpp's ``--spec-type ngram-*``), with an index kept as the
sequence grows, so a draft costs a few dictionary lookups however long the context is. The
n-grams run from 2 to 12 tokens (llama-server's ``ngram-simple`` lookup size): where the reply
re-emits a document of repeated structure, a short n-gram's latest occurrence is often a sibling
just written, a longer one the right place in the original. On ``bench speculative``'s JSON
re-emit, up to 4 tokens gave 57 verify calls and 212 drafted tokens kept, up to 6 28 and 242, up
to 12 24 and 246. Replayed over ten recorded replies with the streak rule below
(docs/records/2026-12-07-draft-streak.py), 12 kept 94% of the JSON drafts against 6's 70%
(3.19x plain against 2.53x with the Xeon's call costs, 2.04x against 1.64x with the EPYC's) and
slowed one other reply (a log question, 1.15x -> 1.09x on the Xeon's costs); 32 kept every one,
but the index then holds 31 n-grams a token.

:class:`DraftLength` chooses the draft length per call from two things learned as the replies
go: what a call of k rows costs on this context, in one-row steps (:class:`VerifyCost`, timed
from the calls themselves, a length not yet timed guessed from those that were; ``continuum
bench draft-cost`` measures the same: on 2 threads of an AVX2 CPU 1.8-1.9 steps at k = 2 and
7-8.5 at k = 16, on an AVX-512 one 1.2 and 3.9), and how
likely the next drafted token is to be kept (each call's kept run is a geometric trial). It
asks for the length with the most tokens expected per step's worth of time, and for none while
no length beats a plain step, trying again after ``retry_after`` plain steps.

A call of several rows leaves KV that differs from plain steps' in the last bits, so a close
call after one (:func:`clear_choice`) decodes every token since again one a step: a run of
drafts that ends in a close call costs its calls and saves nothing. :class:`ReplyDraft`
starts a run only after :data:`CLEAR_STREAK` clear choices in a row, where the reply is
copying rather than choosing. Replayed over ten recorded replies of the default model (bench
speculative's four and six more), this took the worst reply from 0.63x plain to 0.94x and
kept the copying ones' gain (tool arguments 1.65x, JSON 2.5-2.7x, with AVX-512's call costs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from continuum.backends.base import Logits
from continuum.backends.decoding import Decoding
from continuum.errors import InvalidRequest

MAX_DRAFT = 32
# a draft token is kept only when the model prefers it by this many logits: the logits of a
# call of several rows differ from a one-row step's by up to 0.75 (Qwen2.5-Coder 0.5B/1.5B)
# and 0.92 (Gemma 3 270M) as continuum bench draft-cost measured them, so a lead of twice
# that is the same choice either way
MARGIN = 2.0
# a run of drafts starts only after this many clear choices in a row (see the module docstring)
CLEAR_STREAK = 16
# ends each reply in a ReplyIndex: no token id, so no n-gram with it matches a sequence's
BOUNDARY = -1
# the shortest n-gram a ReplyIndex follows: a reply drafts from another conversation's only
# where their last few tokens agree (two tokens in common are common between unrelated texts,
# and a rejected draft costs a verify call)
REPLY_NGRAM = 4
# tenants whose earlier replies a context keeps to draft from (the most recently served)
REPLY_TENANTS = 8


def check_draft(name: str, value: int) -> int:
    """A draft length setting: an integer in 0..32 (0: no drafting)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DRAFT:
        raise InvalidRequest(f"{name} must be an integer in 0..{MAX_DRAFT}, got {value!r}")
    return value


class PromptLookup:
    """Drafts for one sequence from its own tokens (see the module docstring).

    ``extend`` the tokens as they are decoded (or ``reset`` after a truncation); ``draft(k)``
    proposes up to ``k`` tokens to follow them. Invariant: ``_last[n][gram]`` is the end of the
    latest occurrence of each n-gram of the tokens, for every n in ``min_ngram..max_ngram``,
    excluding the one that ends the sequence."""

    def __init__(self, *, min_ngram: int = 2, max_ngram: int = 12) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidRequest(
                f"n-gram sizes must be 1 <= min <= max, got {min_ngram}..{max_ngram}"
            )
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self._last: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }
        self._pending: dict[int, tuple[tuple[int, ...], int]] = {}  # n -> the gram ending it
        self.rebuilds = 0  # resets: the index built again from the start

    def reset(self, tokens: Sequence[int]) -> None:
        """Start over from ``tokens`` (after the sequence was cut)."""
        self.rebuilds += 1
        self.tokens = []
        for table in self._last.values():
            table.clear()
        self._pending.clear()
        self.extend(tokens)

    def sync(self, tokens: Sequence[int]) -> bool:
        """Index exactly ``tokens``, a sequence's tokens now: extended when this index holds
        a prefix of them (the sequence grew since: its next prompt), else rebuilt (it was cut
        or is another's). Extending gives the tables a rebuild would. True if rebuilt."""
        n = len(self.tokens)
        if n <= len(tokens) and list(tokens[:n]) == self.tokens:
            self.extend(tokens[n:])
            return False
        self.reset(tokens)
        return True

    def extend(self, tokens: Sequence[int]) -> None:
        for tok in tokens:
            self.tokens.append(tok)
            end = len(self.tokens)
            for n, table in self._last.items():
                if n in self._pending:  # the gram that ended the sequence is no longer last
                    gram, at = self._pending.pop(n)
                    table[gram] = at
                if end >= n:
                    self._pending[n] = (tuple(self.tokens[end - n :]), end)

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        n-gram ending the sequence; none when no n-gram of it occurred before."""
        return self.follow(self.tokens, k)

    def follow(self, context: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` of this index's tokens that followed the latest occurrence of the
        longest n-gram ending ``context`` (another sequence's tokens, or its own), up to a
        :data:`BOUNDARY`; none when no n-gram of it occurred."""
        if k <= 0:
            return []
        toks = self.tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) < n:
                continue
            at = self._last[n].get(tuple(context[-n:]))
            if at is not None:
                got = toks[at : at + k]
                return got[: got.index(BOUNDARY)] if BOUNDARY in got else got
        return []


class ReplyIndex:
    """Drafts from a tenant's earlier replies (SuffixDecoding's source, with prompt lookup's
    index): agents of one tenant repeat their own outputs across conversations (a tool call's
    shape, a file's boilerplate, an answer asked again in other words), which no conversation's
    own tokens hold. :meth:`add` each finished reply; :meth:`follow` drafts after a sequence's
    tokens when its own lookup finds nothing. Replies are kept whole, the latest up to
    ``max_tokens`` in all (older ones leave in a rebuild, once the index holds twice that)."""

    def __init__(self, max_tokens: int = 4096) -> None:
        if max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.look = PromptLookup(min_ngram=REPLY_NGRAM)
        self._replies: list[list[int]] = []

    def add(self, reply: Sequence[int]) -> None:
        if not reply:
            return
        self._replies.append(list(reply))
        self.look.extend([*reply, BOUNDARY])  # no n-gram runs from one reply into the next
        if len(self.look.tokens) > 2 * self.max_tokens:
            kept: list[list[int]] = []
            held = 0
            for r in reversed(self._replies):
                if held + len(r) + 1 > self.max_tokens and kept:
                    break
                kept.append(r)
                held += len(r) + 1
            self._replies = kept[::-1]
            self.look.reset([t for r in self._replies for t in (*r, BOUNDARY)])

    def follow(self, context: Sequence[int], k: int) -> list[int]:
        return self.look.follow(context, k)


class DraftSources:
    """Where one context's replies draft from: each sequence's own tokens, indexed once and
    kept across its replies (:meth:`PromptLookup.sync` extends the index by what the sequence
    decoded since; built anew over 8k tokens it takes ~45 ms here, kept ~0.3 ms, and it holds
    ~10 MB at 8k tokens) with the draft length it learnt (a session's acceptance carries into
    its next reply), and each tenant's earlier replies (a :class:`ReplyIndex` for each of the
    ``tenants`` most recently served). A batch scheduler keeps one for its replies, a backend
    one for the replies it decodes alone."""

    def __init__(self, tenants: int = REPLY_TENANTS) -> None:
        self.tenants = tenants
        self._looks: dict[int, PromptLookup] = {}  # seq -> the index of its tokens
        self._lengths: dict[int, DraftLength] = {}  # seq -> its draft length, learnt so far
        self._earlier: dict[str, ReplyIndex] = {}  # tenant -> its earlier replies (LRU order)

    def lookup(self, seq: int) -> PromptLookup:
        """Sequence ``seq``'s index (brought up to date by the :class:`ReplyDraft` using it)."""
        return self._looks.setdefault(seq, PromptLookup())

    def length(self, seq: int, fresh: DraftLength, *, anew: bool) -> DraftLength:
        """Sequence ``seq``'s draft length, kept across its replies: a session's acceptance
        carries into its next reply. ``fresh`` replaces it on first use, when the sequence
        starts ``anew`` (cut, or another session's: its index was rebuilt) or when ``fresh``
        is of another limit or cost table."""
        kept = self._lengths.get(seq)
        if anew or kept is None or (kept.max_draft, kept.cost) != (fresh.max_draft, fresh.cost):
            self._lengths[seq] = kept = fresh
        return kept

    def replies(self, tenant: str) -> ReplyIndex | None:
        """``tenant``'s earlier replies, now its most recently served; None for no tenant
        (``""``: a caller that names none shares nothing with anyone)."""
        if not tenant:
            return None
        index = self._earlier.pop(tenant, None) or ReplyIndex()
        self._earlier[tenant] = index  # the most recent last
        while len(self._earlier) > self.tenants:
            del self._earlier[next(iter(self._earlier))]
        return index

    def ended(self, tenant: str, reply: Sequence[int]) -> None:
        """A reply of ``tenant`` (none named: ``""``) is over: its later replies draft from it."""
        earlier = self.replies(tenant)
        if earlier is not None:
            earlier.add(reply)


class VerifyCost:
    """What a call of k rows costs on one context, in one-row steps: a moving average of each
    length's timed calls over the one-row steps'. A length not timed yet is read off the line
    between the timed lengths either side of it ((1, 1) below the shortest), or, past the
    longest, off that one's cost plus, a row, the smaller of :data:`PRIOR_ROW` (what each row
    past the first added on 2 threads of an AVX2 CPU, ``bench draft-cost``) and the table's own
    average; before any is timed, off the prior alone.

    Past the longest timed length the guess is optimistic on purpose: a call's cost grows
    slower than its rows (a call has a fixed part; here 2 rows cost ~1.9 steps and 17 rows
    ~10), so the line through a short call's cost would price every longer draft dear, and a
    reply that only ever drafted one token would never time a longer one (``bench
    speculative``'s JSON reply drafted 1 token a call for its whole first run that way). A
    longer draft is tried once its guess pays, and its timing then replaces the guess."""

    PRIOR_ROW = 0.45

    def __init__(self, *, weight: float = 0.2) -> None:
        self.weight = weight
        self._seconds: dict[int, float] = {}  # rows -> moving average of a call's time

    def observe(self, rows: int, seconds: float) -> None:
        if rows < 1 or seconds <= 0:
            return
        was = self._seconds.get(rows)
        self._seconds[rows] = seconds if was is None else was + self.weight * (seconds - was)

    def steps(self, rows: int) -> float:
        """A call of ``rows`` rows, in one-row steps (1.0 for one row)."""
        step = self._seconds.get(1)
        if rows <= 1:
            return 1.0
        timed = [k for k in self._seconds if k > 1]
        if step is None or not timed:
            return 1.0 + self.PRIOR_ROW * (rows - 1)
        if rows in self._seconds:
            return self._seconds[rows] / step
        below = max((k for k in timed if k < rows), default=1)
        above = min((k for k in timed if k > rows), default=None)
        low = self._seconds[below] / step if below > 1 else 1.0
        if above is not None:
            high = self._seconds[above] / step
            return low + (high - low) * (rows - below) / (above - below)
        # past the longest timed length (``below``): at most the prior's cost a row
        per_row = min(self.PRIOR_ROW, max(low - 1.0, 0.0) / (below - 1))
        return low + per_row * (rows - below)


class DraftLength:
    """How many tokens to draft next for one reply (see the module docstring).

    Each call that verified ``drafted`` tokens and kept ``taken`` is ``taken`` continuations
    and, if ``taken < drafted``, one stop: the chance ``p`` that a drafted token is kept once
    the ones before it were is their ratio (a moving count, from ``prior`` continuations in
    ``prior + 1`` trials). A draft of ``g`` tokens then yields ``1 + p + ... + p^g`` tokens
    for :meth:`VerifyCost.steps` ``(g + 1)`` steps' time; :meth:`next` takes the best ``g``,
    or 0 when none beats a plain step's one token per step."""

    def __init__(
        self,
        max_draft: int,
        *,
        cost: VerifyCost | None = None,
        prior: float = 1.5,
        retry_after: int = 16,
        decay: float = 0.5,
    ) -> None:
        self.max_draft = check_draft("max_draft", max_draft)
        self.cost = cost or VerifyCost()
        self.prior = prior
        self.retry_after = retry_after
        self.decay = decay
        self._kept, self._stops = prior, 1.0
        self._plain = 0  # plain steps since drafting last paid

    @property
    def p(self) -> float:
        """The chance that a drafted token is kept, given the ones before it were."""
        return self._kept / (self._kept + self._stops)

    def best(self, others: int = 0) -> tuple[int, float]:
        """The draft length with the most tokens per step's time, and that rate (1.0: a
        plain step). ``others``: tokens of other replies decoded in the same step (a batch
        step's). Plain, this reply's token rides in their call, ``others + 1`` tokens for
        :meth:`VerifyCost.steps` ``(others + 1)``; drafted, it takes a call of its own."""
        p, expected = self.p, 1.0
        cost = self.cost.steps
        base = cost(others) if others > 0 else 0.0
        best, plain = 0, (others + 1) / cost(others + 1)
        rate = plain
        for g in range(1, self.max_draft + 1):
            expected += p**g
            r = (others + expected) / (base + cost(g + 1))
            if r > rate:
                best, rate = g, r
        return best, rate / plain

    def next(self, others: int = 0) -> int:
        """The draft length for the next call (0: a plain step); ``others`` as :meth:`best`."""
        if self.max_draft == 0:
            return 0
        g, _ = self.best(others)
        if g:
            self._plain = 0
            return g
        self._plain += 1
        if self._plain < self.retry_after:
            return 0
        self._plain = 0  # try again, from the prior's odds
        self._kept, self._stops = self.prior, 1.0
        return max(1, self.best(others)[0])

    def accepted(self, drafted: int, taken: int) -> None:
        """A call verified ``drafted`` tokens and ``taken`` of them were right."""
        if drafted <= 0:
            return
        self._kept = self.decay * self._kept + taken
        self._stops = self.decay * self._stops + (1.0 if taken < drafted else 0.0)


class DraftBackend(Protocol):
    """What :func:`drafted_reply` needs of a backend (a llama.cpp context)."""

    n_ctx: int
    n_batch: int

    def seq_tokens(self, seq: int) -> list[int]: ...

    def decode(
        self, tokens: list[int] | tuple[int, ...], seq: int = 0, *, deadline: float | None = None
    ) -> tuple[Logits | None, float]: ...

    def decode_rows(self, tokens: Sequence[int], seq: int = 0) -> np.ndarray: ...

    def truncate(self, n: int, seq: int = 0) -> None: ...


@dataclass
class DraftStats:
    """What drafting did: calls that verified a draft, tokens drafted, tokens kept, and tokens
    decoded again one a step for a close call."""

    calls: int = 0
    drafted: int = 0
    accepted: int = 0
    redone: int = 0  # tokens decoded again one a step for a close call

    def add(self, other: DraftStats) -> None:
        self.calls += other.calls
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.redone += other.redone


def clear_choice(row: np.ndarray) -> int | None:
    """The row's most likely token when it leads the runner-up by :data:`MARGIN` or more (the
    one-row step would choose it too), else None."""
    best = int(row.argmax())  # two passes over the row: 20x faster than a partial sort
    return None if np.count_nonzero(row > row[best] - MARGIN) > 1 else best


class ReplyDraft:
    """Drafting for one reply, a step at a time: whoever decodes the reply asks :meth:`item`
    for the tokens of its next call (the reply's next token, with a draft after it when one
    pays) and hands :meth:`advance` the logits after each of them. :func:`drafted_reply` drives
    it alone; a :class:`~continuum.backends.batching.BatchScheduler` drives several at once,
    each in the calls of its steps.

    Greedy replies (``d.rng`` None) are plain decoding's token for token. A call of several
    rows computes logits and KV that differ from one-row steps' in the last bits, so a token
    is chosen from such logits only when the choice is clear (:func:`clear_choice`): draft
    tokens are kept while the model clearly chose them, and its choice after the last kept one
    is the next token when that is clear too. At a close call the KV decoded in calls of
    several rows since the last exact point is decoded again one token a call (:meth:`item`
    hands them back one by one), and the choice is made from the last one's logits: exactly
    plain decoding's. So a run of drafts starts only after :data:`CLEAR_STREAK` clear choices
    in a row (once the KV is inexact, drafting adds no risk until the next close call).

    Sampled replies choose each drafted row's token by standard speculative sampling
    (:meth:`Decoding.verify`): a drafted token is kept with its probability under the reply's
    sampling distribution at its row, and at the first one not kept the token drawn in its
    place ends the call. Every token is distributed as a draw from its row's logits. Those
    logits come from a call of several rows, and the random draws fall differently: a seeded
    reply is not the same tokens with drafting on and off (as with llama.cpp's speculative
    decoding).

    When the reply ends, the sequence is left as plain decoding leaves it (``d.resident``)."""

    def __init__(
        self,
        b: DraftBackend,
        d: Decoding,
        seq: int,
        length: DraftLength,
        stats: DraftStats,
        sources: DraftSources | None = None,
        tenant: str = "",
    ) -> None:
        """``sources``: the context's (its index of the sequence and its draft length, kept
        across replies — ``length`` only starts a sequence anew — and ``tenant``'s earlier
        replies); without, an index of the sequence made here and ``length``."""
        self.b, self.d, self.seq, self.length, self.stats = b, d, seq, length, stats
        # earlier replies to draft from where the sequence has nothing
        self.replies = sources.replies(tenant) if sources is not None else None
        self.look = sources.lookup(seq) if sources is not None else PromptLookup()
        anew = self.look.sync(b.seq_tokens(seq))
        if sources is not None:  # the sequence's own length, learnt over its earlier replies
            self.length = sources.length(seq, length, anew=anew)
        self.greedy = d.rng is None
        self.inexact: int | None = None  # where the KV decoded in calls of several rows starts
        self.streak = 0  # clear choices in a row: a run of drafts starts at CLEAR_STREAK
        self.again: list[int] | None = None  # tokens still to decode again after a close call
        self.guess: list[int] = []  # the draft of the call in flight
        self.held = 0  # the sequence's length before it

    def item(self, tok: int, others: int = 0) -> list[int]:
        """The tokens of the next call, ``tok`` first (the token :meth:`advance` or the reply's
        start returned); ``others``: other replies' tokens in the same step
        (:meth:`DraftLength.best`)."""
        self.guess = []
        if self.again is not None:
            return [tok]
        self.look.extend([tok])
        self.held = len(self.b.seq_tokens(self.seq))
        room = min(self.b.n_batch - 1, self.b.n_ctx - self.held - 2)
        g = self.length.next(others)
        if not self.greedy or self.inexact is not None or self.streak >= CLEAR_STREAK:
            n = min(g, room)
            self.guess = self.look.draft(n)
            if not self.guess and self.replies is not None:
                self.guess = self.replies.follow(self.look.tokens, n)
        return [tok, *self.guess]

    def plain(self) -> None:
        """The call in flight decodes :meth:`item`'s first token alone (its draft did not
        fit)."""
        self.guess = []

    def advance(self, rows: np.ndarray) -> int | None:
        """The logits after each token of the call (one row per token): the next token to
        decode, or None when the reply is over."""
        if self.again is not None:
            tok = self._again(rows[-1])
        elif self.greedy:
            tok = self._greedy(rows)
        else:
            tok = self._sampled(rows)
        if tok is None:
            cut_to_resident(self.b, self.d, self.seq)
        return tok

    def _kept(self, taken: int) -> None:
        """``taken`` tokens of the call's draft were kept: the rest leave the sequence."""
        self.stats.add(DraftStats(1, len(self.guess), taken))
        self.length.accepted(len(self.guess), taken)
        self.b.truncate(self.held + 1 + taken, self.seq)  # the token and the kept draft stay

    def _greedy(self, rows: np.ndarray) -> int | None:
        guess, logits = self.guess, rows[-1]
        if guess:
            self.inexact = self.held if self.inexact is None else self.inexact
            taken = 0
            while taken < len(guess) and clear_choice(rows[taken]) == guess[taken]:
                taken += 1
            self._kept(taken)
            if not all(self.d.step(rows[i]) is not None for i in range(taken)):
                return None  # the reply ended inside the kept draft
            self.look.extend(guess[:taken])
            self.streak += taken
            logits = rows[taken]
        if clear_choice(logits) is not None:
            self.streak += 1
            return self.d.step(logits)
        self.streak = 0
        if self.inexact is None:
            return self.d.step(logits)
        again = self.b.seq_tokens(self.seq)[self.inexact :]  # decoded again one a call
        self.b.truncate(self.inexact, self.seq)
        self.stats.redone += len(again)
        self.inexact, self.again = None, again[1:]
        return again[0]

    def _again(self, logits: Logits) -> int | None:
        assert self.again is not None
        if self.again:
            return self.again.pop(0)
        self.again = None  # plain decoding's KV and logits again: its choice
        return self.d.step(logits)

    def _sampled(self, rows: np.ndarray) -> int | None:
        guess = self.guess
        if not guess:
            return self.d.step(rows[-1])
        taken, instead = 0, None
        while taken < len(guess) and instead is None:
            chosen = self.d.verify(rows[taken], guess[taken])
            if chosen == guess[taken]:
                taken += 1
            else:
                instead = chosen
        self._kept(taken)
        if not all(self.d.take(x) is not None for x in guess[:taken]):
            return None  # the reply ended inside the kept draft
        self.look.extend(guess[:taken])
        return self.d.step(rows[taken]) if instead is None else self.d.take(instead)


def drafted_reply(
    b: DraftBackend,
    d: Decoding,
    tok: int | None,
    seq: int,
    length: DraftLength,
    sources: DraftSources | None = None,
    tenant: str = "",
) -> DraftStats:
    """Drive reply ``d`` to its end from its first token ``tok`` on its own, each call
    decoding the token with a draft from the sequence's own tokens after it, or from
    ``tenant``'s earlier replies in ``sources`` (:class:`ReplyDraft`; greedy replies come out
    as plain decoding's, sampled ones by speculative sampling); the reply joins them."""
    stats = DraftStats()
    draft = ReplyDraft(b, d, seq, length, stats, sources, tenant)
    cost = draft.length.cost
    while tok is not None:
        tokens = draft.item(tok)
        if len(tokens) > 1:
            rows = _timed_rows(b, tokens, seq, cost)
        else:
            rows = _timed_step(b, tok, seq, cost)[None, :]
        tok = draft.advance(rows)
    if sources is not None:
        sources.ended(tenant, d.gen)
    return stats


def _timed_step(b: DraftBackend, tok: int, seq: int, cost: VerifyCost) -> Logits:
    """A plain one-row step, its time told to ``cost``; the logits after it."""
    t = time.perf_counter()
    logits, _ = b.decode([tok], seq)
    cost.observe(1, time.perf_counter() - t)
    assert logits is not None
    return logits


def _timed_rows(b: DraftBackend, tokens: list[int], seq: int, cost: VerifyCost) -> np.ndarray:
    """One call decoding ``tokens`` (a token and its draft), its time told to ``cost``; every
    row's logits."""
    t = time.perf_counter()
    rows = b.decode_rows(tokens, seq)
    cost.observe(len(tokens), time.perf_counter() - t)
    return rows


def cut_to_resident(b: DraftBackend, d: Decoding, seq: int) -> None:
    """Leave ``seq`` as plain decoding leaves it when the reply ended inside a kept draft."""
    if d.resident is not None and d.resident < len(b.seq_tokens(seq)):
        b.truncate(d.resident, seq)
