"""The op pipeline: a ``TokenOp`` walks the result tiers, then the KV tiers, then the backend.

Correctness rules enforced here:
- The policy is part of every request; ``ReusePolicy.never()`` bypasses all tiers and sends the
  backend exactly the op as given (no canonicalisation, no reused state, nothing stored).
- A KV tier hit leaves at least ``min_suffix`` (8) tokens to decode: llama.cpp's kernels for
  batches of 8+ tokens give bit-identical results however a prompt is chunked, so a prefix or
  snapshot hit produces exactly the tokens a cold call would (DESIGN.md §3.4).
- A ``ToolOp`` always runs, unless its tool is declared read-only; every tool run is recorded in
  the memory graph, where a changed result invalidates what used the old one (§3.7).
- A backend that declares ``Capabilities.routed`` gets every op's tenant and conversation
  (:class:`RequestRoute`), ``never()`` included: the tenant's cache partition on a shared
  server is isolation, not reuse.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from continuum.backends.base import Generation, OpBackend, RequestRoute, RoutedBackend
from continuum.errors import InvalidRequest, KVCacheFull
from continuum.hashing import canonical_json
from continuum.keys import canonical_messages, canonical_text, op_key, tool_key
from continuum.messages import Message
from continuum.metrics import Metrics, TierOutcome
from continuum.ops import TokenOp, ToolOp
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.results import ContextItem, Result
from continuum.stateful.kv_space import Lane
from continuum.tiers.base import Tier, TierRequest, TierResult, first_hit
from continuum.tiers.memory_graph import MemoryGraph, output_text, with_context
from continuum.tiers.prefix_kv import PrefixKVTier
from continuum.tiers.semantic import SemanticTier

OnText = Callable[[str], None]
_NONE = object()  # no memoised tool result (None is a result)


class ContextOwner(Protocol):
    """The one owner of the model's context (the engine): it serialises access to it, and
    places an op's decode in it — the backend's working sequence, or a lane lent for the op."""

    def claim(self) -> AbstractContextManager[None]:
        """Hold the model (idle work steps aside until the block ends)."""
        ...

    def op_claim(self) -> AbstractContextManager[None]:
        """Hold the model for an op: ops run one at a time."""
        ...

    def op_sequence(
        self, namespace: str, tokens: Sequence[int]
    ) -> AbstractContextManager[Lane | None]:
        """Where the op decodes (under :meth:`op_claim`): None for the backend's working
        sequence, or the lane lent for the op."""
        ...

    def room_for_op(self, need: int) -> None:
        """Make room for ``need`` more cells of the op's sequence next to what is resident."""
        ...


@dataclass(frozen=True, slots=True)
class PipelineTiers:
    """The tiers a request walks, in order. ``results`` and ``kv`` are the owner's own lists,
    not copies: a tier inserted into one is walked from the next request on."""

    results: list[Tier]  # memo, semantic, memory_graph: a hit serves a stored answer
    kv: list[Tier]  # prefix_kv, layer_kv: a hit leaves a reused prefix in the sequence
    prefix: PrefixKVTier | None  # in ``kv`` too; it pins every decode's prompt
    semantic: SemanticTier | None  # in ``results`` too; its query embedding feeds the graph
    graph: MemoryGraph | None  # in ``results`` too; it also surfaces context and records tools


