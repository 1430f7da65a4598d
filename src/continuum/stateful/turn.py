"""A turn before anything is decoded: verify the history, render, plan. Pure; no KV.

:func:`prepare_turn` finds the divergence point (the first message whose identity differs from
the history, DESIGN.md §3.2), renders the window (moving it forward past the high-water mark,
visibly), and plans what to keep and decode (:mod:`continuum.stateful.plan`). Nothing changes
until the session executes the plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from continuum.errors import ContextOverflow
from continuum.hashing import message_identity
from continuum.messages import Message
from continuum.metrics import Compaction, Metrics, Reset, ResetReason, TierOutcome
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.stateful.arrival import Lookahead
from continuum.stateful.hooks import TurnLookup
from continuum.stateful.plan import DecodePlan, plan_decode
from continuum.stateful.transcript import Target, Transcript
from continuum.store.sqlite import StoredMessage
from continuum.toolcalls import ToolCall, ToolParsing

_NEVER = 1 << 62  # min_reuse under ReusePolicy.never(): nothing resident is reused


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """A turn rendered and planned, before anything is decoded."""

    system: str | None
    diverged_at: int  # history messages kept as they were
    new_hist: list[StoredMessage]
    target: Target
    full: list[int]
    plan: DecodePlan
    n_cached: int
    keep_cache: bool  # the segment cache still describes the kept history if the turn fails
    before: int  # resident tokens before the turn
    resets: tuple[Reset, ...]


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What a turn asks for: the system prompt and the full message list after it, how to
    generate the reply, and what of the resident state it may reuse."""

    system: str | None
    messages: list[Message]
    params: GenerationParams
    policy: ReusePolicy


@dataclass(frozen=True, slots=True)
class TurnLimits:
    """The room a turn's prompt and reply must fit: under the session's ``high_water`` mark
    and the context's ``n_ctx``; a window that must move goes down to ``low_water`` where it
    can (None: the high-water mark), and also leaves ``reserve`` tokens free besides the
    reply's (room for a continuity note)."""

    high_water: int
    n_ctx: int
    reserve: int = 0
    low_water: int | None = None


def prepare_turn(
    tr: Transcript,
    history: list[StoredMessage],
    request: TurnRequest,
    limits: TurnLimits,
    *,
    resident: list[int],
    lookahead: Lookahead,
    pending: list[Reset],
    window_at: int | None = None,
) -> TurnPlan:
    """Verify ``request``'s messages against ``history``, render the window and plan the
    decode within ``limits``; change nothing (the transcript's cache included).
    ``window_at`` renders the window from that message instead of finding where it fits."""
    system, msgs, params = request.system, request.messages, request.params
    high_water, reserve = limits.high_water, limits.reserve
    idents = [message_identity(m) for m in msgs]
    d = 0
    while d < min(len(msgs), len(history)) and history[d].identity == idents[d]:
        d += 1
    new_hist = history[:d] + [
        StoredMessage(m, i) for m, i in zip(msgs[d:], idents[d:], strict=True)
    ]
    rebuilds: list[tuple[ResetReason, str]] = []
    wake_same = tr.same_wake(system)
    if not wake_same and tr.wake is not None:
        what = "system prompt" if system != tr.system else "tools"
        rebuilds.append((ResetReason.DIVERGENCE, f"the {what} changed"))
    window = tr.window if wake_same and d >= tr.window else 0
    n_cached = max(0, d - window) if wake_same and window == tr.window else 0
    if window_at is not None:
        target = tr.target(system, new_hist, window_at, 0)
    else:
        target = tr.target(system, new_hist, window, n_cached)
        if window != tr.window or target.prompt_len() + params.max_tokens > high_water:
            need = params.max_tokens + reserve
            target = tr.fit(system, new_hist, window, need, high_water, limits.low_water)
    if target.window != tr.window:
        rebuilds.append(
            (
                ResetReason.HIGH_WATER,
                f"prompt + max_tokens would cross the high-water mark ({high_water}); "
                f"rebuilt from message {target.window} of {len(new_hist)}",
            )
        )
        verified = len(target.wake) if wake_same else 0
    else:
        verified = target.verified_end(n_cached) if wake_same else 0
    full = target.full()
    if len(full) >= limits.n_ctx:
        raise ContextOverflow(len(full) + 1, limits.n_ctx)
    ahead = lookahead.ahead(full)
    min_reuse = max(1, request.policy.min_len) if request.policy.enabled else _NEVER
    plan = plan_decode(resident, full, verified, ahead, min_reuse=min_reuse)
    before = len(resident)
    n_prompt = len(target.tokens())
    resets = [
        Reset(
            r.reason,
            r.detail,
            r.tokens_dropped,
            r.tokens_rebuilt if r.tokens_rebuilt >= 0 else max(0, verified - plan.keep),
        )
        for r in pending
    ] + [Reset(why, detail, before - plan.keep, n_prompt - plan.keep) for why, detail in rebuilds]
    keep_cache = target.window == tr.window and wake_same
    return TurnPlan(
        system, d, new_hist, target, full, plan, n_cached, keep_cache, before, tuple(resets)
    )


