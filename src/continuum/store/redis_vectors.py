"""The semantic tier's entries in Redis: the source of truth a fleet shares, as one stream.

Every stored entry (its fields and its float32 vector) is one record of the stream
``P:semantic:stream``; each process mirrors the stream into its own ANN index by reading what it
has not seen yet (``XREAD`` from its cursor) before a lookup, so an entry stored by any worker is
a candidate on every worker from the next lookup on. The stream is trimmed to about
``maxlen`` records (``XADD MAXLEN ~``), the newest kept: Redis runs with ``noeviction`` (the
history lives in it), so the cache bounds itself. Entry ids come from one counter
(``P:semantic:ids``), so they are unique across processes; the tier's version (DESIGN.md §3.10)
is one counter too (``P:semantic:version``), moved past by a resumed run.

Redis 8's vector sets (``VADD``/``VSIM``) could answer the search in Redis itself; this store
reports whether the server has them (:meth:`RedisVectorLog.has_vector_sets`) but searches
locally either way — Debian's Redis 7 has none, and the local index is what is tested.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from continuum.store.redis_client import BUMP_VERSION, RedisTarget

FIELDS = ("id", "partition", "query", "version", "text", "tokens", "finish_reason",
          "prompt_tokens")  # fmt: skip
BATCH = 1000  # records per XREAD


class RedisVectorLog:
    """Entries as ``(fields, vector)`` pairs, ``fields`` holding :data:`FIELDS`;
    :class:`~continuum.errors.StoreUnavailable` when Redis cannot be reached."""

    def __init__(self, target: RedisTarget, *, maxlen: int = 100_000) -> None:
        self.target = target
        self.maxlen = maxlen
        self._stream = target.key("semantic", "stream")
        self._ids = target.key("semantic", "ids")
        self._version = target.key("semantic", "version")

    def next_id(self) -> int:
        return int(self.target.call(self.target.client.incr, self._ids))

    def append(self, fields: dict[str, Any], vector: np.ndarray) -> str:
        """Store one entry; the stream id it got."""
        record: dict[str, str | bytes] = {k: json.dumps(fields[k]) for k in FIELDS}
        record["vector"] = np.asarray(vector, np.float32).tobytes()
        sid = self.target.call(
            self.target.client.xadd, self._stream, record, maxlen=self.maxlen, approximate=True
        )
        return sid.decode() if isinstance(sid, bytes) else str(sid)

    def since(self, cursor: str) -> tuple[str, list[tuple[dict[str, Any], np.ndarray]]]:
        """Every entry after stream id ``cursor`` ("0" for all), and the new cursor."""
        out: list[tuple[dict[str, Any], np.ndarray]] = []
        while True:
            reply = self.target.call(self.target.client.xread, {self._stream: cursor}, count=BATCH)
            records = reply[0][1] if reply else []
            for sid, raw in records:
                cursor = sid.decode()
                fields = {k: json.loads(raw[k.encode()]) for k in FIELDS}
                out.append((fields, np.frombuffer(raw[b"vector"], dtype=np.float32).copy()))
            if len(records) < BATCH:
                return cursor, out

    def version(self) -> int:
        return int(self.target.call(self.target.client.get, self._version) or 1)

    def bump(self, above: int) -> int:
        """Move the shared version past both itself and ``above``; the version now."""
        return int(self.target.run("semantic_bump", BUMP_VERSION, [self._version], [above]))

    def has_vector_sets(self) -> bool:
        """Whether the server has Redis 8's vector sets (``VADD``)."""
        # one command name, so redis-py returns the raw reply: [None] for an unknown command
        info = self.target.call(self.target.client.execute_command, "COMMAND INFO", "VADD")
        return bool(info and info[0])


__all__ = ["FIELDS", "RedisVectorLog"]