class OpPipeline:
    """Runs ops for an engine: a ``TokenOp`` walks the tiers, then the backend; a ``ToolOp``
    runs its function, memoised when it is read-only. It is handed the backend, the tiers and
    the context's owner at construction; between requests it keeps only that memo."""

    def __init__(
        self,
        backend: OpBackend,
        tiers: PipelineTiers,
        context: ContextOwner,
        *,
        replies: bool = True,
    ) -> None:
        """``replies``: a lane's leftovers include the reply's KV for later ops to start from
        (False: only the exact tokens, :mod:`continuum.backends.exactness`, so a hit on them
        is exactly cold)."""
        self.backend = backend
        self.tiers = tiers
        self.context = context
        self.replies = replies
        self.tool_memo: dict[str, Any] = {}  # read-only tools: key -> value

    def request(
        self,
        namespace: str,
        op_name: str,
        params: GenerationParams,
        tokens: Sequence[int],
        policy: ReusePolicy,
        messages: tuple[Message, ...] | None = None,
        prompt: str | None = None,
        tools: tuple[dict[str, Any], ...] | None = None,
    ) -> TierRequest:
        """A model call as the tiers see it, keyed by its tenant, this pipeline's backend and
        model, the op name, every decode parameter and the prompt tokens."""
        b = self.backend
        key = op_key(
            namespace=namespace,
            backend=b.name,
            model=b.model_identity,
            op_name=op_name,
            params=params,
            tokens=tokens,
        )
        return TierRequest(
            namespace=namespace,
            key=key,
            op_name=op_name,
            params=params,
            tokens=tuple(tokens),
            policy=policy,
            backend=b.name,
            model=b.model_identity,
            messages=messages,
            prompt=prompt,
            tools=tools,
        )

    def run_token(
        self, op: TokenOp, on_text: OnText | None, ns: str, policy: ReusePolicy
    ) -> Result:
        t0 = time.perf_counter()
        b, tiers, context = self.backend, self.tiers, self.context
        _check_capabilities(b, op)
        generate = _generator(b, RequestRoute(ns, op.affinity))
        if not policy.enabled:  # never(): exactly what the backend would see alone
            tokens = b.prompt_tokens(op.messages, op.prompt, tools=op.tools)
            with context.op_claim(), context.op_sequence(ns, ()) as lane:
                if lane is not None:
                    lane.seq.clear()  # nothing reused, nothing left for others
                context.room_for_op(len(tokens) + op.params.max_tokens)
                t_gen = time.perf_counter()
                gen = generate(
                    tokens, op.params, on_text=on_text, messages=op.messages, prompt=op.prompt
                )
            return _result(gen, "cold", (), t0, t_gen)
        req, given = self._requests(op, ns, policy)
        outcomes: list[TierOutcome] = []
        with context.op_claim():
            hit = first_hit(tiers.results, req, outcomes)
            if hit is not None and hit.result is not None:
                if on_text is not None:
                    on_text(hit.result.text)
                return _stored(hit.result, hit.outcome.tier, len(req.tokens), t0, outcomes)
            kv_req, surfaced = self._surface(given, outcomes)
            with context.op_sequence(ns, kv_req.tokens) as lane:
                kv = first_hit(tiers.kv, kv_req, outcomes)
                reuse = kv.reused if kv is not None else 0
                context.room_for_op(len(kv_req.tokens) - reuse + op.params.max_tokens)
                t_gen = time.perf_counter()
                gen = self._generate(generate, kv_req, reuse, on_text)
                if lane is not None:  # its prompt and reply stay there, a prefix for what follows
                    seq = lane.seq
                    lane.exact = _held(seq.tokens, kv_req.tokens) if self.replies else seq.exact
                result = TierResult(gen.text, gen.tokens, gen.finish_reason, len(kv_req.tokens))
                if tiers.prefix is not None:
                    tiers.prefix.record(kv_req, result)
            tier = kv.outcome.tier if kv is not None and gen.reused > 0 else "cold"
            for t in tiers.results:
                t.record(req, result)
        out = _result(gen, tier, tuple(outcomes), t0, t_gen)
        return dataclasses.replace(out, surfaced=surfaced)

    def _requests(
        self, op: TokenOp, ns: str, policy: ReusePolicy
    ) -> tuple[TierRequest, TierRequest]:
        """The op as the result tiers key it (canonical input: a stored answer is found whatever
        the trailing whitespace or argument order), and as the KV tiers and the backend see it:
        the caller's own text, under the same key (DESIGN.md §3.13)."""
        b = self.backend
        msgs = tuple(canonical_messages(op.messages)) if op.messages is not None else None
        prompt = canonical_text(op.prompt) if op.prompt is not None else None
        tokens = b.prompt_tokens(msgs, prompt, tools=op.tools)
        req = self.request(ns, op.op_name, op.params, tokens, policy, msgs, prompt, op.tools)
        raw = tuple(op.messages) if op.messages is not None else None
        if raw == msgs and op.prompt == prompt:
            return req, req
        given = b.prompt_tokens(raw, op.prompt, tools=op.tools)
        return req, dataclasses.replace(req, tokens=tuple(given), messages=raw, prompt=op.prompt)

    def _surface(
        self, req: TierRequest, outcomes: list[TierOutcome]
    ) -> tuple[TierRequest, tuple[ContextItem, ...]]:
        """Prior-run context from the memory graph (never a hit); with ``inject`` it is placed
        before the final turn, and the request the KV tiers and the backend see changes."""
        graph = self.tiers.graph
        if graph is None:
            return req, ()
        vector = None
        looked = req.scratch.get("semantic")
        semantic = self.tiers.semantic
        if (
            looked is not None
            and semantic is not None
            and graph.embedder is not None
            and graph.embedder.identity == semantic.embedder.identity
        ):
            vector = looked[2]
        surfaced = graph.surface_for(req, vector)
        for i, o in enumerate(outcomes):
            if o.tier == graph.name:
                outcomes[i] = dataclasses.replace(o, surfaced=len(surfaced))
        if not (surfaced and graph.inject):
            return req, surfaced
        msgs, prompt = with_context(req.messages, req.prompt, surfaced)
        tokens = tuple(self.backend.prompt_tokens(msgs, prompt, tools=req.tools))
        return dataclasses.replace(req, tokens=tokens, messages=msgs, prompt=prompt), surfaced

    def _generate(
        self,
        generate: Callable[..., Generation],
        req: TierRequest,
        reuse: int,
        on_text: OnText | None,
    ) -> Generation:
        prefix = self.tiers.prefix
        while True:
            try:
                return generate(
                    req.tokens,
                    req.params,
                    reuse=reuse,
                    on_text=on_text,
                    messages=req.messages,
                    prompt=req.prompt,
                )
            except KVCacheFull:
                # free the least recently used pinned prefix (spilled to layer KV) and retry;
                # the working sequence keeps what it holds (cells are shared, not owned)
                if prefix is None or not len(prefix):
                    raise
                prefix.trie.evict_lru()
                reuse = 0  # the failed decode truncated the working sequence: start clean

    # -- tools -------------------------------------------------------------------------------
    def run_tool(self, op: ToolOp, ns: str, policy: ReusePolicy) -> Result:
        """Run a tool: its function runs on the caller's thread with nothing held (a tool that
        blocks or hangs holds up no session and no op); the memo and the graph are read and
        written under the context guard, as every tier is."""
        t0 = time.perf_counter()
        key = None
        if op.read_only and policy.enabled:
            key = tool_key(ns, op.name, dict(op.args))
            with self.context.claim():
                memoised = self.tool_memo.get(key, _NONE)
            if memoised is not _NONE:
                return _tool_result(memoised, "memo", t0)
        value = op.fn(**op.args)  # side effects: runs every time (errors are not cached)
        if key is not None:
            canonical_json(value)  # only JSON-serialisable results may be memoised
        with self.context.claim():
            if key is not None:
                self.tool_memo[key] = value
            if self.tiers.graph is not None and policy.enabled:
                _record_tool(self.tiers.graph, op, value, ns)
        return _tool_result(value, "tool", t0)


