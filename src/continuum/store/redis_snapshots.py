"""KV snapshots shared through Redis: the :class:`SnapshotStore` of a fleet.

A RAM LRU in front (a :class:`~continuum.store.snapshots.FileSnapshotStore` with no directory,
so this process's parked sessions cost no round trip), and Redis behind it in place of a
directory: an entry pushed out of RAM, a durable put and a flush are written to Redis, where
any worker can read them back (``SnapshotHit.source == "shared"``).

In Redis, under the target's prefix ``P``, an entry is the file format of
:mod:`continuum.store.snapshot_format` (header with model, context config, tokens and
checksums) cut into chunks of ``chunk_bytes``::

    P:kv:meta:<h>        hash    key nbytes chunks gen      (h: blake2b of the key)
    P:kv:blob:<h>:<gen>:<i>      the chunks of generation gen
    P:kv:lru             zset    h scored by last use (any worker's)
    P:kv:bytes           string  the sum of every entry's nbytes

A write sets its chunks under a fresh generation (with an expiry, so a writer that dies leaves
nothing for long), then one Lua script makes them the entry, deletes the old generation, and
deletes the least recently used entries while the total is over ``budget_bytes`` — never the
entry just written. A reader fetches the meta and then the chunks; a generation replaced
meanwhile is a miss, and a blob that fails its checksum is deleted and a
:class:`~continuum.errors.SnapshotError`. A failed write (Redis down) keeps the RAM copy and is
counted, never raised: snapshots are an optimisation, the history is authoritative.

Two things differ from the file store on purpose (the contract tests pin them): a put kept in
RAM leaves an older entry of the key in Redis until the new one is written there (a park costs
no round trip; a worker that restores the older entry keeps only the prefix it shares with the
history), and an entry this process rejects for another model or context stays in Redis for
the workers that run that model.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, NoReturn

from continuum.errors import SnapshotError, StoreError
from continuum.store.base import SnapshotEntry, SnapshotHit, SnapshotStats, SnapshotStore
from continuum.store.redis_client import RedisTarget
from continuum.store.snapshot_format import decode_entry, encode_entry
from continuum.store.snapshots import FileSnapshotStore

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20
ORPHAN_TTL_S = 3600  # chunks of a write that never committed expire after this

# KEYS: meta lru bytes; ARGV: key nbytes chunks gen h now budget blob-prefix meta-prefix
_COMMIT = """
local old = redis.call('HMGET', KEYS[1], 'nbytes', 'chunks', 'gen')
local delta = tonumber(ARGV[2])
if old[1] then
  delta = delta - tonumber(old[1])
  for i = 0, tonumber(old[2]) - 1 do
    redis.call('DEL', ARGV[8] .. ARGV[5] .. ':' .. old[3] .. ':' .. i)
  end
end
for i = 0, tonumber(ARGV[3]) - 1 do
  redis.call('PERSIST', ARGV[8] .. ARGV[5] .. ':' .. ARGV[4] .. ':' .. i)
end
redis.call('HSET', KEYS[1], 'key', ARGV[1], 'nbytes', ARGV[2], 'chunks', ARGV[3], 'gen', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[5])
local total = redis.call('INCRBY', KEYS[3], delta)
local evicted = 0
local budget = tonumber(ARGV[7])
while budget >= 0 and total > budget do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 1)
  local victim = oldest[1]
  if victim == ARGV[5] then victim = oldest[2] end
  if not victim then break end
  local m = redis.call('HMGET', ARGV[9] .. victim, 'nbytes', 'chunks', 'gen')
  if m[1] then
    for i = 0, tonumber(m[2]) - 1 do
      redis.call('DEL', ARGV[8] .. victim .. ':' .. m[3] .. ':' .. i)
    end
    total = redis.call('DECRBY', KEYS[3], tonumber(m[1]))
  end
  redis.call('DEL', ARGV[9] .. victim)
  redis.call('ZREM', KEYS[2], victim)
  evicted = evicted + 1
end
return evicted
"""
# KEYS: meta lru bytes; ARGV: h blob-prefix
_DELETE = """
local m = redis.call('HMGET', KEYS[1], 'nbytes', 'chunks', 'gen')
redis.call('ZREM', KEYS[2], ARGV[1])
if not m[1] then return 0 end
for i = 0, tonumber(m[2]) - 1 do
  redis.call('DEL', ARGV[2] .. ARGV[1] .. ':' .. m[3] .. ':' .. i)
