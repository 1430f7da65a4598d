"""``Session``: every op walks the reuse tiers in order and stops at the first hit.

    memo -> semantic -> memory_graph (answer) -> prefix_kv -> layer_kv -> cold
                        memory_graph (surfaced context, passed into the call)

Only a cold call (or the suffix after a KV hit) reaches the backend; its result populates the
tiers. A ``ToolOp`` always runs, unless its tool is declared read-only; every tool run is
recorded in the memory graph, where a changed result invalidates what used the old one.

The semantic tier and the memory graph are optional (``Session(..., semantic=SemanticTier(...),
graph=MemoryGraph(...))``). The graph is queried once, before any KV work, and differs from
DESIGN.md's listing order on purpose: a verified answer from it costs no backend call, so it is
tried before spending a prefill; and context it surfaces with ``inject=True`` changes the prompt,
so it must be in place before the prefix tiers match tokens. Surfaced context is never a hit.

Correctness rules this module enforces:
- The policy is checked by every tier; ``ReusePolicy.never()`` bypasses all of them and sends
  the backend exactly the op as given (no canonicalisation, no reused state, nothing stored).
- A KV handle is used only for a prefix it provably holds: the trie key is the handle's own
  token sequence, the handle's hash is re-derived from it, and only the common prefix with the
  query is claimed (DESIGN.md §3.5).
- At least ``min_suffix`` (8) tokens are always decoded after a reused prefix. llama.cpp's
  kernels for batches of 8+ tokens give bit-identical results however a prompt is chunked (its
  1-7-token path does not), so a prefix or snapshot hit produces exactly the tokens a cold call
  would (§3.4).
- A snapshot that fails its checks is dropped and counted, and the op falls through to cold.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from continuum.backends.models import cache_dir
from continuum.backends.registry import BackendRegistry, Generation, OpBackend
from continuum.errors import InvalidRequest, KVCacheFull, MetadataError, SnapshotError
from continuum.hashing import canonical_json
from continuum.keys import OpKey, canonical_messages, canonical_text, op_key, tool_key
from continuum.messages import Message
from continuum.ops import TokenOp, ToolOp
from continuum.policy import ReusePolicy
from continuum.store import cache_meta
from continuum.tiers.layer_kv import LayerKVTier, decode_snapshot, encode_snapshot
from continuum.tiers.memo import MemoEntry, MemoTier
from continuum.tiers.memory_graph import ContextItem, MemoryGraph, context_message, output_text
from continuum.tiers.prefix_kv import RadixTrie
from continuum.tiers.semantic import SemanticEntry, SemanticLookup, SemanticTier, split_query
from continuum.tiers.state import BackendState, StateKind, prefix_hash

TIERS = ("memo", "semantic", "prefix_kv", "layer_kv", "memory_graph", "cold")


@runtime_checkable
class KVBackend(Protocol):
    """A backend whose KV state the prefix and layer tiers can pin, copy and snapshot."""

    n_slots: int

    def free_slots(self) -> int: ...
    def pin(self, n_tokens: int) -> int | None: ...
    def release(self, slot: int) -> None: ...
    def load_slot(self, slot: int, n_tokens: int) -> None: ...
    def slot_tokens(self, slot: int) -> list[int]: ...
    def snapshot(self, slot: int) -> bytes: ...
    def restore(self, payload: bytes, tokens: Sequence[int], n_tokens: int) -> None: ...
    def context_config(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class OpMetrics:
    hit_tier: str  # memo | semantic | memory_graph | prefix_kv | layer_kv | cold | tool
    prompt_tokens: int
    tokens_sent: int  # prompt tokens the backend evaluated for this op
    tokens_saved: int  # prompt tokens it did not evaluate thanks to reuse
    backend_called: bool
    lookup_ms: float
    ttft_ms: float
    total_ms: float
    restored_from: str = ""  # layer_kv hits: "ram" or "disk"
    tokens_saved_known: bool = True  # False: a remote server did not report cached tokens
    snapshot_errors: int = 0  # snapshots found corrupt or incompatible (fell through)
    semantic: str = ""  # the semantic lookup's outcome (hit, near_miss, guard_rejected, ...)
    semantic_score: float | None = None  # its best candidate's cosine
    graph: str = ""  # the memory graph's answer outcome (hit, stale, unverified, miss)
    graph_surfaced: int = 0  # prior-run items surfaced as context (never a hit)


@dataclass(frozen=True, slots=True)
class OpResult:
    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    metrics: OpMetrics
    value: Any = None  # a ToolOp's return value
    surfaced: tuple[ContextItem, ...] = ()  # prior-run context from the memory graph


@dataclass
class SessionStats:
    ops: int = 0
    backend_calls: int = 0
    calls_eliminated: int = 0
    tokens_sent: int = 0
    tokens_saved: int = 0
    tool_runs: int = 0
    snapshot_errors: int = 0
    hits: Counter[str] = field(default_factory=Counter)
    lookup_ms: list[float] = field(default_factory=list)

    def record(self, m: OpMetrics) -> None:
        self.ops += 1
        self.hits[m.hit_tier] += 1
        self.tokens_sent += m.tokens_sent
        self.tokens_saved += m.tokens_saved
        self.snapshot_errors += m.snapshot_errors
        if m.backend_called:
            self.backend_calls += 1
        elif m.hit_tier != "tool":
            self.calls_eliminated += 1
        if m.hit_tier == "tool":
            self.tool_runs += 1
        self.lookup_ms.append(m.lookup_ms)

    def hit_rate(self) -> float:
        model_ops = self.ops - self.hits["tool"]
        reused = sum(n for t, n in self.hits.items() if t not in ("cold", "tool"))
        return reused / model_ops if model_ops else 0.0


@dataclass(frozen=True)
class EngineConfig:
    memo_capacity: int = 10_000
    layer_ram_bytes: int = 256 << 20
    snapshot_dir: Path | None = None  # None: <cache dir>/snapshots; layer KV on disk there
    min_suffix: int = 8


class Session:
    """A namespace (tenant) running ops through the reuse stack over one backend."""

    def __init__(
        self,
        namespace: str,
        registry: BackendRegistry | None = None,
        *,
        backend: str = "llamacpp",
        config: EngineConfig | None = None,
        semantic: SemanticTier | None = None,
        graph: MemoryGraph | None = None,
        **backend_options: Any,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest(f"namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace
        self.registry = registry or BackendRegistry()
        self.backend_name = backend
        if backend not in self.registry.names():
            self.registry.create(backend)  # raises UnknownBackend with the known names
        self.config = config or EngineConfig()
        self._options = backend_options
        self._backend: OpBackend | None = None
        self._policy = ReusePolicy.always()
        self.memo = MemoTier(self.config.memo_capacity)
        self.layer = LayerKVTier(
            ram_budget_bytes=self.config.layer_ram_bytes,
            directory=self.config.snapshot_dir or cache_dir() / "snapshots",
        )
        if semantic is not None and not isinstance(semantic, SemanticTier):
            raise InvalidRequest("semantic= takes a SemanticTier(embedder, ...)")
        if graph is not None and not isinstance(graph, MemoryGraph):
            raise InvalidRequest("graph= takes a MemoryGraph(path, ...)")
        self.semantic = semantic
        self.graph = graph
        self.prefix: RadixTrie[BackendState] | None = None
        self._tool_memo: dict[OpKey, Any] = {}
        self.stats = SessionStats()
        self._lock = threading.RLock()

    # -- configuration -----------------------------------------------------------------------
    @property
    def policy(self) -> ReusePolicy:
        return self._policy

    @policy.setter
    def policy(self, value: ReusePolicy) -> None:
        if not isinstance(value, ReusePolicy):
            raise InvalidRequest("policy must be ReusePolicy.always(), .never() or .threshold()")
        self._policy = value

    @property
    def backend(self) -> OpBackend:
        if self._backend is None:
            self._backend = self.registry.create(self.backend_name, **self._options)
            kv = self._backend if isinstance(self._backend, KVBackend) else None
            if kv is not None and kv.n_slots > 0:
                self.prefix = RadixTrie(kv.n_slots, on_evict=self._spill)
        return self._backend

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None
                self.prefix = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ops ---------------------------------------------------------------------------
    def run(
        self,
        op: TokenOp | ToolOp,
        on_text: Callable[[str], None] | None = None,
        *,
        namespace: str | None = None,
    ) -> OpResult:
        """Run ``op`` through the tiers. ``namespace`` overrides the session's tenant for this op
        (a server serving several tenants over one backend); tiers are partitioned by it."""
        ns = self.namespace if namespace is None else namespace
        if not isinstance(ns, str) or not ns:
            raise InvalidRequest(f"namespace must be a non-empty string, got {ns!r}")
        with self._lock:
            if isinstance(op, ToolOp):
                result = self._run_tool(op, ns)
            elif isinstance(op, TokenOp):
                result = self._run_token(op, on_text, ns)
            else:
                raise InvalidRequest(f"run() takes a TokenOp or ToolOp, got {type(op).__name__}")
            self.stats.record(result.metrics)
            return result

    def _run_tool(self, op: ToolOp, ns: str) -> OpResult:
        t0 = time.perf_counter()
        key = None
        if op.read_only and self._policy.enabled:
            key = tool_key(ns, op.name, dict(op.args))
            if key in self._tool_memo:
                ms = (time.perf_counter() - t0) * 1000
                m = OpMetrics("memo", 0, 0, 0, False, ms, ms, ms)
                return OpResult("", (), "tool", m, self._tool_memo[key])
        value = op.fn(**op.args)  # side effects: runs every time (errors are not cached)
        if key is not None:
            canonical_json(value)  # only JSON-serialisable results may be memoised
            self._tool_memo[key] = value
        if self.graph is not None and self._policy.enabled:
            self._record_tool(op, value, ns)
        ms = (time.perf_counter() - t0) * 1000
        return OpResult("", (), "tool", OpMetrics("tool", 0, 0, 0, False, 0.0, ms, ms), value)

    def _run_token(self, op: TokenOp, on_text: Callable[[str], None] | None, ns: str) -> OpResult:
        t0 = time.perf_counter()
        b = self.backend
        if not self._policy.enabled:  # never(): exactly what the backend would see alone
            tokens = b.prompt_tokens(op.messages, op.prompt)
            t_gen = time.perf_counter()
            gen = b.generate(
                tokens, op.params, on_text=on_text, messages=op.messages, prompt=op.prompt
            )
            return self._result(gen, "cold", 0.0, t0, t_gen)
        msgs = canonical_messages(op.messages) if op.messages is not None else None
        prompt = canonical_text(op.prompt) if op.prompt is not None else None
        tokens = b.prompt_tokens(msgs, prompt)
        key = op_key(
            namespace=ns,
            backend=b.name,
            model=b.model_identity,
            op_name=op.op_name,
            params=op.params,
            tokens=tokens,
        )
        serve = self._policy.allows_result(len(tokens), op.params.deterministic)
        if serve:
            entry = self.memo.get(key)
            if entry is not None:
                if on_text is not None:
                    on_text(entry.text)
                return self._stored(entry, "memo", len(tokens), t0)
        context, query = split_query(msgs, prompt)
        sem: SemanticLookup | None = None
        partition = ""
        if self.semantic is not None and serve:
            if context is None:
                sem = self.semantic.ineligible(query)
            else:
                partition = self.semantic.partition(
                    namespace=ns,
                    backend=b.name,
                    model=b.model_identity,
                    op_name=op.op_name,
                    params=op.params,
                    context=context,
                )
                sem = self.semantic.lookup(partition, query)
                if sem.entry is not None and sem.outcome == "hit":
                    if on_text is not None:
                        on_text(sem.entry.text)
                    return self._stored(sem.entry, "semantic", len(tokens), t0, sem=sem)
        surfaced: tuple[ContextItem, ...] = ()
        graph_outcome = ""
        graph_query = query if context is not None else _last_text(msgs, prompt)
        vector = None
        if (
            sem is not None
            and self.graph is not None
            and self.graph.embedder is not None
            and self.graph.embedder.identity == self.semantic_identity()
        ):
            vector = sem.vector
        if self.graph is not None:
            if serve:
                answer = self.graph.answer(ns, key, nondeterministic=self._policy.nondeterministic)
                graph_outcome = answer.outcome
                if answer.outcome == "hit":
                    if on_text is not None:
                        on_text(answer.text)
                    hit = MemoEntry(
                        key, 0, answer.text, answer.tokens, answer.finish_reason, len(tokens)
                    )
                    return self._stored(hit, "memory_graph", len(tokens), t0, graph="hit")
            if graph_query:
                if vector is None:
                    vector = self.graph.embed_query(graph_query)
                surfaced = tuple(self.graph.surface(ns, graph_query, vector))
            if surfaced and self.graph.inject:
                msgs, prompt = _with_context(msgs, prompt, surfaced)
                tokens = b.prompt_tokens(msgs, prompt)
        tier, reuse, source, errors = self._restore_kv(b, tokens, ns)
        t_gen = time.perf_counter()
        lookup_ms = (t_gen - t0) * 1000
        gen = self._generate(b, tokens, op, reuse, on_text, msgs, prompt)
        if gen.reused == 0 and isinstance(b, KVBackend):
            tier = "cold"  # a KV-full retry started over
        self.memo.put(
            MemoEntry(key, self.memo.version, gen.text, gen.tokens, gen.finish_reason, len(tokens))
        )
        if self.semantic is not None and sem is not None and sem.vector is not None:
            self.semantic.put(
                partition,
                query,
                sem.vector,
                text=gen.text,
                tokens=gen.tokens,
                finish_reason=gen.finish_reason,
                prompt_tokens=len(tokens),
            )
        if self.graph is not None and graph_query:
            self.graph.record_op(
                ns,
                key,
                op_name=op.op_name,
                query=graph_query,
                input_text=_all_text(op.messages, op.prompt),
                text=gen.text,
                tokens=gen.tokens,
                finish_reason=gen.finish_reason,
                prompt_tokens=len(tokens),
                deterministic=op.params.deterministic,
                vector=vector,
            )
        if isinstance(b, KVBackend):
            self._pin(b, tokens, ns)
        result = self._result(gen, tier, lookup_ms, t0, t_gen, source, errors)
        m = result.metrics
        extra = {
            "semantic": sem.outcome if sem is not None else "",
            "semantic_score": sem.score if sem is not None else None,
            "graph": graph_outcome,
            "graph_surfaced": len(surfaced),
        }
        return OpResult(
            result.text,
            result.tokens,
            result.finish_reason,
            OpMetrics(**{**_fields(m), **extra}),
            surfaced=surfaced,
        )

    def semantic_identity(self) -> str:
        return self.semantic.embedder.identity if self.semantic is not None else ""

    def _stored(
        self,
        entry: MemoEntry | SemanticEntry,
        tier: str,
        n_prompt: int,
        t0: float,
        *,
        sem: SemanticLookup | None = None,
        graph: str = "",
    ) -> OpResult:
        """A result served from a tier: no backend call, every prompt token saved."""
        ms = (time.perf_counter() - t0) * 1000
        m = OpMetrics(
            tier,
            n_prompt,
            0,
            n_prompt,
            False,
            ms,
            ms,
            ms,
            semantic=sem.outcome if sem is not None else "",
            semantic_score=sem.score if sem is not None else None,
            graph=graph,
        )
        return OpResult(entry.text, entry.tokens, entry.finish_reason, m)

    def _record_tool(self, op: ToolOp, value: Any, ns: str) -> None:
        assert self.graph is not None
        try:
            key = tool_key(ns, op.name, dict(op.args))
        except TypeError:
            return  # arguments that are not JSON cannot be identified across runs: not recorded
        try:
            output_text(value)
        except TypeError:
            value = repr(value)
        self.graph.record_tool(ns, key, op.name, dict(op.args), value)

    def _result(
        self,
        gen: Generation,
        tier: str,
        lookup_ms: float,
        t0: float,
        t_gen: float,
        source: str = "",
        errors: int = 0,
    ) -> OpResult:
        # TTFT runs from the op's start: rendering, lookups and any restore are included
        m = OpMetrics(
            hit_tier=tier,
            prompt_tokens=gen.prompt_tokens,
            tokens_sent=gen.evaluated,
            tokens_saved=gen.reused,
            backend_called=True,
            lookup_ms=lookup_ms,
            ttft_ms=(t_gen - t0) * 1000 + gen.ttft_ms,
            total_ms=(time.perf_counter() - t0) * 1000,
            restored_from=source,
            tokens_saved_known=gen.reused_known,
            snapshot_errors=errors,
        )
        return OpResult(gen.text, gen.tokens, gen.finish_reason, m)

    def _generate(
        self,
        b: OpBackend,
        tokens: list[int],
        op: TokenOp,
        reuse: int,
        on_text: Callable[[str], None] | None,
        msgs: Sequence[Message] | None,
        prompt: str | None,
    ) -> Generation:
        while True:
            try:
                return b.generate(
                    tokens, op.params, reuse=reuse, on_text=on_text, messages=msgs, prompt=prompt
                )
            except KVCacheFull:
                # free the least recently used pinned prefix (spilled to layer KV) and retry;
                # the working sequence keeps what it holds (cells are shared, not owned)
                if self.prefix is None or not len(self.prefix):
                    raise
                self.prefix.evict_lru()
                assert isinstance(b, KVBackend)
                reuse = 0  # the failed decode truncated the working sequence: start clean

    # -- KV tiers ------------------------------------------------------------------------------
    def _restore_kv(self, b: OpBackend, tokens: list[int], ns: str) -> tuple[str, int, str, int]:
        """Arrange the working sequence to hold the longest reusable prefix of ``tokens``.
        Returns (tier, tokens reused, where a snapshot came from, snapshot errors)."""
        if not isinstance(b, KVBackend):
            return "cold", 0, "", 0
        limit = len(tokens) - self.config.min_suffix
        if self.prefix is not None:
            match = self.prefix.longest(ns, tokens)
            if match is not None:
                n = min(match.length, limit, match.handle.n_tokens)
                h = match.handle
                if (
                    self._policy.allows_prefix(n)
                    and h.aligned_with(ns, b.model_identity, match.key)
                    and b.slot_tokens(h.seq_id)[:n] == tokens[:n]
                ):
                    b.load_slot(h.seq_id, n)
                    return "prefix_kv", n, "", 0
        errors = 0
        while (found := self.layer.lookup(ns, tokens)) is not None:
            n = min(found.length, limit)
            if not self._policy.allows_prefix(n):
                break
            loaded = self.layer.load(found.handle)
            try:
                if loaded is None:
                    raise SnapshotError("the snapshot file is gone")
                snap = decode_snapshot(
                    loaded[0],
                    model=b.model_identity,
                    ctx=b.context_config(),
                    verify_payload=loaded[1] == "disk",  # RAM blobs were made by this process
                )
                if snap.namespace != ns or snap.tokens != found.key:
                    raise SnapshotError("the snapshot holds another prefix")
                b.restore(snap.payload, snap.tokens, n)
            except SnapshotError:
                errors += 1
                self.layer.drop(ns, found.key, found.handle)
                continue
            return "layer_kv", n, loaded[1], errors
        return "cold", 0, "", errors

    def _pin(self, b: KVBackend, tokens: list[int], ns: str) -> None:
        """Keep the prompt's KV in a slot so later ops sharing a prefix skip it."""
        if self.prefix is None:
            return
        existing = self.prefix.longest(ns, tokens)
        if existing is not None and existing.length == len(tokens) == len(existing.key):
            return  # already pinned (and just touched)
        if b.free_slots() == 0:
            self.prefix.evict_lru()
        slot = b.pin(len(tokens))
        if slot is None:
            return
        handle = BackendState(
            StateKind.LIVE,
            ns,
            self._model(),
            len(tokens),
            prefix_hash(ns, tokens),
            seq_id=slot,
        )
        self.prefix.insert(ns, tokens, handle)

    def _spill(self, namespace: str, tokens: tuple[int, ...], handle: BackendState) -> None:
        """A pinned prefix leaves the prefix tier: snapshot it into layer KV, free its slot."""
        b = self._backend
        if not isinstance(b, KVBackend):
            return
        if self.layer.index.longest(namespace, tokens) is None or not self._has_snapshot(
            namespace, tokens
        ):
            payload = b.snapshot(handle.seq_id)
            blob = encode_snapshot(
                namespace=namespace,
                model=handle.model,
                ctx=b.context_config(),
                tokens=tokens,
                payload=payload,
                prefix=handle.prefix_hash,
            )
            self.layer.put(namespace, tokens, blob)
        b.release(handle.seq_id)

    def _has_snapshot(self, namespace: str, tokens: tuple[int, ...]) -> bool:
        m = self.layer.index.longest(namespace, tokens)
        return m is not None and m.length == len(tokens) == len(m.key)

    def _model(self) -> str:
        return self.backend.model_identity

    def drop_resident(self) -> int:
        """Spill every pinned prefix to layer KV and free its slot (e.g. under memory pressure)."""
        with self._lock:
            n = len(self.prefix) if self.prefix is not None else 0
            if self.prefix is not None:
                self.prefix.clear()
            return n

    # -- persistence ---------------------------------------------------------------------------
    def save_cache_metadata(self, path: str | Path) -> None:
        """Write the cache index (memo table, snapshot index) to ``path``. Pinned prefixes are
        snapshotted to disk first so a new process can restore them."""
        with self._lock:
            if self.prefix is not None and isinstance(self._backend, KVBackend):
                for ns, tokens, handle in list(self.prefix.entries()):
                    if not self._has_snapshot(ns, tokens):
                        payload = self._backend.snapshot(handle.seq_id)
                        self.layer.put(
                            ns,
                            tokens,
                            encode_snapshot(
                                namespace=ns,
                                model=handle.model,
                                ctx=self._backend.context_config(),
                                tokens=tokens,
                                payload=payload,
                                prefix=handle.prefix_hash,
                            ),
                        )
            b = self.backend
            data = cache_meta.CacheMetadata(
                meta={
                    "namespace": self.namespace,
                    "backend": b.name,
                    "model": b.model_identity,
                    "memo_version": self.memo.version,
                    "snapshot_dir": str(self.layer.directory),
                    "embedder": self.semantic_identity(),
                    "semantic_version": self.semantic.version if self.semantic else 0,
                },
                memo=[
                    (e.key, e.version, e.text, e.tokens, e.finish_reason, e.prompt_tokens)
                    for e in self.memo.entries()
                ],
                snapshots=[
                    (ns, toks, ref.snapshot_id, ref.n_tokens, ref.nbytes)
                    for ns, toks, ref in self.layer.index.entries()
                ],
                semantic=[
                    (
                        e.id,
                        e.partition,
                        e.query,
                        e.version,
                        e.text,
                        e.tokens,
                        e.finish_reason,
                        e.prompt_tokens,
                        np.asarray(v, dtype=np.float32).tobytes(),
                    )
                    for e, v in (self.semantic.entries() if self.semantic else [])
                ],
            )
            cache_meta.save(path, data)
            if self.semantic is not None:
                self.semantic.save_indexes(_index_dir(path))

    def load_cache_metadata(self, path: str | Path) -> dict[str, int]:
        """Reload a saved cache index. Resuming bumps the memo version: entries stored before
        the resume are kept but not served (DESIGN.md §3.10); KV snapshots are re-registered."""
        with self._lock:
            data = cache_meta.load(path)
            b = self.backend
            for field_, mine in (("backend", b.name), ("model", b.model_identity)):
                if data.meta.get(field_) != mine:
                    raise MetadataError(
                        path, f"was saved for {field_} {data.meta.get(field_)!r}, not {mine!r}"
                    )
            for k, v, text, toks, finish, n in data.memo:
                self.memo.put(MemoEntry(OpKey(k), v, text, toks, finish, n))
            saved = data.meta.get("memo_version", 1)
            self.memo.version = max(self.memo.version, int(saved)) + 1
            from continuum.tiers.layer_kv import SnapshotRef

            restored = sum(
                self.layer.restore_index(ns, toks, SnapshotRef(sid, n, nbytes))
                for ns, toks, sid, n, nbytes in data.snapshots
            )
            semantic, skipped = 0, len(data.semantic)
            if self.semantic is not None and data.meta.get("embedder") == self.semantic_identity():
                rows = [
                    (SemanticEntry(i, part, q, v, t, toks, f, n),
                     np.frombuffer(vec, dtype=np.float32).copy())
                    for i, part, q, v, t, toks, f, n, vec in data.semantic
                ]  # fmt: skip
                loaded = self.semantic.load(rows, _index_dir(path))
                semantic, skipped = loaded["entries"], loaded["skipped"]
                saved_version = int(data.meta.get("semantic_version") or 0)
                self.semantic.version = max(self.semantic.version, saved_version) + 1
            return {
                "memo": len(data.memo),
                "snapshots": restored,
                "snapshots_missing": len(data.snapshots) - restored,
                "semantic": semantic,
                "semantic_skipped": skipped,  # made by another embedder (or none configured)
            }

    # -- reporting -------------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        s = self.stats
        lookups = sorted(s.lookup_ms)
        return {
            "ops": s.ops,
            "backend_calls": s.backend_calls,
            "calls_eliminated": s.calls_eliminated,
            "tokens_sent": s.tokens_sent,
            "tokens_saved": s.tokens_saved,
            "hits": dict(s.hits),
            "hit_rate": s.hit_rate(),
            "snapshot_errors": s.snapshot_errors,
            "snapshot_write_errors": self.layer.disk_errors,
            "evictions": {
                "memo": self.memo.evictions,
                "prefix_kv": self.prefix.evictions if self.prefix is not None else 0,
                "layer_kv_ram": self.layer.ram_evictions,
            },
            "bytes_resident": {
                "memo": self.memo.bytes_resident(),
                "layer_kv_ram": self.layer.ram_bytes,
                "layer_kv_disk": self.layer.disk_bytes(),
            },
            "lookup_ms_median": lookups[len(lookups) // 2] if lookups else 0.0,
            "semantic": self.semantic.stats.as_dict() if self.semantic is not None else None,
            "memory_graph": self.graph.stats.as_dict() if self.graph is not None else None,
        }


def _index_dir(metadata_path: str | Path) -> Path:
    """Where the semantic tier's HNSW partition indexes live, next to the metadata file."""
    p = Path(metadata_path)
    return p.with_name(p.name + ".indexes")


def _fields(m: OpMetrics) -> dict[str, Any]:
    return {f: getattr(m, f) for f in OpMetrics.__dataclass_fields__}


def _last_text(messages: Sequence[Message] | None, prompt: str | None) -> str:
    if prompt is not None:
        return prompt
    return str(messages[-1].get("content") or "") if messages else ""


def _all_text(messages: Sequence[Message] | None, prompt: str | None) -> str:
    """Everything the op's input says, for finding which earlier outputs it used."""
    if prompt is not None:
        return prompt
    parts = []
    for m in messages or ():
        parts.append(str(m.get("content") or ""))
        for call in m.get("tool_calls") or ():
            parts.append(canonical_json(call).decode())
    return "\n".join(parts)


def _with_context(
    messages: Sequence[Message] | None, prompt: str | None, items: Sequence[ContextItem]
) -> tuple[list[Message] | None, str | None]:
    """The op's input with surfaced context placed just before its final turn."""
    note = context_message(items)
    if prompt is not None:
        return None, note["content"] + "\n\n" + prompt
    msgs = list(messages or ())
    return [*msgs[:-1], note, *msgs[-1:]], None
