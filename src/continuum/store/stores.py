"""Where the stores live, decided once.

``--store``, ``--graph`` and a cache-metadata path each name either a SQLite file or a Redis
server (``redis://host:port[/db][?prefix=name]``) that every worker of a fleet shares.
:class:`StoreAddress` is that value parsed at the edge — a malformed Redis URL is refused there,
before any model loads — and it opens each protocol at its address:

* :meth:`Stores.open`: the set one worker or engine needs — the history log, the KV snapshot
  store and, on Redis, the result and vector logs the fleet shares (a file's stay in the process);
* :meth:`StoreAddress.graph`: the memory graph;
* :meth:`StoreAddress.cache_metadata`: saved cache metadata.

Nothing else in continuum asks whether an address is Redis.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import field_validator

from continuum.errors import InvalidRequest
from continuum.settings import Settings, fspath, setting
from continuum.store.base import CacheMetadataStore, GraphLog, HistoryLog, SnapshotStore
from continuum.store.cache_meta import CacheMetadataFile
from continuum.store.graph import GraphStore
from continuum.store.redis_cache_meta import RedisCacheMetadata
from continuum.store.redis_client import RedisTarget, is_redis_url
from continuum.store.redis_graph import RedisGraphStore
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.redis_results import RedisResultStore
from continuum.store.redis_snapshots import RedisSnapshotStore
from continuum.store.redis_vectors import RedisVectorLog
from continuum.store.snapshots import FileSnapshotStore
from continuum.store.sqlite import HistoryStore


def cache_dir() -> Path:
    """Where continuum keeps what it can make again: models, KV snapshots, indexes."""
    if explicit := os.environ.get("CONTINUUM_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "continuum"


def default_store_path() -> Path:
    """Where continuum keeps what it cannot: the history of sessions."""
    home = os.environ.get("CONTINUUM_HOME")
    base = Path(home) if home else Path.home() / ".local" / "share" / "continuum"
    return base / "history.db"


class StoreSettings(Settings):
    """Where the history (and, on Redis, everything a fleet shares) is kept."""

    store: str | None = setting(
        None,
        f"History database (default {default_store_path()}), or redis://host:port[/db]"
        "[?prefix=name] to share history, memo results and KV snapshots with other workers.",
    )

    _path = field_validator("store", mode="before")(fspath)

    def address(self) -> StoreAddress | None:
        """The store's address (None: the default file); a malformed URL is refused here."""
        return StoreAddress.parse(self.store) if self.store else None

    def check(self) -> None:
        self.address()
        super().check()


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """A SQLite file (``path``) or a Redis server (``url``, password included: ``str()`` of the
    address redacts it)."""

    path: Path | None = None
    url: str | None = None

    @classmethod
    def parse(cls, target: StoreAddress | str | os.PathLike[str] | None) -> StoreAddress:
        """``target`` as an address; None or "" is :func:`default_store_path`. A malformed Redis
        URL is :class:`~continuum.errors.InvalidRequest` (nothing connects here)."""
        if isinstance(target, StoreAddress):
            return target
        if is_redis_url(target):
            RedisTarget(str(target)).close()
            return cls(url=str(target))
        return cls(path=Path(target) if target else default_store_path())

    @property
    def shared(self) -> bool:
        """Whether the address is a Redis server (the stores a fleet shares)."""
        return self.url is not None

    @property
    def value(self) -> Path | str:
        """What the address was parsed from: the file's path, or the URL."""
        return self.url if self.url is not None else self.sqlite

    @property
    def sqlite(self) -> Path:
        """The SQLite file (the address must be one)."""
        assert self.path is not None, "a Redis address has no file"
        return self.path

    def __str__(self) -> str:
        return RedisTarget(self.url).url if self.url is not None else str(self.path)

    def target(self) -> RedisTarget:
        assert self.url is not None
        return RedisTarget(self.url)

    def graph(self) -> GraphLog:
        """The memory graph at this address."""
        if self.url is None:
            return GraphStore(self.sqlite)
        redis = self.target()
        try:
            return RedisGraphStore(redis, owns_target=True)
        except BaseException:
            redis.close()
            raise

    @contextmanager
    def cache_metadata(self) -> Iterator[CacheMetadataStore]:
        """The cache metadata store at this address, closed on exit."""
        if self.url is None:
            yield CacheMetadataFile(self.sqlite)
            return
        store = RedisCacheMetadata(self.target(), owns_target=True)
        try:
            yield store
        finally:
            store.close()

    def index_dir(self) -> Path | None:
        """Where the semantic tier's HNSW indexes are saved beside cache metadata at this
        address (none on Redis: a fleet's workers rebuild them from the shared entries)."""
        if self.url is not None:
            return None
        return self.sqlite.with_name(self.sqlite.name + ".indexes")


