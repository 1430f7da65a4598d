"""``Engine``: one owner of the backend and every tier; every request walks one pipeline.

    policy -> memo -> semantic -> memory_graph (answer) -> prefix_kv -> layer_kv -> cold
                                  memory_graph (surfaced context, passed into the call)

The engine creates its backend through the :class:`BackendRegistry` and wires the tiers by the
backend's capability flags (``backends/base.py``), never by its type. On a backend with resident
sequences (in-process llama.cpp) it also owns the stateful :class:`Worker`, on a sequence of the
*same* context: one model load, one context. A conversation's resident sequence is then the
prefix KV tier's entry for that conversation, and a session turn walks the result tiers through
:class:`TurnTiers` before the worker decodes anything.

Everything that touches a context holds one :class:`ContextGuard` (the worker's claim, so
idle glue steps aside for requests). With ``WorkerConfig.parallel`` > 1 the one context is laid
out in lanes, one KV stream each (a decode attends over its own lane's cells only), decoded
together by the worker's batch scheduler under the same guard, and ops run in them too: each op
is lent a lane (:mod:`continuum.stateful.op_lanes`), its prefill and reply ride in the steps
beside the sessions' decodes, and it starts from what a live session, a parked one's snapshot
or the last op of its tenant holds; ops run at once, each in its lane. With one lane, the session's
sequence shares the ops' cells: before an op decodes, pinned prefixes are evicted (spilled to
layer KV) and, if need be, the active session is parked, until the op fits; before the session
grows, the ops' working state makes room the same way.

The graph is queried before any KV work, unlike DESIGN.md's listing order, on purpose: a
verified answer costs no prefill, and context it surfaces with ``inject=True`` changes the
prompt, so it must be in place before the prefix tiers match tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuum.backends.base import MIN_BATCH, Interruptible, KVBackend, OpBackend
from continuum.backends.context_guard import ContextGuard
from continuum.backends.registry import BackendNeeds, BackendRegistry
from continuum.engine.pipeline import OpPipeline, PipelineTiers
from continuum.engine.turns import PipelineTurnTiers
from continuum.errors import InvalidRequest
from continuum.ops import TokenOp, ToolOp
from continuum.policy import ReusePolicy
from continuum.results import Result
from continuum.stateful import bundle
from continuum.stateful.bundle import ImportedSession
from continuum.stateful.config import SharedContext, check_parallel
from continuum.stateful.kv_space import Cells, KVSpace, Lane
from continuum.stateful.op_lanes import lend
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker, WorkerConfig
from continuum.store.base import SnapshotStore
from continuum.store.bundle_format import Bundle
from continuum.store.stores import SnapshotPlace, Stores, StoreTarget, cache_dir
from continuum.tiers.base import Tier
from continuum.tiers.layer_kv import LayerKVTier, pinned_entry
from continuum.tiers.memo import MemoTier
from continuum.tiers.memory_graph import MemoryGraph
from continuum.tiers.prefix_kv import PrefixKVTier
from continuum.tiers.semantic import SemanticTier
from continuum.tiers.state import BackendState, StateKind, prefix_hash


@dataclass(frozen=True)
class EngineConfig:
    """``snapshot_*``: the one KV snapshot store, for layer KV and parked sessions alike — a
    RAM budget (LRU, written back to disk when pushed out) and a disk budget (least recently
    used files deleted); ``snapshot_dir`` None: <cache dir>/snapshots."""

    memo_capacity: int = 10_000
    snapshot_ram_bytes: int = 512 << 20
    snapshot_disk_bytes: int | None = 4 << 30
    snapshot_dir: Path | None = None
    min_suffix: int = 8
    # every reuse gives exactly the cold answer (issue "cache invariance"): only KV decoded in
    # whole prompt batches is reused, never a reply's (decoded a token at a time), and the
    # prefix slots get a KV stream each instead of sharing a unified cache's cells (whose
    # placement changes the sums): n_ctx cells per slot. False: replies' KV is reused too
    exact: bool = False

    @property
    def directory(self) -> Path:
        """Where KV snapshots go on disk."""
        return self.snapshot_dir or cache_dir() / "snapshots"

    def place(self) -> SnapshotPlace:
        return SnapshotPlace(self.snapshot_ram_bytes, self.snapshot_disk_bytes, self.directory)

    def __post_init__(self) -> None:
        if not isinstance(self.exact, bool):
            raise InvalidRequest(f"exact must be True or False, got {self.exact!r}")
        if self.exact and self.min_suffix < MIN_BATCH:
            raise InvalidRequest(
                f"exact=True needs min_suffix >= {MIN_BATCH} (a shorter last batch is decoded "
                f"by other kernels), got {self.min_suffix}"
            )


def engine_needs(config: EngineConfig, worker: WorkerConfig | None) -> BackendNeeds:
    """What an engine of these settings asks of its backend: ops run in the worker's lanes;
    an exact engine needs exact KV."""
    lanes = check_parallel(worker) if worker is not None else 1
    return BackendNeeds(lanes=lanes, exact=config.exact)


class Engine:
    """The backend, every tier and the stateful worker, behind one context guard. Made by
    :func:`continuum.engine.compose.compose` from a settings tree, or by :meth:`open` from a
    backend's name and keyword options; given its parts, it owns them (closes them)."""

    def __init__(
        self,
        backend: OpBackend,
        *,
        stores: Stores,
        config: EngineConfig | None = None,
        semantic: SemanticTier | None = None,
        graph: MemoryGraph | None = None,
        worker: WorkerConfig | None = None,
        name: str = "",
    ) -> None:
        if not isinstance(backend, OpBackend):
            raise InvalidRequest(
                "Engine(backend) takes an OpBackend; to make one by name, use Engine.open(...) "
                "or continuum.engine.compose(settings)"
            )
        if semantic is not None and not isinstance(semantic, SemanticTier):
            raise InvalidRequest("semantic= takes a SemanticTier(embedder, ...)")
        if graph is not None and not isinstance(graph, MemoryGraph):
            raise InvalidRequest("graph= takes a MemoryGraph(path, ...)")
        self.backend = backend
        self.backend_name = name or type(backend).__name__
        self.config = config or EngineConfig()
        if self.config.exact:
            worker = dataclasses.replace(worker or WorkerConfig(), exact=True)
        self._lock = ContextGuard()
        self._ops = threading.Lock()  # one op at a time without lanes (before the guard)
        self.stores = stores  # on Redis: the stores a fleet shares
        self.snapshots: SnapshotStore = self.stores.snapshots
        self.memo = MemoTier(self.config.memo_capacity, shared=self.stores.results)
        self.semantic = semantic
        if semantic is not None and (vectors := self.stores.vectors(semantic.capacity)):
            semantic.attach(vectors)  # a fleet's workers share entries
        self.graph = graph
        self.layer = LayerKVTier(
            store=self.snapshots, directory=self.config.directory, min_suffix=self.config.min_suffix
        )
        self.prefix: PrefixKVTier | None = None
        kv = self.kv_backend
        if kv is not None:
            self.layer.backend = kv
            self.layer.make_room = self.room_for_op
            self.prefix = PrefixKVTier(
                kv,
                min_suffix=self.config.min_suffix,
                on_evict=self._spill,
                live=self._live,
                replies=not self.config.exact,
            )
            self.prefix.deeper = self.layer.reach
        # the pipeline, in order: adding a tier is one line here
        self.result_tiers: list[Tier] = [t for t in (self.memo, semantic, graph) if t is not None]
        self.kv_tiers: list[Tier] = [self.prefix, self.layer] if self.prefix is not None else []
        tiers = PipelineTiers(
            results=self.result_tiers,
            kv=self.kv_tiers,
            prefix=self.prefix,
            semantic=semantic,
            graph=graph,
        )
        self.pipeline = OpPipeline(self.backend, tiers, context=self, replies=not self.config.exact)
        self._worker_config = worker
        self._worker: Worker | None = None
        self._closed = False

    @classmethod
    def open(
        cls,
        registry: BackendRegistry | None = None,
        *,
        backend: str = "llamacpp",
        config: EngineConfig | None = None,
        semantic: SemanticTier | None = None,
        graph: MemoryGraph | None = None,
        worker: WorkerConfig | None = None,
        store: StoreTarget = None,
        **backend_options: Any,
    ) -> Engine:
        """An engine on backend ``backend`` of ``registry``, made from flat keyword options
        (``Engine.open(model=gemma, n_ctx=2048)``), its stores at ``store``."""
        config = config or EngineConfig()
        made = (registry or BackendRegistry()).create(
            backend, engine_needs(config, worker), **backend_options
        )
        try:
            stores = Stores.open(store, config.place())
            return cls(
                made,
                stores=stores,
                config=config,
                semantic=semantic,
                graph=graph,
                worker=worker,
                name=backend,
            )
        except BaseException:
            made.close()
            raise

    # -- the backend and its capabilities ------------------------------------------------------
    @property
    def kv_backend(self) -> KVBackend | None:
        b = self.backend
        return b if b.capabilities.kv_snapshots and isinstance(b, KVBackend) else None

    @property
    def model_identity(self) -> str:
        return self.backend.model_identity

    # -- stateful sessions ------------------------------------------------------------------
    @property
    def has_sessions(self) -> bool:
        return self.backend.capabilities.resident_sequences

    def worker(self) -> Worker:
        """The stateful worker on this engine's context (opened on first use)."""
        with self._lock:
            if self._closed:
                raise InvalidRequest("the engine is closed")
            if self._worker is None:
                resident = getattr(self.backend, "resident_sequence", None)
                if not self.has_sessions or resident is None:
                    raise InvalidRequest(
                        f"backend {self.backend_name!r} keeps no resident sequences: stateful "
                        "sessions need the in-process llamacpp backend"
                    )
                llama, seq = resident()
                shared = SharedContext(llama, seq, self._lock, self.snapshots)
                w = Worker(config=self._worker_config, store=self.stores, context=shared)
                w.tiers = PipelineTurnTiers(self.pipeline)
                if w.backend is llama:  # the ops' context (else: a context apart)
                    if not self.op_lanes:  # its one lane shares the ops' cells
                        w.make_room = self._room_for_session
                    # parked sessions are layer KV entries (a lane's state, taken in a cache
                    # of one stream per lane, does not load into a unified cache apart)
                    w.residency.index = self.layer
                self._worker = w
            return self._worker

    def create_session(self, system: str | None = None, **options: Any) -> ChatSession:
        """A stateful session on this engine (see :meth:`Worker.create_session`); its turns
        walk the result tiers before anything is decoded."""
        return self.worker().create_session(system, **options)

    def open_session(self, session_id: str, **options: Any) -> ChatSession:
        return self.worker().open_session(session_id, **options)

    def delete_session(self, session_id: str) -> bool:
        return self.worker().delete_session(session_id)

    def export_session(self, session_id: str, *, kv: bool = True) -> bytes:
        """A stored session as one bundle (history, and its KV snapshot when one can be
        taken): see :mod:`continuum.stateful.bundle`."""
        return bundle.export_session(self.worker(), session_id, kv=kv)

    def import_session(self, data: bytes | Bundle, *, tenant: str | None = None) -> ImportedSession:
        """Create and open the session a bundle holds, with its id, on this engine's store;
        ``tenant`` (the importer's) must be the bundle's own."""
        return bundle.import_session(self.worker(), data, tenant=tenant)

    @property
    def op_lanes(self) -> bool:
        """Ops run in the sessions' lanes (one context laid out in lanes; see
        :mod:`continuum.stateful.op_lanes`), not in sequences of their own."""
        return int(getattr(self.backend, "lanes", 1)) > 1

    @contextmanager
    def op_claim(self) -> Iterator[None]:
        """Hold the model for an op. In lanes, ops run at once, each in the lane it is lent,
        their decodes riding in the lanes' steps beside the sessions' (they meet only where
        the guard lets callers in); otherwise one at a time, in the one working sequence."""
        with contextlib.nullcontext() if self.op_lanes else self._ops, self.claim():
            yield

    @contextmanager
    def op_sequence(self, namespace: str, tokens: Sequence[int]) -> Iterator[Lane | None]:
        """Where an op decodes (under :meth:`op_claim`): the backend's working sequence, or
        a lane lent for the op when ops run in the lanes (yielded: the caller marks what the
        op leaves in it)."""
        if not self.op_lanes:
            yield None
            return
        on = getattr(self.backend, "on", None)
        assert on is not None, "a backend laid out in lanes runs ops in one"
        with lend(self.worker(), namespace, tokens, self._spill_lane) as lane, on(lane.seq):
            yield lane

    @contextmanager
    def claim(self) -> Iterator[None]:
        """Hold the model (idle work steps aside until the block ends)."""
        with self._worker.claim() if self._worker is not None else self._lock_cm():
            yield

    @contextmanager
    def _lock_cm(self) -> Iterator[None]:
        with self._lock:
            yield

    def room_for_op(self, need: int) -> None:
        """Make room for ``need`` more cells of the working sequence next to everything
        resident: pinned prefixes are spilled to layer KV, then idle sessions parked, as the
        KV space decides (:meth:`KVSpace.room`)."""
        if self.kv_backend is None or self.op_lanes:  # a lane's stream is its own: its n_ctx
            return
        w = self._worker
        shares = w is not None and w.make_room is not None  # its lane is in the ops' context
        self._make_room(need, None, drop_working=False, lanes=shares)

    def _room_for_session(self, total: int, lane: Lane | None) -> None:
        """Make room for ``lane``'s sequence to grow to ``total`` tokens: pinned prefixes and
        the ops' working state give way, then other lanes' idle sessions are parked."""
        if self.kv_backend is not None and self._worker is not None:
            self._make_room(total, lane, drop_working=True, lanes=True)

    def _make_room(self, need: int, lane: Lane | None, *, drop_working: bool, lanes: bool) -> None:
        kv, w = self.kv_backend, self._worker
        assert kv is not None
        space = w.residency.space if lanes and w is not None else KVSpace(())
        entries = self.prefix.trie.entries() if self.prefix is not None else iter(())
        pinned = [handle.n_tokens for _, _, handle in entries]  # least recently used first
        working = len(kv.working_tokens())
        fixed = max(0, kv.resident_tokens() - working - sum(pinned))  # slots no entry names
        cells = Cells(self._n_ctx(), pinned, working, fixed)
        room = space.room(need, cells, exclude=lane, drop_working=drop_working)
        for _ in range(room.unpin):
            assert self.prefix is not None
            self.prefix.trie.evict_lru()
        if room.drop_working:
            kv.drop_working()
        if room.parks and w is not None:
            with w.guard:
                for parked in room.parks:
                    w.residency.evict(parked)

    @property
    def n_ctx(self) -> int | None:
        """The context's size in tokens; None for a backend whose server decides (remote)."""
        llama = getattr(self.backend, "llama", None)
        return int(llama.n_ctx) if llama is not None else None

    def _n_ctx(self) -> int:
        return self.n_ctx or 1 << 62

    def _live(self, namespace: str) -> list[tuple[int, int]]:
        """Resident conversations of ``namespace`` as prefix-KV candidates: (sequence, tokens
        of it decoded as whole prompt batches)."""
        w = self._worker
        if w is None or w.backend is not getattr(self.backend, "llama", None):
            return []  # its lanes are in a context apart: no cells to share with the ops
        return w.residency.live_prefixes(namespace)

    def _spill_lane(self, lane: Lane) -> None:
        """An op's leftovers about to be dropped from a lane: snapshot them into layer KV (as
        a pinned prefix leaving the prefix tier is), so a later op still starts from them."""
        kv, ns = self.kv_backend, lane.left_by
        if kv is None or ns is None or not lane.exact:
            return
        if lane.exact < len(lane.seq.tokens):  # a snapshot holds the whole sequence: only
            lane.seq.truncate(lane.exact)  # what later ops may start from (it is dropped next)
        tokens = tuple(lane.seq.tokens)
        if self.layer.holds(ns, tokens):
            return
        h = prefix_hash(ns, tokens)
        handle = BackendState(StateKind.LIVE, ns, self.model_identity, len(tokens), h, lane.seq.seq)
        self.layer.put(ns, tokens, pinned_entry(kv, ns, tokens, handle))

    def _spill(self, namespace: str, tokens: tuple[int, ...], handle: BackendState) -> None:
        """A pinned prefix leaves the prefix tier: snapshot it into layer KV, free its slot."""
        kv = self.kv_backend
        if kv is None:
            return
        if not self.layer.holds(namespace, tokens):
            self.layer.put(namespace, tokens, pinned_entry(kv, namespace, tokens, handle))
        kv.release(handle.seq_id)

    # -- running ops -------------------------------------------------------------------------
    def run(
        self,
        op: TokenOp | ToolOp,
        on_text: Callable[[str], None] | None = None,
        *,
        namespace: str,
        policy: ReusePolicy | None = None,
    ) -> Result:
        """Run ``op`` through the pipeline for tenant ``namespace``."""
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest(f"namespace must be a non-empty string, got {namespace!r}")
        policy = policy or ReusePolicy.always()
        if isinstance(op, ToolOp):  # user code: never run while the context is held
            return self.pipeline.run_tool(op, namespace, policy)
        if isinstance(op, TokenOp):
            return self.pipeline.run_token(op, on_text, namespace, policy)
        raise InvalidRequest(f"run() takes a TokenOp or ToolOp, got {type(op).__name__}")

    def drop_resident(self) -> int:
        """Spill every pinned prefix to layer KV and free its slot (e.g. under memory pressure)."""
        with self._lock:
            n = len(self.prefix) if self.prefix is not None else 0
            if self.prefix is not None:
                self.prefix.trie.clear()
            return n

    # -- lifecycle ---------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Stop work running on the model at its next decode, with
        :class:`~continuum.errors.ShuttingDown` (a closing server's last resort), until
        :meth:`resume`. A backend that cannot be interrupted (a remote server) is left alone:
        its calls end by their own timeouts."""
        if isinstance(self.backend, Interruptible):
            self.backend.interrupt()

    def resume(self) -> None:
        if isinstance(self.backend, Interruptible):
            self.backend.resume()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._worker is not None:
                self._worker.close()
            if self.semantic is not None:
                self.semantic.close()
            self.backend.close()
            self.stores.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reporting ---------------------------------------------------------------------------
    def tier_stats(self) -> dict[str, dict[str, Any]]:
        return {t.name: t.stats() for t in (*self.result_tiers, *self.kv_tiers)}
