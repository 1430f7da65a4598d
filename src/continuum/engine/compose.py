"""The composition root: an :class:`Engine` from one settings tree.

    engine = compose(EngineSettings.of(model="gemma3-270m", n_ctx=4096, parallel=2))

:class:`EngineSettings` gathers what each component declares — the backends (one section each,
:class:`~continuum.backends.registry.BackendSettings`), the lanes, the store, the semantic tier,
the memory graph — and :func:`compose` builds each part from its section and hands the parts to
the engine's constructor: the backend from the registry (with the :class:`BackendNeeds` the
lanes and exactness imply), the stores at their address, the tiers. Nothing here asks which
backend it is: a backend an installed package registers composes the same way.

``continuum serve``'s tree (:class:`continuum.server.settings.ServeSettings`) holds one of
these; :meth:`EngineSettings.with_backends` is the tree with every registered backend's section,
so the command line lists their options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import create_model

from continuum.backends.base import OpBackend
from continuum.backends.embedders import Embedder
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.backends.models import resolve_model
from continuum.backends.registry import BackendRegistry, BackendSettings
from continuum.engine.core import Engine, EngineConfig, engine_needs
from continuum.settings import Settings, setting
from continuum.stateful.config import LaneSettings
from continuum.store.stores import StoreAddress, Stores, StoreSettings
from continuum.tiers.memory_graph import GraphSettings, MemoryGraph
from continuum.tiers.semantic import SemanticSettings, SemanticTier
from continuum.tiers.semantic_calibration import Calibration
from continuum.tiers.verifier import JudgeVerifier, Kind


class EngineSettings(Settings):
    """Everything an engine is made from (see the module docstring)."""

    backend: BackendSettings = BackendSettings()
    lanes: LaneSettings = LaneSettings()
    store: StoreSettings = StoreSettings()
    snapshot_dir: Path | None = setting(
        None,
        "Folder of KV snapshots on disk (parked sessions, spilled prefixes); default "
        "snapshots/ in the cache folder.",
        directory=True,
    )
    snapshot_ram: int = setting(
        512,
        "MiB of RAM for KV snapshots (parked sessions, spilled prefixes), least recently used "
        "first; past it they are written to --snapshot-dir and come back from disk.",
        ge=0,
        flags=("--snapshot-ram",),
    )
    semantic: SemanticSettings = SemanticSettings()
    graph: GraphSettings = GraphSettings()

    @classmethod
    def with_backends(cls, registry: BackendRegistry) -> type[EngineSettings]:
        """This tree with a backend section for every backend ``registry`` knows."""
        sections = registry.settings_tree()
        if sections is BackendSettings:
            return cls
        made = create_model(cls.__name__, __base__=cls, backend=(sections, sections()))
        return made

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            snapshot_ram_bytes=self.snapshot_ram << 20,
            snapshot_dir=self.snapshot_dir,
            exact=self.lanes.exact,
        )

    def graph_address(self) -> StoreAddress | None:
        """The memory graph's address; a malformed URL is refused here."""
        return self.graph.address()


def compose(
    settings: EngineSettings,
    *,
    registry: BackendRegistry | None = None,
    embedder: Embedder | None = None,
) -> Engine:
    """The engine ``settings`` describe, its parts built here and given to it. ``embedder``: the
    semantic tier's and the graph's (with ``semantic`` set, the default one when not given)."""
    config = settings.engine_config()
    worker = settings.lanes.worker_config()
    store, graph_at = settings.store.address(), settings.graph_address()  # refused before loading
    if settings.semantic.semantic and embedder is None:
        from continuum.backends.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()
    registry = registry or BackendRegistry()
    backend = registry.build(settings.backend, engine_needs(config, worker))
    parts: list[Any] = [backend]
    try:
        stores = Stores.open(store, config.place())
        parts.append(stores)
        semantic = None
        if settings.semantic.semantic and embedder is not None:
            semantic = semantic_tier(settings.semantic, embedder, backend)
            parts.append(semantic)  # closes its judge
        graph = MemoryGraph(graph_at, embedder=embedder) if graph_at is not None else None
        engine = Engine(
            backend,
            stores=stores,
            config=config,
            semantic=semantic,
            graph=graph,
            worker=worker,
            name=settings.backend.backend,
        )
    except BaseException:
        for part in reversed(parts):
            part.close()
        raise
    try:
        if engine.has_sessions:
            engine.worker()  # open the history store now, on this thread
    except BaseException:
        engine.close()
        raise
    return engine


def judge_for(backend: OpBackend, kind: Kind = "intent", model: str | None = None) -> JudgeVerifier:
    """The semantic tier's judge on ``model`` (default: the bundled instruct model), on the
    backend's own weights when it runs that same file."""
    llama = getattr(backend, "llama", None)
    share = llama if isinstance(llama, LlamaCppBackend) else None
    return JudgeVerifier.open(resolve_model(model) if model else None, share=share, kind=kind)


def semantic_tier(
    settings: SemanticSettings, embedder: Embedder, backend: OpBackend
) -> SemanticTier:
    """The tier ``--semantic-verifier`` asks for: the judge on the request path, the guard
    alone, or the verified mode (an answer judge off the path, a threshold within delta)."""
    mode, model = settings.semantic_verifier, settings.semantic_judge
    if mode == "verified":  # the intent prompt: bench semantic-verified measured it ahead
        judge = judge_for(backend, model=model)
        return SemanticTier(
            embedder, verifier=judge, calibration=Calibration(settings.semantic_delta)
        )
    verifier = judge_for(backend, model=model) if mode == "judge" else None
    return SemanticTier(embedder, verifier=verifier)


__all__ = ["EngineSettings", "compose", "judge_for", "semantic_tier"]