def _held(held: list[int], prompt: Sequence[int]) -> int:
    """How much of what a lane holds later ops may start from: the prompt and the reply's
    tokens as decoded (the next call of an agent loop sends that reply back), as the prefix
    tier pins them in its slots."""
    n = len(prompt)
    return len(held) if held[:n] == list(prompt) else 0


def _check_capabilities(b: OpBackend, op: TokenOp) -> None:
    if op.tools and not b.capabilities.renders_tools:
        raise InvalidRequest(
            f"backend {b.name!r} cannot render tools into the prompt: tool calling needs the "
            "in-process llamacpp backend"
        )
    if op.params.constraint is not None and not b.capabilities.constrained:
        raise InvalidRequest(
            f"backend {b.name!r} cannot constrain its output (response_format, or a forced "
            "tool_choice): use the in-process llamacpp backend, or drop the constraint"
        )


def _generator(b: OpBackend, route: RequestRoute) -> Callable[..., Generation]:
    """``b.generate``, with the op's route bound when the backend takes one."""
    if b.capabilities.routed and isinstance(b, RoutedBackend):
        return functools.partial(b.generate, route=route)
    return b.generate


def _result(
    gen: Generation,
    tier: str,
    outcomes: tuple[TierOutcome, ...],
    t0: float,
    t_gen: float,
) -> Result:
    # TTFT runs from the op's start: rendering, lookups and any restore are included
    m = Metrics(
        hit_tier=tier,
        prompt_tokens=gen.prompt_tokens,
        prompt_tokens_evaluated=gen.evaluated,
        tokens_reused=gen.reused,
        reuse_known=gen.reused_known,
        completion_tokens=len(gen.tokens),
        backend_called=True,
        lookup_ms=(t_gen - t0) * 1000,
        ttft_ms=(t_gen - t0) * 1000 + gen.ttft_ms,
        total_ms=(time.perf_counter() - t0) * 1000,
        tiers=outcomes,
    )
    return Result(gen.text, gen.tokens, gen.finish_reason, m)


def _stored(
    result: TierResult, tier: str, n_prompt: int, t0: float, outcomes: list[TierOutcome]
) -> Result:
    """A result served from a tier: no backend call, every prompt token saved."""
    ms = (time.perf_counter() - t0) * 1000
    m = Metrics(
        hit_tier=tier,
        prompt_tokens=n_prompt,
        tokens_reused=n_prompt,
        completion_tokens=len(result.tokens),
        lookup_ms=ms,
        ttft_ms=ms,
        total_ms=ms,
        tiers=tuple(outcomes),
    )
    return Result(result.text, result.tokens, result.finish_reason, m)


def _tool_result(value: Any, tier: str, t0: float) -> Result:
    """A tool run (``tool``) or its read-only result served from the memo (``memo``)."""
    ms = (time.perf_counter() - t0) * 1000
    lookup = ms if tier == "memo" else 0.0
    m = Metrics(hit_tier=tier, lookup_ms=lookup, ttft_ms=ms, total_ms=ms)
    return Result("", (), "tool", m, value=value)


def _record_tool(graph: MemoryGraph, op: ToolOp, value: Any, ns: str) -> None:
    try:
        key = tool_key(ns, op.name, dict(op.args))
    except TypeError:
        return  # arguments that are not JSON cannot be identified across runs: not recorded
    try:
        output_text(value)
    except TypeError:
        value = repr(value)
    graph.record_tool(ns, key, op.name, dict(op.args), value)