end
redis.call('DECRBY', KEYS[3], tonumber(m[1]))
redis.call('DEL', KEYS[1])
return 1
"""


def _digest(key: str) -> str:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _mark(entry: SnapshotEntry) -> tuple[str, int, str]:
    """What identifies an entry's state: its chained prefix hash (DESIGN.md §3.5), size and
    model."""
    return entry.prefix_hash, entry.nbytes, entry.model


class RedisSnapshotStore:
    """Parked and layer KV in a RAM LRU, written back to Redis (see the module docstring)."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        ram_budget_bytes: int = 256 << 20,
        budget_bytes: int | None = 4 << 30,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if (budget_bytes is not None and budget_bytes < 0) or chunk_bytes <= 0:
            raise ValueError("snapshot budgets are byte counts (>= 0), chunks > 0 bytes")
        self.target = target
        self.budget_bytes = budget_bytes
        self.chunk_bytes = chunk_bytes
        self._ram = FileSnapshotStore(ram_budget_bytes=ram_budget_bytes, on_evict=self._keep)
        self._lock = threading.RLock()
        # what this process knows Redis holds under a key (not the entry: no payload kept)
        self._shared: dict[str, tuple[str, int, str]] = {}
        self._counts = {"writes": 0, "evictions": 0, "errors": 0, "rejected": 0}
        k = target.key
        self._lru, self._bytes = k("kv", "lru"), k("kv", "bytes")
        self._meta, self._blob = k("kv", "meta", ""), k("kv", "blob", "")

    # -- the public contract --------------------------------------------------------------------
    def put(self, key: str, entry: SnapshotEntry, *, durable: bool = False) -> None:
        """Keep ``entry`` in RAM; ``durable`` also writes it to Redis now."""
        with self._lock:
            if self._shared.get(key) != _mark(entry):
                self._shared.pop(key, None)
            self._ram.put(key, entry)
            if durable:
                self._write(key, entry)

    def get(self, key: str, *, model: str, ctx: dict[str, Any]) -> SnapshotHit | None:
        """From RAM, else from Redis (``source == "shared"``); None if neither has it."""
        with self._lock:
            hit = self._ram.get(key, model=model, ctx=ctx)  # SnapshotError: RAM copy dropped
            if hit is not None:
                return hit
            entry = self._read(key, model, ctx)
            if entry is None:
                return None
            self._ram.put(key, entry)
            self._shared[key] = _mark(entry)
            return SnapshotHit(entry, "shared")

    def delete(self, key: str) -> bool:
        """Forget ``key`` here and in Redis; False if neither held it."""
        with self._lock:
            self._shared.pop(key, None)
            here = self._ram.delete(key)
            try:
                gone = self.target.run(
                    "kv_delete", _DELETE, self._keys(key), [_digest(key), self._blob]
                )
            except StoreError as e:
                log.warning("could not delete KV snapshot %r from Redis: %s", key, e)
                gone = 0
            return here or bool(gone)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        if key in self._ram:
            return True
        try:
            return bool(self.target.call(self.target.client.exists, self._meta + _digest(key)))
        except StoreError:
            return False

    def flush(self, key: str) -> bool:
        """Write ``key``'s RAM entry to Redis if it is not there yet; True if it is there."""
        with self._lock:
            hit = self._ram.peek(key)
            if hit is None:
                return key in self
            return self._write(key, hit)

    def flush_all(self) -> int:
        with self._lock:
            return sum(self.flush(key) for key in self._ram.keys())  # noqa: SIM118 (a store)

    def release_ram(self, key: str | None = None) -> int:
        """Give up RAM copies (every key: None), writing to Redis what is not there yet."""
        with self._lock:
            return self._ram.release_ram(key)  # each leaves through _keep

    def keys(self) -> list[str]:
        """Every key held in RAM or in Redis (Redis's in its use order)."""
        out = self._ram.keys()
        seen = set(out)
        try:
            digests = self.target.call(self.target.client.zrange, self._lru, 0, -1)
            metas = [self._meta + bytes(d).decode() for d in digests]
            pipe = self.target.client.pipeline(transaction=False)
            for m in metas:
                pipe.hget(m, "key")
            names = self.target.call(pipe.execute)
        except StoreError:
            return out
        out += [k.decode() for k in names if k is not None and k.decode() not in seen]
        return out

    def stats(self) -> SnapshotStats:
        ram = self._ram.stats()
        try:
            shared_bytes = int(self.target.call(self.target.client.get, self._bytes) or 0)
            shared_entries = int(self.target.call(self.target.client.zcard, self._lru))
        except StoreError:
            shared_bytes = shared_entries = 0
        c = self._counts
        return SnapshotStats(
            ram_bytes=ram.ram_bytes,
            ram_entries=ram.ram_entries,
            disk_bytes=shared_bytes,
            disk_files=shared_entries,
            ram_evictions=ram.ram_evictions,
            disk_writes=c["writes"],
            disk_evictions=c["evictions"],
            disk_errors=c["errors"],
            tmp_swept=0,
            rejected=ram.rejected + c["rejected"],
        )

    # -- Redis ---------------------------------------------------------------------------------
    def _keys(self, key: str) -> list[str]:
        return [self._meta + _digest(key), self._lru, self._bytes]

    def _keep(self, key: str, entry: SnapshotEntry) -> None:
        """An entry leaving RAM: written to Redis unless it is there already."""
        self._write(key, entry)

    def _write(self, key: str, entry: SnapshotEntry) -> bool:
        """Write ``entry`` to Redis (see the module docstring); False if it is not kept."""
        if self._shared.get(key) == _mark(entry):
            return True
        blob = encode_entry(key, entry)
        if self.budget_bytes is not None and len(blob) > self.budget_bytes:
            self._counts["errors"] += 1
            log.warning(
                "KV snapshot %r is %d bytes, over the whole Redis budget of %d; not written",
                key,
                len(blob),
                self.budget_bytes,
            )
            return False
        h, gen = _digest(key), uuid.uuid4().hex[:12]
        n = max(1, -(-len(blob) // self.chunk_bytes))
        try:
            pipe = self.target.client.pipeline(transaction=False)
            for i in range(n):
                part = blob[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]
                pipe.set(f"{self._blob}{h}:{gen}:{i}", part, ex=ORPHAN_TTL_S)
            self.target.call(pipe.execute)
            budget = -1 if self.budget_bytes is None else self.budget_bytes
            args = [key, len(blob), n, gen, h, repr(time.time()), budget, self._blob, self._meta]
            evicted = self.target.run("kv_commit", _COMMIT, self._keys(key), args)
        except StoreError as e:
            self._counts["errors"] += 1
            log.warning("could not write KV snapshot %r to Redis: %s (kept in RAM)", key, e)
            return False
        self._counts["writes"] += 1
        self._counts["evictions"] += int(evicted)
        self._shared[key] = _mark(entry)
        return True

    def _read(self, key: str, model: str, ctx: dict[str, Any]) -> SnapshotEntry | None:
        h = _digest(key)
        try:
            meta = self.target.call(
                self.target.client.hmget, self._meta + h, ("key", "chunks", "gen")
            )
            if meta[0] is None:
                return None
            n, gen = int(meta[1]), bytes(meta[2]).decode()
            parts = self.target.call(
                self.target.client.mget, [f"{self._blob}{h}:{gen}:{i}" for i in range(n)]
            )
            if any(p is None for p in parts):
                return None  # replaced or evicted while we read: a miss, not corruption
            self.target.call(self.target.client.zadd, self._lru, {h: time.time()})
        except StoreError as e:
            log.warning("could not read KV snapshot %r from Redis: %s", key, e)
            return None
        try:
            return decode_entry(b"".join(parts), key, model=model, ctx=ctx)
        except SnapshotError as e:
            self._reject(key, str(e))

    def _reject(self, key: str, problem: str) -> NoReturn:
        self._counts["rejected"] += 1
        self.delete(key)
        raise SnapshotError(f"KV snapshot {key!r} rejected and deleted: {problem}")


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: RedisSnapshotStore) -> SnapshotStore:
        return store


__all__ = ["CHUNK_BYTES", "RedisSnapshotStore"]
