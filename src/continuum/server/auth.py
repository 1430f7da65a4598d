"""Who is calling, and from where: API keys bound to tenants, and the browser guards.

A :class:`KeyRing` maps API keys to tenants. Each key is held only as its SHA-256 digest (in
memory and in a keys file), and a presented key is compared with every digest in constant time
(:func:`hmac.compare_digest`, no early exit), so neither the file nor response timing tells an
attacker which keys exist. The tenant is what the key says; the ``X-Continuum-Tenant`` header
can only *narrow* within it (``tenant/sub``: a separate namespace for caches and sessions),
never name another tenant. With no key configured every caller is the one tenant ``default``
and the server says so at start.

SHA-256 without a salt is enough for keys made by :func:`new_key` (256 random bits: nothing to
guess offline); a short human-chosen key would not be, and :meth:`KeyRing.parse` refuses one.

Keys file: one ``TENANT sha256:HEX`` per line (``#`` comments), as ``continuum keys add``
writes it.

Browser guards (DNS rebinding, cross-site requests to a server on loopback): the ``Host``
header must name an allowed host (by default the loopback names when bound to loopback), and
an ``Origin`` header, which browsers send on cross-site requests, must name the same host.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from continuum.errors import InvalidRequest

DEFAULT_TENANT = "default"
TENANT_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MIN_KEY_CHARS = 16
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def check_tenant(name: str, what: str = "tenant") -> str:
    if not TENANT_PATTERN.fullmatch(name):
        raise InvalidRequest(
            f"{what} {name[:80]!r} is not a valid name: use 1-64 letters, digits, '_', '.' or '-'"
        )
    return name


def new_key() -> str:
    """A fresh API key: 256 random bits, URL-safe."""
    return "ck-" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Credential:
    tenant: str
    digest: bytes  # SHA-256 of the key

    @classmethod
    def of(cls, tenant: str, key: str) -> Credential:
        return cls(check_tenant(tenant), _digest(key))

    def line(self) -> str:
        return f"{self.tenant} sha256:{self.digest.hex()}"


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The configured keys; empty means no authentication (one tenant, ``default``)."""

    credentials: tuple[Credential, ...] = ()

    @property
    def open(self) -> bool:
        return not self.credentials

    @classmethod
    def parse(cls, specs: Iterable[str], files: Iterable[str | Path] = ()) -> KeyRing:
        """``TENANT=KEY`` specs (a bare ``KEY`` is tenant ``default``) and keys files."""
        creds: list[Credential] = []
        for spec in specs:
            tenant, sep, key = spec.partition("=")
            if not sep:
                tenant, key = DEFAULT_TENANT, spec
            if len(key) < MIN_KEY_CHARS:
                raise InvalidRequest(
                    f"the API key for tenant {tenant!r} has {len(key)} characters: use at least "
                    f"{MIN_KEY_CHARS} random ones (`continuum keys add` makes one)"
                )
            creds.append(Credential.of(tenant, key))
        for path in files:
            creds.extend(read_keys_file(Path(path)))
        digests = [c.digest for c in creds]
        if len(set(digests)) != len(digests):
            raise InvalidRequest("the same API key is given twice: each key names one tenant")
        return cls(tuple(creds))

    def tenant_of(self, presented: str) -> str | None:
        """The tenant ``presented`` is a key of, or None; the time taken does not depend on
        which key (if any) matches."""
        got, found = _digest(presented), None
        for cred in self.credentials:
            if hmac.compare_digest(got, cred.digest):
                found = cred.tenant
        return found

    def tenants(self) -> list[str]:
        return sorted({c.tenant for c in self.credentials})


def read_keys_file(path: Path) -> list[Credential]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        hint = "make one with `continuum keys add`"
        raise InvalidRequest(f"keys file {path}: {e.strerror}; {hint}") from None
    creds = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("sha256:") or not _is_hex64(parts[1][7:]):
            raise InvalidRequest(
                f"keys file {path} line {n}: expected 'TENANT sha256:<64 hex digits>', as "
                "`continuum keys add` writes it"
            )
        creds.append(Credential(check_tenant(parts[0]), bytes.fromhex(parts[1][7:])))
    return creds


def _is_hex64(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdef" for c in s.lower())


def namespace(tenant: str, narrowed: str | None) -> str:
    """The namespace of a request: the key's tenant, narrowed by the header's name."""
    if narrowed is None or narrowed.strip() in ("", tenant):
        return tenant
    return f"{tenant}/{check_tenant(narrowed.strip(), 'X-Continuum-Tenant')}"


def host_name(value: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8000`` -> ``::1``), lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_hosts_for(bind: str, extra: Sequence[str] = ()) -> tuple[str, ...] | None:
    """Hosts a server bound to ``bind`` answers to: the loopback names (plus ``extra``) on
    loopback; only ``extra`` elsewhere, or any host (None) when none is given."""
    names = tuple(host_name(h) for h in extra)
    if host_name(bind) in LOOPBACK_HOSTS:
        return LOOPBACK_HOSTS + names
    return names or None


def origin_allowed(origin: str | None, host: str) -> bool:
    """A request without ``Origin`` (not a browser's cross-site one) or from the server's own
    origin."""
    if origin is None:
        return True
    netloc = urlsplit(origin).netloc
    return bool(netloc) and netloc.lower() == host.strip().lower()
