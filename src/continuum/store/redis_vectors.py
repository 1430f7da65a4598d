"""The semantic tier's entries in Redis: the source of truth a fleet shares, as one stream.

Every stored entry (its fields and its float32 vector) is one record of the stream
``P:semantic:stream``; each process mirrors the stream into its own ANN index by reading what it
has not seen yet (``XREAD`` from its cursor) before a lookup, so an entry stored by any worker is
a candidate on every worker from the next lookup on. The stream is trimmed to about
``maxlen`` records (``XADD MAXLEN ~``), the newest kept: Redis runs with ``noeviction`` (the
history lives in it), so the cache bounds itself. Entry ids come from one counter
(``P:semantic:ids``), so they are unique across processes; the tier's version (DESIGN.md §3.10)
is one counter too (``P:semantic:version``), moved past by a resumed run.

A record this code cannot decode (a field missing or of the wrong type, bad JSON, a torn
vector: written by another version, or by hand) is skipped and reported, never raised: the
cursor moves past it, so one bad record cannot fail every lookup on every worker.

Redis 8's vector sets (``VADD``/``VSIM``) could answer the search in Redis itself; this store
reports whether the server has them (:meth:`RedisVectorLog.has_vector_sets`) but searches
locally either way — Debian's Redis 7 has none, and the local index is what is tested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from continuum.errors import StoreError
from continuum.store.redis_client import BUMP_VERSION, RedisTarget

FIELDS = ("id", "partition", "query", "version", "text", "tokens", "finish_reason",
          "prompt_tokens")  # fmt: skip
_INTS = ("id", "version", "prompt_tokens")
_STRS = ("partition", "query", "text", "finish_reason")
BATCH = 1000  # records per XREAD


@dataclass(frozen=True, slots=True)
class LogRead:
    """What :meth:`RedisVectorLog.since` read: the entries, and the records it skipped."""

    cursor: str  # the last record read, decoded or not: the next read starts after it
    entries: tuple[tuple[dict[str, Any], np.ndarray], ...]
    malformed: tuple[str, ...] = ()  # "<stream id>: <what is wrong>", one per skipped record


def decode_record(raw: dict[bytes, bytes]) -> tuple[dict[str, Any], np.ndarray]:
    """One stream record's fields and vector; :class:`ValueError` saying what is wrong when
    it is not exactly what :meth:`RedisVectorLog.append` writes."""
    names = {k.decode(errors="replace") for k in raw}
    missing, extra = set(FIELDS) - names - {"vector"}, names - set(FIELDS) - {"vector"}
    if missing or extra or "vector" not in names:
        raise ValueError(
            f"fields missing {sorted(missing | ({'vector'} - names))}, unexpected {sorted(extra)}"
        )
    fields = {k: json.loads(raw[k.encode()]) for k in FIELDS}  # JSONDecodeError is ValueError
    for k in _INTS:
        if type(fields[k]) is not int:
            raise ValueError(f"{k} is {fields[k]!r}, not an integer")
    for k in _STRS:
        if not isinstance(fields[k], str):
            raise ValueError(f"{k} is {type(fields[k]).__name__}, not a string")
    tokens = fields["tokens"]
    if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
        raise ValueError("tokens is not a list of token ids")
    blob = raw[b"vector"]
    if len(blob) % 4:
        raise ValueError(f"the vector is {len(blob)} bytes, not a whole number of float32")
    return fields, np.frombuffer(blob, dtype=np.float32).copy()


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

    def since(self, cursor: str) -> LogRead:
        """Every entry after stream id ``cursor`` ("0" for all), and the new cursor (past any
        record that could not be decoded: see the module docstring)."""
        out: list[tuple[dict[str, Any], np.ndarray]] = []
        malformed: list[str] = []
        while True:
            reply = self.target.call(self.target.client.xread, {self._stream: cursor}, count=BATCH)
            records = reply[0][1] if reply else []
            for sid, raw in records:
                cursor = sid.decode()
                try:
                    out.append(decode_record(raw))
                except (ValueError, UnicodeDecodeError) as e:
                    malformed.append(f"{cursor}: {e}")
            if len(records) < BATCH:
                return LogRead(cursor, tuple(out), tuple(malformed))

    def version(self) -> int:
        raw = self.target.call(self.target.client.get, self._version) or b"1"
        try:
            return int(raw)
        except ValueError:
            raise StoreError(
                self.target.url,
                f"{self._version} holds {raw!r}, not a version number; SET it to the highest "
                "semantic version a worker reports (never lower: old entries would be served)",
            ) from None

    def bump(self, above: int) -> int:
        """Move the shared version past both itself and ``above``; the version now."""
        return int(self.target.run("semantic_bump", BUMP_VERSION, [self._version], [above]))

    def has_vector_sets(self) -> bool:
        """Whether the server has Redis 8's vector sets (``VADD``)."""
        # one command name, so redis-py returns the raw reply: [None] for an unknown command
        info = self.target.call(self.target.client.execute_command, "COMMAND INFO", "VADD")
        return bool(info and info[0])


__all__ = ["FIELDS", "LogRead", "RedisVectorLog", "decode_record"]
