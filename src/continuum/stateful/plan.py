"""The decode plan: which resident tokens a turn keeps, and what it decodes. Pure; no model.

Given what is resident and the turn's canonical prompt, the plan keeps the longest resident
prefix that lies inside the verified segments (DESIGN.md §3.2) — plus any tokens decoded ahead
of the turn (eager glue, a message fed as it arrived, a speculative finish) exactly where they
equal the prompt — and decodes only the rest. Two numerical rules shape it:

- at least one prompt token is decoded, so the turn has fresh logits to sample from;
- where tokens decoded ahead are kept, the last batch is never 1-7 tokens: llama.cpp's kernels
  for such batches differ from its batched ones, so the plan backs off into the tokens decoded
  ahead (never below ``floor``, the end of tokens decoded in batches that must not be re-split)
  until the split matches one whole-message decode;
- with ``exact`` (a session of an exact worker) it keeps only resident tokens a cold decode
  would have given the same KV, and decodes at least 8 (:func:`exact_reuse`): the reply's
  logits are then those of a cold prefill of the whole prompt, bit for bit.

Nothing is ever inserted into the decoded past: the plan only truncates and appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from continuum.backends.base import MIN_BATCH
from continuum.backends.exactness import exact_reuse


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (binary search on slices,
    which compare in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class Ahead:
    """What was decoded ahead of the turn: the resident span of eager glue, where tokens
    decoded ahead begin (``spec_from``), the batch floor, and whether a speculative finish
    decoded exactly this prompt (its logits are ready); ``exact``: how many resident tokens are
    exact, when the plan must keep no others (None: any verified token may be kept)."""

    glue: tuple[int, int] = (0, 0)
    spec_from: int = 1 << 62
    floor: int = 0
    spec_ready: bool = False
    exact: int | None = None


@dataclass(frozen=True, slots=True)
class DecodePlan:
    keep: int  # resident tokens kept; the KV is truncated here
    decode_from: int  # the prompt is decoded from here (keep, or keep - 1 for fresh logits)
    use_spec: bool  # the speculative finish's logits are the turn's: nothing to decode
    fed_tokens: int  # tokens of the message fed as it arrived, kept
    eager_used: int  # eager glue tokens kept
    eager_discarded: int  # eager glue tokens truncated (the message was different)

    @property
    def reused(self) -> int:
        return self.decode_from


def plan_decode(
    resident: Sequence[int],
    full: Sequence[int],
    verified: int,
    ahead: Ahead = Ahead(),
    *,
    min_reuse: int = 1,
) -> DecodePlan:
    """Plan a turn whose whole prompt is ``full``, of which the first ``verified`` tokens are
    the history's verified segments. A kept prefix shorter than ``min_reuse`` is not reused
    (the policy's threshold; a huge value means recompute everything)."""
    before = len(resident)
    keep = common_prefix(resident, full[:verified])
    glue_start, glue_end = ahead.glue
    fed = eager_used = eager_discarded = 0
    spec_exact = ahead.exact is None or ahead.exact >= len(full)
    if ahead.spec_ready and spec_exact and keep == verified and list(resident) == list(full):
        keep = len(full)
        eager_used = max(0, glue_end - glue_start)
        fed = max(0, keep - max(verified, glue_end))
        return DecodePlan(keep, keep, True, fed, eager_used, 0)
    if keep == verified and before > verified and ahead.spec_from <= verified:
        keep = verified + common_prefix(resident[verified:], full[verified:])
        keep = min(keep, len(full) - 1)  # at least one token decoded for fresh logits
        floor = min(ahead.floor, keep)
        if keep - floor > 0 and len(full) - keep < MIN_BATCH:
            keep = max(floor, len(full) - MIN_BATCH)
    if ahead.exact is not None:
        keep = exact_reuse(min(keep, ahead.exact), len(full))
    if keep > glue_start and glue_end > glue_start:
        eager_used = max(0, min(keep, glue_end) - glue_start)
    eager_discarded = max(0, glue_end - glue_start - eager_used)
    fed = max(0, keep - max(verified, glue_end))
    if keep < min_reuse:
        keep = fed = eager_used = 0
        eager_discarded = max(0, glue_end - glue_start)
    decode_from = keep if keep < len(full) else keep - 1
    return DecodePlan(keep, decode_from, False, fed, eager_used, eager_discarded)
