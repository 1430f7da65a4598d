"""Session turns through the result tiers: the engine's side of ``stateful.hooks``.

A turn's canonical prompt (the window's token segments and the generation prompt, exactly what
the resident sequence would hold) is keyed like any op — tenant, backend, model digest, op name
``chat.completions``, every decode parameter — so an exact repeat is a memo hit and a verified
answer from a prior run is a memory-graph hit, with nothing decoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from continuum.keys import canonical_messages
from continuum.metrics import TierOutcome
from continuum.stateful.hooks import StoredReply, TurnLookup, TurnQuery
from continuum.tiers.base import TierRequest, TierResult, first_hit

if TYPE_CHECKING:
    from continuum.engine.core import Engine

TURN_OP = "chat.completions"


class EngineTurnTiers:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def lookup(self, query: TurnQuery) -> TurnLookup:
        from continuum.engine.pipeline import tier_request

        eng = self._engine
        if not query.policy.enabled or not eng.result_tiers:
            return TurnLookup(None, ())
        req = tier_request(
            eng,
            query.namespace or "default",
            TURN_OP,
            query.params,
            query.tokens,
            query.policy,
            tuple(canonical_messages(query.messages)),
        )
        outcomes: list[TierOutcome] = []
        hit = first_hit(eng.result_tiers, req, outcomes)
        reply = None
        if hit is not None and hit.result is not None:
            r = hit.result
            reply = StoredReply(hit.outcome.tier, r.text, r.tokens, r.finish_reason)
        return TurnLookup(reply, tuple(outcomes), req)

    def record(self, lookup: TurnLookup, text: str, tokens: tuple[int, ...], finish: str) -> None:
        req = lookup.request
        if not isinstance(req, TierRequest):
            return
        result = TierResult(text, tokens, finish, len(req.tokens))
        for tier in self._engine.result_tiers:
            tier.record(req, result)
