"""What goes into a batch step: :class:`StepPlanner`, the batch scheduler's planning half.

Given the replies not yet in a step and the room left, a plan is one token for every reply that
is generating, then the prompts that fit whole (shortest first), then chunks of the others
(how they share the room: :class:`PrefillShare`); the tenant served longest ago goes first.

The inter-token budget: while replies that do not yield generate (sessions'), the prompts
that *yield* (a stateless request's: the engine marks them) get only as much decode time per
step as ``itl_budget`` allows — a step may take at most ``itl_budget`` times what the
replies' tokens alone take (measured: moving averages of a generating call's time, and of a
prompt token's time in a prompt call), and never fewer than 8 chunk tokens (the backend's
batching rule keeps a prompt decoded in chunks of >= 8 exact). So a 2k-token stateless prompt
arriving while sessions stream is decoded in small chunks between their tokens instead of
stopping them for a whole step of 512 tokens (seconds on a CPU); with no session generating,
it fills the room (:func:`protects`: among stateless requests alone, small chunks would only
trade one request's first token for another's next one — ``bench agents-paused``, 6
agents sending no session key on Gemma 3 270M, alternated: first-token p50 2.2 s with every
reply protected, 1.1-1.5 s without).
Sessions' own prompts do not yield: an agent's next turn, or a new session's system prompt,
would wait several times longer in small chunks (measured: ``bench concurrent`` at 8 agents,
first-token p95 +30%, tokens/s -8%). ``itl_budget=None``: no prompt yields.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from continuum.backends.base import MIN_BATCH
from continuum.backends.passes import chunk
from continuum.errors import InvalidRequest

SMOOTHING = 0.2  # weight of the newest measurement in the moving averages
ITL_BUDGET = 2.0  # the default: a step with replies in it at most twice their own time


@dataclass(frozen=True, slots=True)
class Program:
    """Whose prompt a reply is: its tenant (steps share their room between tenants) and when
    its program — the session — began (``age`` puts the oldest first)."""

    tenant: str = ""
    started: float = 0.0


NOBODY = Program()  # no tenant, no session


class PrefillShare(enum.Enum):
    """How a step's room left after the whole prompts goes to the prompts that do not fit (see
    the batching module's docstring)."""

    OLDEST = "oldest"  # the oldest request first
    EQUAL = "equal"  # equal shares: per tenant, then per prompt
    LAS = "las"  # the program with the least attained service first (its sequence's length)
    AGE = "age"  # the program that started first (its session's start), whatever its tenant

    @classmethod
    def parse(cls, value: object) -> PrefillShare:
        """``value`` (a member or its name) as a member; a typed error naming the choices."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            names = ", ".join(repr(p.value) for p in cls)
            raise InvalidRequest(f"prefill_share must be one of {names}, got {value!r}") from None


def check_itl_budget(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1.5:
        raise InvalidRequest(
            f"itl_budget must be a number >= 1.5 (a step's time over the replies' own), or "
            f"None for no budget; got {value!r}"
        )
    return float(value)


class Planned(Protocol):
    """A reply as the planner sees it."""

    pending: list[int]  # prompt tokens not decoded yet
    next_token: int | None  # chosen, to be decoded in the next step
    tenant: str
    steps: int
    yields: bool  # its chunks keep to the budget while replies generate
    context: int  # tokens its sequence held before it: its program's attained service
    started: float  # when its program (the session) started: with ``age``, the first goes first


R = TypeVar("R", bound=Planned)


class StepPlanner:
    """Plans each call of a step (see the module docstring); learns the step costs the
    inter-token budget needs from the calls the scheduler times."""

    def __init__(self, share: PrefillShare, itl_budget: float | None) -> None:
        self.share = share
        self.itl_budget = itl_budget
        self.served: dict[str, int] = {}  # tenant -> the last step that decoded its prompt
        self._gen_ms: float | None = None  # a call of generated tokens alone
        self._token_ms: float | None = None  # a prompt token in a call of chunks

    def timed(self, generated: int, prompt: int, ms: float) -> None:
        """A call of ``generated`` reply tokens and ``prompt`` prompt tokens took ``ms``."""
        if generated and not prompt:
            self._gen_ms = _smooth(self._gen_ms, ms)
        elif prompt >= MIN_BATCH and not generated:
            self._token_ms = _smooth(self._token_ms, ms / prompt)

    def chunk_room(self, generating: bool) -> int | None:
        """The chunk tokens a step may take: None (no limit) unless replies generate in it
        under a budget and both costs are known."""
        if not generating or self.itl_budget is None:
            return None
        if self._gen_ms is None or self._token_ms is None:
            return MIN_BATCH  # learn the costs on the smallest exact chunk
        n = int((self.itl_budget - 1.0) * self._gen_ms / self._token_ms)
        return max(MIN_BATCH, n)

    def plan(
        self, replies: Sequence[R], room: int, chunks: int | None = None
    ) -> list[tuple[R, list[int]]]:
        """The items for ``room`` tokens, chunks of long prompts taking at most ``chunks``
        of it: a token per generating reply, then the prompts that fit whole (shortest first;
        with ``equal``, only those not started), then chunks of the others (oldest first, or
        equal shares); the tenant served longest ago goes first (with ``las``: the program
        whose sequence is shortest)."""
        items: list[tuple[R, list[int]]] = [
            (r, [r.next_token]) for r in replies if r.next_token is not None
        ]
        room -= len(items)
        prompts = [r for r in replies if r.pending]  # oldest first
        equal = self.share is PrefillShare.EQUAL

        def share(r: R) -> float:
            if self.share is PrefillShare.LAS:  # the least served program, whatever its tenant
                return r.context
            if self.share is PrefillShare.AGE:  # the oldest program, whatever its tenant
                return r.started
            return self.served.get(r.tenant, -1)

        rest = []
        for r in sorted(prompts, key=lambda r: (share(r), len(r.pending))):
            over = r.yields and chunks is not None and len(r.pending) > chunks
            if len(r.pending) <= room and not (equal and r.steps) and not over:
                items.append((r, list(r.pending)))
                room -= len(r.pending)
            else:
                rest.append(r)
        rest.sort(key=share)  # stable: the oldest first within a tenant
        if chunks is not None:  # those that yield go after the others, in what is left
            rest.sort(key=lambda r: r.yields)
        groups = list(_by_tenant(rest).values()) if equal else [rest]
        for j, group in enumerate(groups):
            budget = room // (len(groups) - j)  # the tenant's equal share of the room left
            for i, r in enumerate(group):
                if room < MIN_BATCH or (i and budget < MIN_BATCH):
                    break  # too little to share: the tenant's oldest prompt takes 8 tokens
                each = max(budget // (len(group) - i), MIN_BATCH) if equal else room
                if r.yields and chunks is not None:
                    if chunks < MIN_BATCH:
                        continue
                    each = min(each, chunks)
                n = chunk(len(r.pending), each, room)
                if r.yields and chunks is not None:
                    chunks -= n
                if n:
                    items.append((r, r.pending[:n]))
                    room -= n
                    budget -= n
        return items


def protects(replies: Sequence[Planned]) -> bool:
    """The budget holds this step: a reply that does not yield (a session's) is generating.
    Among stateless requests alone, a prompt decoded in small chunks would only trade its own
    first token for another stateless reply's next one (agents without a session key, all
    waiting on each other's prompts)."""
    return any(r.next_token is not None and not r.yields for r in replies)


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def _by_tenant(replies: Sequence[R]) -> dict[str, list[R]]:
    groups: dict[str, list[R]] = {}
    for r in replies:
        groups.setdefault(r.tenant, []).append(r)
    return groups
