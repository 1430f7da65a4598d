"""The memory graph: what prior runs did, queried once per op.

Every op and tool call of a run is recorded as it happens (:mod:`continuum.store.graph` has the
node and edge kinds): the op with its canonical key and the embedding of its final user turn,
its result, each tool call and its result, the entities they mention, and ``used`` edges from an
op to every earlier output of the same run that appears verbatim in its input (a tool result
pasted into a message, an earlier op's answer quoted in a later prompt).

One query per op gives one of two things, never both, and they are counted apart:

**hit** — the op is answered from the graph with no backend call. All of these must hold:
  1. a prior op in the same namespace has exactly the same canonical op key (namespace, backend,
     model digest, op name, every decode parameter, canonical tokens) and is deterministic (or
     the policy opts into nondeterministic reuse);
  2. it is not stale, and
  3. every tool result it depended on — transitively, through ``used`` edges into earlier
     results — has been observed again *in the current run* with the same digest.
  An op that depended on no tool result is a pure function of its key, so 1 and 2 suffice.
  This is how an answer crosses a process boundary safely: the memo is version-bumped on resume
  (DESIGN.md §3.10) because its entries carry no dependencies; graph entries do, and are checked.

**surfaced context** — prior, non-stale ops of *other* runs in the same namespace that are
related: the cosine of the two final user turns' embeddings is at least ``min_similarity``
(0.5), or the new turn shares at least ``min_shared`` (2) entities with the op's question or
answer. Related items are ranked by

    score = cosine (0 without an embedder) + 0.15 x shared entities (at most 3) + 0.05 x recency

where recency is 1 for a run started now and halves every day; the best ``k`` are returned.
They are attached to the op's result; they enter the prompt only when ``inject=True`` (a system
message before the final user turn). The op is still recorded and memoised under the key of the
request as it was made; the prompt tiers (prefix/layer KV) work on the augmented prompt, which
is what the model saw. Surfacing never counts as a hit.

Invalidation: when a tool call (same namespace, tool name and canonical arguments) returns a
result whose digest differs from an earlier observation, every node that transitively used the
earlier result — ops and their results, through any number of ``used`` hops — is marked stale.
Stale nodes are never served and never surfaced.

Each op and each tool call is recorded in one store transaction, all of it or nothing; an op
without exactly one complete result (an older continuum's crash) is skipped by every lookup. The
store is a SQLite file or, for a fleet, Redis. A store that fails — unreachable, refusing an
operation, holding a node it cannot read — costs reuse, never requests: the lookup misses with
the reason, the record is skipped, and both are logged and counted (``store_errors``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import field_validator

from continuum.backends.embedders import Embedder
from continuum.errors import EmbeddingError, InvalidRequest, StoreError, StoreUnavailable
from continuum.hashing import digest
from continuum.metrics import TierOutcome
from continuum.results import ContextItem
from continuum.settings import Settings, fspath, setting
from continuum.store.graph import GraphLog, NewNode, Node, NodeQuery
from continuum.store.stores import StoreAddress
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss
from continuum.tiers.graph_text import (
    context_message,
    graph_query,
    input_text,
    mentions,
    output_text,
    renderings,
    with_context,
)
from continuum.tiers.graph_walk import complete_result, dependents, unconfirmed, used_edges

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GraphAnswer:
    outcome: str  # hit | stale | unverified | miss
    node: Node | None = None
    text: str = ""
    tokens: tuple[int, ...] = ()
    finish_reason: str = ""
    prompt_tokens: int = 0
    unconfirmed: tuple[str, ...] = ()  # tool keys not observed again in this run


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One op as the graph records it: its key, what it was asked and what it returned.

    ``query`` is the final user turn (embedded, and searched for entities); ``input_text`` is
    the whole input, searched for earlier outputs of the run that it used. ``vector`` is the
    query's embedding when another tier already made it with the graph's embedder."""

    namespace: str
    key: str
    op_name: str
    query: str
    input_text: str
    result: TierResult
    deterministic: bool
    vector: np.ndarray | None = None


