"""One Redis connection for the shared stores: the URL they are selected by, the key prefix they
write under, and the one place where Redis errors become continuum's.

``--store redis://[:password@]host:port[/db][?prefix=name]`` selects the Redis stores (the
history, memo results, KV snapshots). ``prefix`` (default ``continuum``) starts every key, so
several deployments can share one Redis. Every call goes through :meth:`RedisTarget.call`:
a connection that fails or times out is :class:`~continuum.errors.StoreUnavailable` (the server
answers 503), any other Redis error a :class:`~continuum.errors.StoreError`; neither leaves a
half-written turn, because every multi-key write is one Lua script (atomic in Redis).

Durability is Redis's: with ``appendonly yes`` and ``appendfsync always`` a committed turn
survives a Redis crash (``deploy/redis.conf``). A server without AOF is allowed, with a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from continuum.errors import InvalidRequest, MissingExtra, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
SCHEMES = ("redis", "rediss", "unix")
DEFAULT_PREFIX = "continuum"


def is_redis_url(target: object) -> bool:
    """Whether ``--store``'s value names a Redis server rather than a SQLite file."""
    return isinstance(target, str) and target.split("://", 1)[0] in SCHEMES and "://" in target


def redacted(url: str) -> str:
    """``url`` without its password: what errors and logs may show."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


# KEYS: a version counter; ARGV: above. Moves the counter past itself and ``above`` (a resumed
# run's saved version) and returns it: shared versions only grow (DESIGN.md §3.10).
BUMP_VERSION = """
local v = tonumber(redis.call('GET', KEYS[1]) or '1')
local above = tonumber(ARGV[1])
if above > v then v = above end
v = v + 1
redis.call('SET', KEYS[1], v)
return v
"""


class RedisTarget:
    """A Redis client bound to one URL and key prefix; thread-safe (redis-py pools sockets).

    ``timeout_s`` bounds every socket operation, so an unreachable server fails a request in
    that time rather than hanging it."""

    def __init__(self, url: str, *, timeout_s: float = 2.0) -> None:
        if not is_redis_url(url):
            raise InvalidRequest(
                f"{url!r} is not a Redis URL; use redis://host:port[/db][?prefix=name]"
            )
        try:
            import redis
        except ImportError:  # pragma: no cover - redis is a base dependency
            raise MissingExtra("the Redis store", "redis", "redis") from None
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.prefix = query.pop("prefix", DEFAULT_PREFIX)
        if not self.prefix or any(c in self.prefix for c in " {}"):
            raise InvalidRequest(f"Redis key prefix {self.prefix!r}: use letters, digits, - or _")
        self.url = redacted(url)
        db = parts.path.strip("/")
        if parts.scheme != "unix" and db and not db.isdigit():
            raise InvalidRequest(f"Redis URL {self.url}: the database {db!r} is not a number")
        bare = urlunsplit(parts._replace(query=urlencode(query)))
        self._errors = redis.RedisError
        self._down = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._scripts: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.schema_ready = False  # redis_schema.ready() checked this prefix's schema
        try:
            # Any: redis-py types every reply as a union of bytes, str and more
            self.client: Any = redis.Redis.from_url(
                bare, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        except ValueError as e:
            raise InvalidRequest(f"Redis URL {self.url}: {e}") from None

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one client call, translating Redis errors (see the module docstring)."""
        with self.errors():
            return fn(*args, **kwargs)

    @contextmanager
    def errors(self) -> Iterator[None]:
        try:
            yield
        except self._down as e:  # its text names the address: logged, not sent to clients
            log.debug("Redis at %s: %s", self.url, e)
            raise StoreUnavailable(self.url, type(e).__name__) from None
        except self._errors as e:
            raise StoreError(self.url, f"Redis refused the operation ({e})") from None

    def script(self, name: str, source: str) -> Any:
        """A registered Lua script (EVALSHA, loaded again by redis-py after a Redis restart)."""
        with self._lock:
            if name not in self._scripts:
                self._scripts[name] = self.client.register_script(source)
            return self._scripts[name]

    def run(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        return self.call(self.script(name, source), keys=keys, args=args)

    def ping(self) -> None:
        """Check the server answers (:class:`StoreUnavailable` if not), and warn once when it
        would lose acknowledged writes in a crash (no AOF)."""
        self.call(self.client.ping)
        try:
            conf = self.client.config_get("appendonly")
        except self._errors:  # CONFIG is often disabled on managed Redis
            return
        if conf.get("appendonly", b"yes") in (b"no", "no"):
            log.warning(
                "Redis at %s runs without AOF (appendonly no): a Redis crash can lose committed "
                "turns; see deploy/redis.conf",
                self.url,
            )

    def close(self) -> None:
        self.client.close()


__all__ = ["BUMP_VERSION", "DEFAULT_PREFIX", "SCHEMES", "RedisTarget", "is_redis_url", "redacted"]