@dataclass(frozen=True, slots=True)
class Reply:
    """What the turn replied and what producing it cost (``tier``: the result tier that
    served it, None when it was generated)."""

    text: str
    tokens: tuple[int, ...]
    finish: str
    ttft_ms: float
    prefill_ms: float
    evaluated: int
    reused: int
    tier: str | None = None
    lookup_ms: float = 0.0  # from the turn's start to the end of the result tiers' lookup


def turn_metrics(
    prep: TurnPlan,
    out: Reply,
    looked: TurnLookup | None,
    wire_chars: int,
    t0: float,
    context: tuple[int, int, int],
    restored_from: str,
    compaction: Compaction | None = None,
) -> Metrics:
    """A turn's metrics; ``context``: (tokens resident now, n_ctx, the high-water mark)."""
    served, plan = out.tier is not None, prep.plan
    hit_tier = out.tier or kv_tier(out.reused, restored_from)
    return Metrics(
        prompt_tokens=len(prep.full),
        prompt_tokens_evaluated=out.evaluated + (compaction.summary_evaluated if compaction else 0),
        tokens_reused=len(prep.full) if served else out.reused,
        tokens_truncated=0 if served else prep.before - out.reused,
        completion_tokens=len(out.tokens),
        backend_called=not served,
        lookup_ms=out.lookup_ms,
        ttft_ms=out.ttft_ms,
        prefill_ms=out.prefill_ms,
        total_ms=(time.perf_counter() - t0) * 1000.0,
        context_used=context[0],
        context_limit=context[1],
        high_water=context[2],
        wire_chars=wire_chars,
        resets=prep.resets,
        fed_tokens=0 if served else plan.fed_tokens,
        eager_tokens_used=0 if served else plan.eager_used,
        eager_tokens_discarded=0 if served else plan.eager_discarded,
        hit_tier=hit_tier,
        tiers=outcomes(looked, hit_tier, out.reused, restored_from),
        compaction=compaction,
    )


def reply_message(
    text: str, finish: str, parsing: ToolParsing | None
) -> tuple[Message, tuple[ToolCall, ...] | None]:
    """The reply as the history keeps it (and as a client sends it back): its text, or, when
    it made tool calls, the text outside them and the calls (``None``: not parsed)."""
    if parsing is None:
        return {"role": "assistant", "content": text}, None
    content, calls, _ = parsing.split(text, finish)
    if not calls:
        return {"role": "assistant", "content": text}, ()
    msg: Message = {"role": "assistant", "content": content or ""}
    msg["tool_calls"] = [c.to_openai() for c in calls]
    return msg, tuple(calls)


def kv_tier(reused: int, restored_from: str) -> str:
    """The KV tier that served a generated turn: its own resident sequence (``prefix_kv``),
    that sequence back from a parked snapshot (``layer_kv``), or nothing (``cold``)."""
    if reused == 0:
        return "cold"
    return "layer_kv" if restored_from else "prefix_kv"


def outcomes(
    looked: TurnLookup | None, hit_tier: str, reused: int, restored_from: str
) -> tuple[TierOutcome, ...]:
    """What every tier said about a turn: the result tiers', then the KV tiers'."""
    out = list(looked.outcomes) if looked is not None else []
    if hit_tier in ("prefix_kv", "layer_kv", "cold"):
        kv = "hit" if hit_tier == "prefix_kv" else "miss"
        out.append(TierOutcome("prefix_kv", kv, tokens=reused if kv == "hit" else 0))
        if hit_tier != "prefix_kv":
            lk = "hit" if hit_tier == "layer_kv" else "miss"
            out.append(
                TierOutcome(
                    "layer_kv",
                    lk,
                    tokens=reused if lk == "hit" else 0,
                    source=restored_from,
                )
            )
    return tuple(out)
