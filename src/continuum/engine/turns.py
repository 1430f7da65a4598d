"""Session turns through the result tiers: the engine's side of ``stateful.hooks``.

A turn's canonical prompt (the window's token segments and the generation prompt, exactly what
the resident sequence would hold) is keyed like any op — tenant, backend, model digest, op name
``chat.completions``, every decode parameter — so an exact repeat is a memo hit and a verified
answer from a prior run is a memory-graph hit, with nothing decoded.
"""

from __future__ import annotations

from continuum.engine.pipeline import OpPipeline
from continuum.keys import canonical_messages
from continuum.metrics import TierOutcome
from continuum.stateful.hooks import StoredReply, TurnLookup, TurnQuery
from continuum.tiers.base import TierRequest, TierResult, first_hit

TURN_OP = "chat.completions"


class PipelineTurnTiers:
    """:class:`~continuum.stateful.hooks.TurnTiers` over an op pipeline's result tiers: a turn
    is looked up and recorded under the key an op with the same prompt would have."""

    def __init__(self, pipeline: OpPipeline) -> None:
        self._pipeline = pipeline

    def lookup(self, query: TurnQuery) -> TurnLookup:
        pipeline = self._pipeline
        results = pipeline.tiers.results
        if not query.policy.enabled or not results:
            return TurnLookup(None, ())
        req = pipeline.request(
            query.namespace or "default",
            TURN_OP,
            query.params,
            query.tokens,
            query.policy,
            tuple(canonical_messages(query.messages)),
        )
        outcomes: list[TierOutcome] = []
        hit = first_hit(results, req, outcomes)
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
        for tier in self._pipeline.tiers.results:
            tier.record(req, result)
