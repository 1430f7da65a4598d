"""The Redis stores' schema version: one key per prefix, moved by numbered steps like SQLite's.

SQLite files carry ``PRAGMA user_version`` and a list of migrations
(:mod:`continuum.store.migrations`); a Redis prefix carries ``<prefix>:schema``, an integer,
and :data:`STEPS`, numbered ``1..N`` and validated by the same :func:`latest_version`. The
promises match:

* A prefix whose version is newer than :data:`STEPS` is refused with
  :class:`~continuum.errors.StoreError` before anything is written: a worker of an older
  continuum never writes keys a newer one laid out differently.
* Steps run in order, each under a lock key (``<prefix>:schema:lock``, with an expiry so a
  killed process cannot hold it), which reads the version again first: workers starting
  together apply each step once. A step records its version when it is done; one stopped
  half way runs again at the next start, so a step must be safe to repeat.
* A prefix with no version key (a fresh one, or keys written before versions existed) gets
  every step; step 1 is the layout those keys already have, so it changes nothing.

Every store checks it when it connects (:func:`ready`), once per connection.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from continuum.errors import StoreError
from continuum.store.migrations import MigrationResult, latest_version
from continuum.store.redis_client import RedisTarget

LOCK_MS = 60_000  # a lock left by a killed process expires after this
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class RedisStep:
    """One step of the Redis layout: after it, ``<prefix>:schema`` is ``version``. ``apply``
    changes the keys (None: nothing to change); it must be safe to run again."""

    version: int
    name: str
    apply: Callable[[RedisTarget], None] | None = None


STEPS: tuple[RedisStep, ...] = (
    RedisStep(
        1,
        "the first layout: sessions (hash, message lists, turns, resets), responses, KV "
        "snapshots, memo results, semantic vectors, the memory graph",
    ),
)
SCHEMA_VERSION = latest_version(STEPS)


def version(target: RedisTarget) -> int:
    """The prefix's schema version (0: none recorded)."""
    raw = target.call(target.client.get, target.key("schema"))
    return int(raw) if raw is not None else 0


def migrate(target: RedisTarget, steps: Sequence[RedisStep] = STEPS) -> MigrationResult:
    """Bring the prefix up to the last of ``steps`` (see the module docstring)."""
    latest = latest_version(steps)
    before = version(target)
    if before > latest:
        raise StoreError(
            target.url,
            f"Redis schema {before} (key {target.key('schema')}) is newer than this continuum "
            f"reads (schema version {before} > {latest}): it was written by a newer continuum. "
            "Upgrade continuum, or give the URL another ?prefix=; nothing in Redis was changed",
        )
    applied = []
    for step in steps[before:]:
        with _locked(target):
            if version(target) >= step.version:  # another worker got there first
                continue
            if step.apply is not None:
                step.apply(target)
            target.call(target.client.set, target.key("schema"), step.version)
            applied.append(step.name)
    return MigrationResult(before, version(target), tuple(applied))


def ready(target: RedisTarget) -> None:
    """Ping the server and bring its prefix's schema up to date, once per target."""
    if target.schema_ready:
        return
    target.ping()
    migrate(target)
    target.schema_ready = True


class _locked:
    def __init__(self, target: RedisTarget) -> None:
        self.target, self.token = target, uuid.uuid4().hex
        self.key = target.key("schema", "lock")

    def __enter__(self) -> None:
        deadline = time.monotonic() + LOCK_MS / 1000
        client = self.target.client
        while not self.target.call(client.set, self.key, self.token, nx=True, px=LOCK_MS):
            if time.monotonic() > deadline:
                raise StoreError(self.target.url, f"the schema lock {self.key} was never freed")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.target.run("schema_unlock", _UNLOCK, [self.key], [self.token])


__all__ = ["SCHEMA_VERSION", "STEPS", "RedisStep", "migrate", "ready", "version"]
