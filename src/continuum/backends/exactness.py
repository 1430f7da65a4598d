"""Which resident KV a cold decode would have produced bit for bit, and how much of it a prompt
may reuse (issue "cache invariance"; measured in tests/backends/test_llamacpp_exactness.py).

llama.cpp computes a ubatch of fewer than ``MIN_BATCH`` (8) rows with other kernels than a
ubatch of 8 or more, whose rows come out the same however a prompt is cut into batches. With a
KV stream per sequence (cells at the sequence's own positions) that gives one rule:

- a sequence's first ``n`` tokens are *exact* when every one of them was decoded in a batch of
  8 or more rows after an exact prefix — decoded so, copied from an exact sequence, or restored
  from a snapshot of exact tokens; a reply, decoded a token at a time, is not;
- a prompt reusing an exact prefix gives the cold logits when the rest, decoded after it, is at
  least 8 tokens: :func:`exact_reuse`.

In a unified cache the sums also depend on which cells a sequence got, which the other
sequences decide: nothing there is exact.

:class:`ExactLedger` keeps the count per sequence; the backend tells it every decode, cut, copy
and restore. Its invariant: ``exact(seq) <= len(tokens of seq)``, and those tokens are exact.
"""

from __future__ import annotations

from continuum.backends.base import MIN_BATCH


def exact_reuse(exact: int, n_prompt: int) -> int:
    """The most of a prompt's first tokens a source holding ``exact`` of them exactly may give,
    so that decoding the rest gives the cold logits bit for bit: the rest is one batch of
    ``MIN_BATCH`` or more (0: decode the whole prompt)."""
    return max(0, min(exact, n_prompt - MIN_BATCH))


class ExactLedger:
    """How many of each sequence's first tokens are exact. ``streams``: the context keeps a KV
    stream per sequence (False: a unified cache, where none are)."""

    def __init__(self, streams: bool) -> None:
        self.streams = streams
        self._exact: dict[int, int] = {}

    def exact(self, seq: int) -> int:
        return self._exact.get(seq, 0)

    def decoded(self, seq: int, before: int, n: int, rows: int) -> None:
        """``n`` tokens were appended to ``seq`` (which held ``before``) in calls of ``rows``
        rows or more each: they are exact if the rows reached the batched kernels and
        everything before them was exact."""
        if self.streams and rows >= MIN_BATCH and self.exact(seq) == before:
            self._exact[seq] = before + n

    def cut(self, seq: int, n: int) -> None:
        """``seq`` now holds its first ``n`` tokens."""
        self._exact[seq] = min(self.exact(seq), max(n, 0))

    def copied(self, src: int, dst: int, n: int) -> None:
        """``dst`` now holds ``src``'s first ``n`` tokens, cells as they were."""
        self._exact[dst] = min(self.exact(src), n) if self.streams else 0

    def restored(self, seq: int, exact: int) -> None:
        """``seq`` was loaded from a snapshot whose first ``exact`` tokens are exact (as its
        writer knew them; 0 when nobody knows)."""
        self._exact[seq] = exact if self.streams else 0
