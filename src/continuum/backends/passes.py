"""How a batch step is cut into ``llama_decode`` calls, so that every token in it comes out
bit-equal to the same token decoded alone.

llama.cpp multiplies a ubatch of fewer than ``MIN_BATCH`` (8) rows one way and a ubatch of 8 rows
or more another; the two sum in a different order, so a token's logits depend on which side of 8
its ubatch falls, and on nothing else about it (measured on Qwen2.5-Coder-0.5B and Gemma 3 270M,
one KV stream per sequence: up to ~0.3 apart across the line, 0.0 within a side). Decoded alone, a
generated token is a ubatch of one row, and a prompt a run of chunks of 8 rows or more (the
backend's 8-token rule; a prompt shorter than 8 is one small ubatch).

One call for the whole step would break that: a context with a KV stream per sequence splits a
call into equal ubatches (a token of every sequence, then more of the longer ones), which puts a
prompt's first token in a small ubatch beside the generated tokens, a 5-token tail of a longer
prompt in a ubatch of its own, and eight generated tokens in one ubatch of 8. So a step is
decoded as:

- the small items (fewer than 8 tokens: generated tokens, a short prompt) in calls of at most 7
  tokens, as even as possible;
- each chunk of 8 tokens or more with the others of its length (one equal ubatch), except
  that prompts whose first token waits on the call (the last chunk of a prompt with a reply to
  start) go in calls of at most ``FIRST_ROWS`` tokens (one prompt at least).

That is as many passes over the weights as the one call's ubatches were, except when 8 or more
small items come at once: eight generated tokens take two passes of 4 instead of one of 8
(Qwen2.5-Coder-0.5B, 2 threads: 143 vs 135 ms).

Why cut first tokens' calls: on a CPU a call costs a fixed ~50 ms plus ~6.5 ms a row
(Qwen2.5-Coder-0.5B, 2 threads, 19-token turn prompts of sessions with ~1,100 tokens
resident: one, two, four and eight of them in one call took 173, 282, 528 and 1,033 ms). Eight
agents' next turns in one call get their first tokens together after ~1 s; in four calls of
two, after 0.3, 0.6, 0.9 and 1.2 s: a mean ~30% lower for ~15% more time on that step.
"""

from __future__ import annotations

from collections.abc import Sequence

from continuum.backends.base import MIN_BATCH

SMALL = MIN_BATCH - 1  # the most tokens of one call of small items
FIRST_ROWS = 48  # the most tokens of a call of prompts whose first tokens wait on it


def passes(sizes: Sequence[int], firsts: Sequence[bool] = ()) -> list[list[int]]:
    """The ``llama_decode`` calls of a step whose items have ``sizes`` tokens (each >= 1): the
    indices of each call's items, small items' calls first (see the module docstring).
    ``firsts[i]``: item ``i`` ends a prompt whose reply starts from it (default: none)."""
    if any(n < 1 for n in sizes):
        raise ValueError(f"every item has at least one token, got sizes {list(sizes)}")
    small = sorted((i for i, n in enumerate(sizes) if n < MIN_BATCH), key=lambda i: -sizes[i])
    calls: list[list[int]] = [[] for _ in range(-(-sum(sizes[i] for i in small) // SMALL))]
    loads = [0] * len(calls)
    for i in small:  # the largest first, each into the least loaded call it fits
        fits = [j for j in range(len(calls)) if loads[j] + sizes[i] <= SMALL]
        if not fits:
            calls.append([])
            loads.append(0)
            fits = [len(calls) - 1]
        j = min(fits, key=lambda j: loads[j])
        calls[j].append(i)
        loads[j] += sizes[i]
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(sizes):
        if n >= MIN_BATCH:
            by_length.setdefault(n, []).append(i)
    calls = [sorted(c) for c in calls]
    for n, group in by_length.items():
        first = [i for i in group if i < len(firsts) and firsts[i]]
        rest = [i for i in group if not (i < len(firsts) and firsts[i])]
        per = max(1, FIRST_ROWS // n)
        cut = [first[k : k + per] for k in range(0, len(first), per)] or [[]]
        cut[-1] = sorted(cut[-1] + rest)  # the other chunks of this length ride along
        calls += cut
    return calls


def chunk(pending: int, share: int, room: int) -> int:
    """How many of a prompt's ``pending`` tokens a step decodes, given its ``share`` of the
    step's ``room`` (both >= 8): the share, or all of them when that would leave a 1-7-token
    tail and the room holds them; never a chunk under 8 tokens nor a tail of 1-7 (the
    backend's batching rule), so 0 when neither fits."""
    n = min(share, room)
    if pending - n < MIN_BATCH:  # all of it, or leave at least 8 for later
        n = pending if pending <= room else pending - MIN_BATCH
    return n if n >= MIN_BATCH or n == pending else 0