@dataclass(frozen=True, slots=True)
class SnapshotPlace:
    """Where :meth:`Stores.open` keeps KV snapshots: a RAM budget, then disk. On Redis, the
    server below the RAM (``disk_budget_bytes`` bounds what is kept there); on a file, the
    ``directory`` (default: ``snapshots/`` beside the history), or none when ``on_disk`` is
    False (RAM only, wherever the history is)."""

    ram_budget_bytes: int
    disk_budget_bytes: int | None = None
    directory: Path | None = None
    on_disk: bool = True


class Stores:
    """The store protocols at one address (see the module docstring). A file's history is
    opened on first use (a process that never keeps a session creates no database); a Redis
    server's at once, so an unreachable one fails before any model loads
    (:class:`~continuum.errors.StoreUnavailable`)."""

    def __init__(
        self,
        address: StoreAddress | None,
        snapshots: SnapshotStore,
        *,
        history: HistoryLog | None = None,
        owns_history: bool = True,
        redis: RedisTarget | None = None,
        snapshot_dir: Path | None = None,
    ) -> None:
        self.address = address
        self.snapshots = snapshots
        self.snapshot_dir = snapshot_dir  # where snapshots go on disk (None: RAM or Redis)
        self.redis = redis  # the connection a fleet's stores share
        self.results = RedisResultStore(redis) if redis is not None else None
        self._history = history
        self._owns_history = owns_history  # False: the caller's, left open by close()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, target: StoreTarget, place: SnapshotPlace) -> Stores:
        """The stores ``target`` names — an address, a history log as it is (the caller keeps
        it), or None for :func:`default_store_path` — with snapshots kept as ``place`` says."""
        if isinstance(target, HistoryLog):
            return cls._around(target, place)
        address = StoreAddress.parse(target)
        if address.url is None:
            snapshots, directory = _files(place, address.sqlite.parent / "snapshots")
            return cls(address, snapshots, snapshot_dir=directory)
        redis = address.target()
        try:
            history = RedisHistoryStore(redis, owns_target=False)
        except BaseException:
            redis.close()
            raise
        return cls(address, _shared(redis, place), history=history, redis=redis)

    @classmethod
    def _around(cls, history: HistoryLog, place: SnapshotPlace) -> Stores:
        if isinstance(history, RedisHistoryStore):  # its snapshots go to the same Redis
            return cls(None, _shared(history.target, place), history=history, owns_history=False)
        beside = history.path.parent if isinstance(history, HistoryStore) else cache_dir()
        snapshots, directory = _files(place, beside / "snapshots")
        return cls(None, snapshots, history=history, owns_history=False, snapshot_dir=directory)

    @property
    def history(self) -> HistoryLog:
        with self._lock:
            if self._closed:
                raise InvalidRequest("these stores are closed; open them again")
            if self._history is None:
                assert self.address is not None
                self._history = HistoryStore(self.address.sqlite)
            return self._history

    def vectors(self, maxlen: int) -> RedisVectorLog | None:
        """The semantic entries a fleet shares (None on a file: they stay in the process)."""
        return RedisVectorLog(self.redis, maxlen=maxlen) if self.redis is not None else None

    def close(self) -> None:
        with self._lock:
            history, self._history = self._history, None
            self._closed = True
        if history is not None and self._owns_history:
            history.close()
        if self.redis is not None and self.address is not None:
            self.redis.close()


def _shared(redis: RedisTarget, place: SnapshotPlace) -> SnapshotStore:
    if not place.on_disk:
        return FileSnapshotStore(ram_budget_bytes=place.ram_budget_bytes)
    return RedisSnapshotStore(
        redis, ram_budget_bytes=place.ram_budget_bytes, budget_bytes=place.disk_budget_bytes
    )


def _files(place: SnapshotPlace, beside: Path) -> tuple[SnapshotStore, Path | None]:
    directory = (place.directory or beside) if place.on_disk else None
    store = FileSnapshotStore(
        ram_budget_bytes=place.ram_budget_bytes,
        directory=directory,
        disk_budget_bytes=place.disk_budget_bytes,
    )
    return store, directory


StoreTarget = StoreAddress | HistoryLog | str | os.PathLike[str] | None

__all__ = [
    "SnapshotPlace",
    "StoreAddress",
    "StoreSettings",
    "StoreTarget",
    "Stores",
    "cache_dir",
    "default_store_path",
]
