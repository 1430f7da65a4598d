"""The concrete stores satisfy the storage protocols, method names and signatures alike."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import pytest

from continuum.store import base
from continuum.store.base import CacheMetadataStore, GraphLog, HistoryLog, SnapshotStore
from continuum.store.cache_meta import CacheMetadataFile
from continuum.store.graph import GraphStore
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_graph import RedisGraphStore
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.redis_snapshots import RedisSnapshotStore
from continuum.store.snapshots import FileSnapshotStore
from continuum.store.sqlite import HistoryStore

PAIRS: list[tuple[type[Any], type[Any]]] = [
    (HistoryLog, HistoryStore),
    (HistoryLog, RedisHistoryStore),
    (SnapshotStore, FileSnapshotStore),
    (SnapshotStore, RedisSnapshotStore),
    (GraphLog, GraphStore),
    (GraphLog, RedisGraphStore),
    (CacheMetadataStore, CacheMetadataFile),
    (CacheMetadataStore, RedisCacheMetadata),
]


def members(protocol: type[Any]) -> list[str]:
    """The methods a protocol declares (``__contains__`` included, ``object``'s excluded)."""
    own = vars(protocol)
    return sorted(
        name
        for name, value in own.items()
        if callable(value) and (not name.startswith("_") or name == "__contains__")
    )


def shape(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    """(name, kind, default, resolved annotation) of each parameter, then the return type."""
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    out = [(p.name, p.kind, p.default, hints.get(p.name)) for p in params]
    return [*out, ("return", None, None, hints.get("return"))]


@pytest.mark.parametrize(("protocol", "concrete"), PAIRS, ids=lambda c: c.__name__)
def test_the_concrete_store_has_the_protocols_signatures(
    protocol: type[Any], concrete: type[Any]
) -> None:
    names = members(protocol)
    assert names, protocol
    for name in names:
        assert hasattr(concrete, name), f"{concrete.__name__} lacks {name}"
        assert shape(getattr(concrete, name)) == shape(getattr(protocol, name)), name


def test_instances_pass_isinstance(tmp_path: Path) -> None:
    history = HistoryStore(tmp_path / "h.db")
    graph = GraphStore(tmp_path / "g.db")
    try:
        assert isinstance(history, HistoryLog) and not isinstance(history, GraphLog)
        assert isinstance(graph, GraphLog) and not isinstance(graph, HistoryLog)
        assert isinstance(FileSnapshotStore(directory=tmp_path / "s"), SnapshotStore)
        assert isinstance(CacheMetadataFile(tmp_path / "m.db"), CacheMetadataStore)
    finally:
        history.close()
        graph.close()


def test_the_protocols_name_no_sqlite_type() -> None:
    for protocol, _ in PAIRS:
        for name in members(protocol):
            hints = typing.get_type_hints(getattr(protocol, name))
            assert "sqlite" not in repr(hints).lower(), (protocol.__name__, name)
    assert "sqlite3" not in Path(base.__file__).read_text()
