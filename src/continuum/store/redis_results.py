"""Stored results shared through Redis: what the memo tier serves, visible to every process.

A result is one JSON record under its op key (which already holds the tenant namespace, the
model digest and every decode parameter: DESIGN.md §3.6, §3.8), with the memo version it was
stored under and an expiry (``ttl_s``): Redis must run with ``maxmemory-policy noeviction``
(the history lives in it too), so the results bound themselves. The memo version is one
counter (``P:memo:version``) that only grows: a resumed run bumps it (§3.10) for every process.
"""

from __future__ import annotations

import json
from typing import Any

from continuum.store.redis_client import BUMP_VERSION, RedisTarget

DEFAULT_TTL_S = 7 * 24 * 3600


class RedisResultStore:
    """Result records by op key in one Redis; :class:`~continuum.errors.StoreUnavailable`
    when it cannot be reached (the memo tier then degrades to its RAM copy)."""

    def __init__(self, target: RedisTarget, *, ttl_s: int = DEFAULT_TTL_S) -> None:
        self.target = target
        self.ttl_s = ttl_s
        self._version = target.key("memo", "version")

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self.target.call(self.target.client.get, self.target.key("memo", key))
        return None if raw is None else dict(json.loads(raw))

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.target.call(
            self.target.client.set, self.target.key("memo", key), json.dumps(record), ex=self.ttl_s
        )

    def version(self) -> int:
        """The shared memo version (1 before any bump)."""
        return int(self.target.call(self.target.client.get, self._version) or 1)

    def bump(self, above: int) -> int:
        """Move the shared version past both itself and ``above``; the version now."""
        return int(self.target.run("memo_bump", BUMP_VERSION, [self._version], [above]))


__all__ = ["DEFAULT_TTL_S", "RedisResultStore"]
