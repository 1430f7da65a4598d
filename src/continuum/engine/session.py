"""``Session``: the seed's namespace view of an engine — a tenant, a policy, running totals.

    session = Session("agent-fleet", BackendRegistry())
    session.policy = ReusePolicy.threshold(min_len=64)
    session.run(TokenOp("summarise", messages=[...]))

A ``Session`` made this way creates (and closes) an :class:`Engine` of its own; several views
over one engine (one per tenant, as the server keeps them) share its backend and tiers, and
never each other's entries: the namespace is part of every key (DESIGN.md §3.8).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from continuum.backends.base import OpBackend
from continuum.backends.registry import BackendRegistry
from continuum.engine import persistence
from continuum.engine.core import Engine, EngineConfig
from continuum.engine.stats import SessionStats
from continuum.errors import InvalidRequest
from continuum.ops import TokenOp, ToolOp
from continuum.policy import ReusePolicy
from continuum.results import Result
from continuum.tiers.layer_kv import LayerKVTier
from continuum.tiers.memo import MemoTier
from continuum.tiers.memory_graph import MemoryGraph
from continuum.tiers.semantic import SemanticTier


class Session:
    """A namespace (tenant) running ops through an engine's reuse stack."""

    def __init__(
        self,
        namespace: str,
        registry: BackendRegistry | None = None,
        *,
        backend: str = "llamacpp",
        config: EngineConfig | None = None,
        semantic: SemanticTier | None = None,
        graph: MemoryGraph | None = None,
        engine: Engine | None = None,
        **backend_options: Any,
    ) -> None:
        if not isinstance(namespace, str) or not namespace:
            raise InvalidRequest(f"namespace must be a non-empty string, got {namespace!r}")
        self.namespace = namespace
        self._owns_engine = engine is None
        self.engine = engine or Engine.open(
            registry,
            backend=backend,
            config=config,
            semantic=semantic,
            graph=graph,
            **backend_options,
        )
        self._policy = ReusePolicy.always()
        self.stats = SessionStats()

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
        return self.engine.backend

    @property
    def memo(self) -> MemoTier:
        return self.engine.memo

    @property
    def layer(self) -> LayerKVTier:
        return self.engine.layer

    @property
    def semantic(self) -> SemanticTier | None:
        return self.engine.semantic

    @property
    def graph(self) -> MemoryGraph | None:
        return self.engine.graph

    # -- running ops ---------------------------------------------------------------------------
    def run(
        self,
        op: TokenOp | ToolOp,
        on_text: Callable[[str], None] | None = None,
        *,
        namespace: str | None = None,
    ) -> Result:
        """Run ``op`` through the tiers. ``namespace`` overrides the session's tenant for this op
        (a server serving several tenants over one engine); tiers are partitioned by it."""
        ns = self.namespace if namespace is None else namespace
        result = self.engine.run(op, on_text, namespace=ns, policy=self._policy)
        self.stats.record(result.metrics)
        return result

    def drop_resident(self) -> int:
        """Spill every pinned prefix to layer KV and free its slot (e.g. under memory pressure)."""
        return self.engine.drop_resident()

    # -- persistence ---------------------------------------------------------------------------
    def save_cache_metadata(self, path: str | Path) -> None:
        """Write the cache index (memo table, snapshot index, semantic entries) to ``path``."""
        persistence.save(self.engine, path, self.namespace)

    def load_cache_metadata(self, path: str | Path) -> dict[str, int]:
        """Reload a saved cache index; resuming bumps the memo version (DESIGN.md §3.10)."""
        return persistence.load(self.engine, path)

    def metrics(self) -> dict[str, Any]:
        return persistence.report(self.engine, self.stats)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
