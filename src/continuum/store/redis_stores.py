"""Every Redis store of one process, on one connection: what ``--store redis://…`` opens."""

from __future__ import annotations

from dataclasses import dataclass

from continuum.store.redis_client import RedisTarget
from continuum.store.redis_history import RedisHistoryStore
from continuum.store.redis_results import RedisResultStore
from continuum.store.redis_snapshots import RedisSnapshotStore


@dataclass(frozen=True, slots=True)
class RedisStores:
    target: RedisTarget
    history: RedisHistoryStore
    snapshots: RedisSnapshotStore
    results: RedisResultStore

    def close(self) -> None:
        self.target.close()


def open_redis(
    url: str, *, ram_budget_bytes: int, budget_bytes: int | None, timeout_s: float = 2.0
) -> RedisStores:
    """Connect (and ping: :class:`~continuum.errors.StoreUnavailable` if Redis is not there)."""
    target = RedisTarget(url, timeout_s=timeout_s)
    try:
        history = RedisHistoryStore(target, owns_target=False)
    except BaseException:
        target.close()
        raise
    snapshots = RedisSnapshotStore(
        target, ram_budget_bytes=ram_budget_bytes, budget_bytes=budget_bytes
    )
    return RedisStores(target, history, snapshots, RedisResultStore(target))


__all__ = ["RedisStores", "open_redis"]