@dataclass
class GraphStats:
    hits: int = 0
    stale: int = 0
    unverified: int = 0
    misses: int = 0
    surfaced_ops: int = 0  # ops that got surfaced context (never hits)
    surfaced_items: int = 0
    near_misses: int = 0  # prior ops within 0.1 below min_similarity, not surfaced
    invalidated: int = 0  # nodes marked stale by a changed tool result
    store_errors: int = 0  # lookups and records skipped: the store failed (see _degraded)
    lookup_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        ms = sorted(self.lookup_ms)
        return {
            "hits": self.hits,
            "stale_rejections": self.stale,
            "unverified": self.unverified,
            "misses": self.misses,
            "surfaced_ops": self.surfaced_ops,
            "surfaced_items": self.surfaced_items,
            "near_misses": self.near_misses,
            "invalidated": self.invalidated,
            "store_errors": self.store_errors,
            "lookup_ms_median": ms[len(ms) // 2] if ms else 0.0,
        }


class GraphSettings(Settings):
    """Where the server's memory graph lives, if it has one."""

    graph: str | None = setting(
        None,
        "Memory graph for the reuse stack: a SQLite file, or redis://host:port[/db][?prefix=] "
        "for one graph every worker of a fleet shares.",
    )

    _path = field_validator("graph", mode="before")(fspath)

    def address(self) -> StoreAddress | None:
        """The graph's address; a malformed URL is refused here."""
        return StoreAddress.parse(self.graph) if self.graph else None

    def check(self) -> None:
        self.address()
        super().check()


class MemoryGraph:
    name = "memory_graph"

    def __init__(
        self,
        path: str | Path | StoreAddress | GraphLog,
        *,
        embedder: Embedder | None = None,
        k: int = 3,
        min_similarity: float = 0.5,
        min_shared: int = 2,
        inject: bool = False,
    ) -> None:
        self.store = path if isinstance(path, GraphLog) else StoreAddress.parse(path).graph()
        self.embedder = embedder
        self.k = k
        self.min_similarity = min_similarity
        self.min_shared = min_shared
        self.inject = inject
        self.counts = GraphStats()
        self._runs: dict[str, int] = {}

    def close(self) -> None:
        self.store.close()

    # -- the Tier protocol ---------------------------------------------------------------------
    def _degraded(self, what: str, e: StoreError) -> str:
        """Count and log a store failure (it costs reuse, not the request); the miss reason."""
        self.counts.store_errors += 1
        if isinstance(e, StoreUnavailable):
            log.warning("memory graph: %s skipped, the store is unreachable (%s)", what, e)
            return "store_unavailable"
        log.warning("memory graph: %s skipped, the store failed (%s)", what, e)
        return "store_error"

    def lookup(self, request: TierRequest) -> Hit | Miss:
        """A verified answer from a prior run (see the module docstring for the rules)."""
        blocked = request.serve_blocked()
        if blocked:
            return miss(self.name, "skipped", blocked)
        try:
            found = self.answer(
                request.namespace, request.key, nondeterministic=request.policy.nondeterministic
            )
        except StoreError as e:
            return miss(self.name, "skipped", self._degraded("lookup", e))
        outcome = TierOutcome(self.name, found.outcome)
        if found.outcome != "hit":
            return Miss(outcome)
        result = TierResult(found.text, found.tokens, found.finish_reason, len(request.tokens))
        return Hit(outcome, result)

    def record(self, request: TierRequest, result: TierResult) -> None:
        query = graph_query(request.messages, request.prompt)
        if not request.policy.enabled or not query:
            return
        try:
            self._record(request, result, query)
        except StoreError as e:
            self._degraded("record", e)

    def _record(self, request: TierRequest, result: TierResult, query: str) -> None:
        op = OpRecord(
            request.namespace,
            request.key,
            op_name=request.op_name,
            query=query,
            input_text=input_text(request.messages, request.prompt),
            result=result,
            deterministic=request.params.deterministic,
            vector=request.scratch.get("graph_vector"),
        )
        self.record_op(op)

    def stats(self) -> dict[str, Any]:
        return self.counts.as_dict()

    def surface_for(
        self, request: TierRequest, vector: np.ndarray | None
    ) -> tuple[ContextItem, ...]:
        """Prior-run context for ``request`` (never a hit). ``vector`` is the final turn's
        embedding when another tier computed it with this graph's embedder."""
        query = graph_query(request.messages, request.prompt)
        if not request.policy.enabled or not query:
            return ()
        if vector is None:
            vector = self.embed_query(query)
        request.scratch["graph_vector"] = vector
        try:
            return tuple(self.surface(request.namespace, query, vector))
        except StoreError as e:
            self._degraded("surfacing", e)
            return ()

    def run_id(self, namespace: str, label: str = "") -> int:
        """This process's run for ``namespace`` (started on first use)."""
        if namespace not in self._runs:
            self._runs[namespace] = self.store.add_run(namespace, label)
        return self._runs[namespace]

    def new_run(self, namespace: str, label: str = "") -> int:
        """Start a new run for ``namespace`` (e.g. the next task of a long-lived agent)."""
        self._runs[namespace] = self.store.add_run(namespace, label)
        return self._runs[namespace]

    # -- tools -------------------------------------------------------------------------------------
    def record_tool(self, namespace: str, tool_key: str, name: str, args: Any, value: Any) -> int:
        """Record a tool call and its result; invalidate what used an earlier, different result.
        Returns the number of nodes newly marked stale. With the store unreachable nothing is
        recorded (0): an op that used the result is unverified in this run, so never served.
        The same when the store fails otherwise (:class:`StoreError`)."""
        try:
            return self._record_tool(namespace, tool_key, name, args, value)
        except StoreError as e:
            self._degraded("tool record", e)
            return 0

    def _record_tool(self, namespace: str, tool_key: str, name: str, args: Any, value: Any) -> int:
        run = self.run_id(namespace)  # before the transaction: a rollback must not undo it
        text = output_text(value)
        h = digest(text.encode(), person=b"cont-toolres")
        changed = 0
        with self.store.transaction():
            earlier = self.store.nodes(
                NodeQuery(namespace, kinds=("tool_result",), key=tool_key, hash_not=h)
            )
            call = self.store.add_node(
                NewNode("tool_call", namespace, run, tool_key, label=name, text=output_text(args))
            )
            res = self.store.add_node(
                NewNode(
                    "tool_result",
                    namespace,
                    run,
                    tool_key,
                    label=name,
                    text=text,
                    hash=h,
                    meta={"forms": renderings(value)},
                )
            )
            self.store.add_edges([(call, res, "produced")])
            self._mention(namespace, res, text)
            for old in earlier:
                changed += self.store.mark_stale(
                    dependents(self.store, old.id), f"tool {name} returned a different result"
                )
        self.counts.invalidated += changed
        return changed

    # -- ops ---------------------------------------------------------------------------------------
    def record_op(self, op: OpRecord) -> int:
        """Record ``op`` and its result in one transaction; the op node's id."""
        # the run and the embedding outside the transaction: a rolled-back run id would stay
        # cached, and the write lock is not held while the embedder works
        run, result = self.run_id(op.namespace), op.result
        vector = self._embed(op.query) if op.vector is None else op.vector
        with self.store.transaction():
            op_id = self.store.add_node(
                NewNode(
                    "op",
                    op.namespace,
                    run,
                    op.key,
                    label=op.op_name,
                    text=op.query,
                    meta={"deterministic": op.deterministic, "prompt_tokens": result.prompt_tokens},
                    embedding=vector,
                    embedder=self.embedder.identity if self.embedder and vector is not None else "",
                )
            )
            res = self.store.add_node(
                NewNode(
                    "result",
                    op.namespace,
                    run,
                    op.key,
                    label=op.op_name,
                    text=result.text,
                    hash=digest(result.text.encode(), person=b"cont-result"),
                    meta={"tokens": list(result.tokens), "finish_reason": result.finish_reason},
                )
            )
            used = used_edges(self.store, run, op_id, op.input_text)
            self.store.add_edges([(op_id, res, "produced"), *used])
            self._mention(op.namespace, op_id, op.query)
            self._mention(op.namespace, res, result.text)
        return op_id

    def _mention(self, namespace: str, node: int, text: str) -> None:
        self.store.add_edges(
            (node, self.store.entity(namespace, name), "mentions")
            for name in sorted(mentions(text))
        )

    def embed_query(self, text: str) -> np.ndarray | None:
        return self._embed(text)

    def _embed(self, text: str) -> np.ndarray | None:
        if self.embedder is None or not text.strip():
            return None
        try:
            vector: np.ndarray = self.embedder.embed([text])[0]
            return vector
        except EmbeddingError:
            return None

    def answer(self, namespace: str, key: str, *, nondeterministic: bool = False) -> GraphAnswer:
        """Whether a prior op answers op ``key`` now (see the module docstring for the rules)."""
        t0 = time.perf_counter()
        result = self._answer(namespace, key, nondeterministic)
        self.counts.lookup_ms.append((time.perf_counter() - t0) * 1000)
        if result.outcome == "hit":
            self.counts.hits += 1
        elif result.outcome == "stale":
            self.counts.stale += 1
        elif result.outcome == "unverified":
            self.counts.unverified += 1
        else:
            self.counts.misses += 1
        return result

    def _answer(self, namespace: str, key: str, nondeterministic: bool) -> GraphAnswer:
        run = self.run_id(namespace)
        ops = self.store.nodes(NodeQuery(namespace, kinds=("op",), key=key, newest_first=True))
        results = {
            o.id: res
            for o in ops
            if (o.meta.get("deterministic") or nondeterministic)
            and (res := complete_result(self.store, o)) is not None
        }
        ops = [o for o in ops if o.id in results]
        if not ops:
            return GraphAnswer("miss")
        fresh = [o for o in ops if not o.stale]
        if not fresh:
            return GraphAnswer("stale", ops[0])
        first_missing: tuple[str, ...] = ()
        for op in fresh:
            missing = unconfirmed(self.store, op, run)
            if missing:
                first_missing = first_missing or missing
                continue
            res = results[op.id]
            return GraphAnswer(
                "hit",
                op,
                res.text,
                tuple(res.meta.get("tokens", ())),
                str(res.meta.get("finish_reason", "stop")),
                int(op.meta.get("prompt_tokens", 0)),
            )
        return GraphAnswer("unverified", fresh[0], unconfirmed=first_missing)

    # -- surfacing -------------------------------------------------------------------------------
    def surface(
        self, namespace: str, query: str, vector: np.ndarray | None = None
    ) -> list[ContextItem]:
        """Prior context for an op whose final user turn is ``query``."""
        if not isinstance(query, str):
            raise InvalidRequest("surface() takes the op's final user turn as a string")
        t0 = time.perf_counter()
        run = self.run_id(namespace)
        if vector is None:
            vector = self._embed(query)
        names = sorted(mentions(query))
        by_entity: dict[int, set[str]] = {}
        for node, shared in self.store.entity_neighbours(namespace, names).items():
            # a result's mentions count for the op that produced it
            owner = self.store.sources(node, "produced") or [node]
            by_entity.setdefault(owner[0], set()).update(shared)
        ops = self.store.nodes(NodeQuery(namespace, kinds=("op",), fresh=True, run_not=run))
        started = {rid: ts for rid, _, ts in self.store.runs(namespace)}
        now = time.time()
        items = []
        for op in ops:
            sim = None
            if (
                vector is not None
                and op.embedding is not None
                and self.embedder is not None
                and op.embedder == self.embedder.identity
            ):
                sim = float(op.embedding @ vector)
            names_shared = tuple(sorted(by_entity.get(op.id, ())))
            age_days = (now - started.get(op.run_id or 0, now)) / 86400
            if (sim is None or sim < self.min_similarity) and len(names_shared) < self.min_shared:
                if sim is not None and sim >= self.min_similarity - 0.1:
                    self.counts.near_misses += 1
                continue
            bonus = 0.15 * min(len(names_shared), 3) + 0.05 * math.pow(0.5, age_days)
            score = (sim or 0.0) + bonus
            res = complete_result(self.store, op)
            if res is None or res.stale:
                continue
            items.append(
                ContextItem(op.id, op.run_id or 0, op.text, res.text, score, sim, names_shared)
            )
        items.sort(key=lambda i: -i.score)
        items = items[: self.k]
        self.counts.lookup_ms.append((time.perf_counter() - t0) * 1000)
        if items:
            self.counts.surfaced_ops += 1
            self.counts.surfaced_items += len(items)
        return items


__all__ = [
    "ContextItem",
    "GraphAnswer",
    "MemoryGraph",
    "OpRecord",
    "context_message",
    "mentions",
    "output_text",
    "with_context",
]
