"""What ``openai_http`` adds to a request for the fleet behind it: the tenant's cache salt, the
conversation's affinity key, and the router's session token echoed back.

Three promises, each pinned by ``tests/backends/test_openai_http_fleet.py``:

- **The salt is the tenant's.** Every request carries, in the field(s) the upstream reads
  (vLLM's ``cache_salt``, SGLang's ``extra_key``), a digest of the request's namespace and the
  configured secret. Two tenants never share a salt, and nothing else writes those fields: the
  body is built from the op alone, and a client's own ``cache_salt`` or ``extra_key`` sent to
  ``continuum serve`` is accepted and dropped there. A request that names no tenant (``""``: a
  backend used directly, outside an engine) gets the salt of the empty namespace: a partition
  of its own, shared with no tenant and with no client of the upstream that sends no salt.
- **The affinity key is the conversation's.** A request that belongs to a conversation carries
  a digest of (tenant, conversation) in the configured header (``X-Session-ID`` by default; the
  vLLM router hashes on it, the production-stack router on ``x-user-id``, SGLang's gateway on
  ``X-SMG-Routing-Key``) and, for OpenAI, as ``prompt_cache_key``. Digested, so one tenant's
  ``"chat-1"`` is not another's and no tenant name leaves the process. A request with no
  conversation carries none: the router balances it as it likes.
- **A router's session token goes back to the session that got it.** llm-d's session-affinity
  scorer answers with the pod it chose, as an ``x-session-token`` header (earlier releases) or
  an ``llm-d-session`` cookie (later ones); the next request of *that* conversation sends it
  back, and no other conversation's does. The map is bounded (least recently used first out).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any

from continuum.backends.base import RequestRoute
from continuum.errors import BackendConfigError
from continuum.hashing import canonical_json, digest
from continuum.settings import Settings, setting

# salt_field -> the body fields the salt goes in
SALT_FIELDS: dict[str, tuple[str, ...]] = {
    "cache_salt": ("cache_salt",),  # vLLM >= 0.9 (SGLang reads it too)
    "extra_key": ("extra_key",),  # SGLang
    "both": ("cache_salt", "extra_key"),
    "none": (),
}
SESSION_TOKEN_HEADER = "x-session-token"  # llm-d's session-affinity scorer, as a header
SESSION_COOKIE = "llm-d-session"  # the same, as a cookie in later llm-d releases
# headers the backend sets itself: an affinity header of one of these names would clobber it
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "content-type",
        "content-length",
        "host",
        "cookie",
        "connection",
        "transfer-encoding",
        "accept",
        "accept-encoding",
        SESSION_TOKEN_HEADER,
    }
)
TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name (RFC 9110 token)


@dataclass(frozen=True, slots=True)
class UpstreamRouting:
    """How ``openai_http`` tells the fleet behind it whose request this is.

    ``salt_field``: ``"cache_salt"`` (vLLM), ``"extra_key"`` (SGLang), ``"both"`` or ``"none"``
    (OpenAI, which refuses unknown fields, and servers without a salt, such as llama-server).
    ``salt_secret`` keeps salts unguessable from tenant names. ``affinity_header``: the header
    the router hashes on, or None for none. ``prompt_cache_key``: also send the affinity key as
    OpenAI's ``prompt_cache_key``. ``max_sessions``: router session tokens remembered."""

    salt_field: str = "none"
    salt_secret: str | None = None
    affinity_header: str | None = "X-Session-ID"
    prompt_cache_key: bool = False
    max_sessions: int = 4096

    def __post_init__(self) -> None:
        if self.salt_field not in SALT_FIELDS:
            raise BackendConfigError(
                "salt_field",
                self.salt_field,
                f"use one of {', '.join(SALT_FIELDS)}: cache_salt for vLLM >= 0.9, extra_key "
                "for SGLang, none for OpenAI (which refuses unknown fields) and for servers "
                "without a salt (llama-server)",
            )
        if self.salt_secret is not None and not (
            isinstance(self.salt_secret, str) and self.salt_secret
        ):
            raise BackendConfigError(
                "salt_secret", self.salt_secret, "give a non-empty secret, or leave it unset"
            )
        if self.affinity_header is not None:
            _check_header(self.affinity_header)
        if not isinstance(self.prompt_cache_key, bool):
            raise BackendConfigError("prompt_cache_key", self.prompt_cache_key, "use True/False")
        if (
            isinstance(self.max_sessions, bool)
            or not isinstance(self.max_sessions, int)
            or self.max_sessions < 1
        ):
            raise BackendConfigError(
                "max_sessions", self.max_sessions, "use an int >= 1 (router tokens remembered)"
            )

    def salt(self, namespace: str) -> str:
        """The tenant's salt: stable across processes and machines, unique per namespace."""
        payload = canonical_json(["cache-salt", self.salt_secret or "", namespace])
        return digest(payload, person=b"cont-salt")

    def affinity(self, route: RequestRoute) -> str | None:
        """The conversation's affinity key, or None when the request names no conversation."""
        if route.session is None:
            return None
        payload = canonical_json(
            ["affinity", self.salt_secret or "", route.namespace, route.session]
        )
        return digest(payload, person=b"cont-affinity")

    def stamp(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        route: RequestRoute,
        tokens: SessionTokens,
    ) -> str | None:
        """Write the route into ``body`` and ``headers``; the affinity key sent, if any."""
        salt = self.salt(route.namespace)
        for name in SALT_FIELDS[self.salt_field]:
            body[name] = salt
        key = self.affinity(route)
        if key is None:
            return None
        if self.affinity_header is not None:
            headers[self.affinity_header] = key
        if self.prompt_cache_key:
            body["prompt_cache_key"] = key
        headers.update(tokens.echo(key))
        return key


def _check_header(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise BackendConfigError(
            "affinity_header",
            name,
            "name the header the router hashes on (X-Session-ID, x-user-id, X-SMG-Routing-Key),"
            " or pass None for no header",
        )
    if not TOKEN.match(name):
        raise BackendConfigError(
            "affinity_header", name, "a header name is letters, digits and !#$%&'*+-.^_`|~ only"
        )
    if name.lower() in RESERVED_HEADERS:
        raise BackendConfigError(
            "affinity_header",
            name,
            "the backend sets that header itself: choose the one your router hashes on",
        )


class SessionTokens:
    """Router session tokens by affinity key, least recently used first out. Thread-safe.

    Invariant: ``echo(key)`` returns only what a response to a request sent with ``key``
    carried; a token never crosses from one affinity key to another."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._tokens: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tokens)

    def echo(self, key: str) -> dict[str, str]:
        """The headers that send ``key``'s tokens back (none before its first answer)."""
        with self._lock:
            got = self._tokens.get(key)
            if got is None:
                return {}
            self._tokens.move_to_end(key)
        out = {}
        if SESSION_TOKEN_HEADER in got:
            out[SESSION_TOKEN_HEADER] = got[SESSION_TOKEN_HEADER]
        if SESSION_COOKIE in got:
            out["cookie"] = f"{SESSION_COOKIE}={got[SESSION_COOKIE]}"
        return out

    def record(self, key: str, header_token: str | None, set_cookies: list[str]) -> None:
        """Keep what a response to ``key``'s request said (a newer token replaces an older)."""
        got: dict[str, str] = {}
        if header_token:
            got[SESSION_TOKEN_HEADER] = header_token
        cookie = _session_cookie(set_cookies)
        if cookie:
            got[SESSION_COOKIE] = cookie
        if not got:
            return
        with self._lock:
            merged = {**self._tokens.pop(key, {}), **got}
            self._tokens[key] = merged
            while len(self._tokens) > self.capacity:
                self._tokens.popitem(last=False)


def _session_cookie(set_cookies: list[str]) -> str | None:
    """llm-d's session cookie among ``Set-Cookie`` values; a malformed one is ignored."""
    for raw in set_cookies:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except CookieError:
            continue
        morsel = jar.get(SESSION_COOKIE)
        if morsel is not None and morsel.value:
            return morsel.value
    return None


def routing_from(value: UpstreamRouting | Mapping[str, Any] | None) -> UpstreamRouting:
    """The routing settings from an ``UpstreamRouting``, a dict of its fields, or None."""
    if value is None:
        return UpstreamRouting()
    if isinstance(value, UpstreamRouting):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - set(UpstreamRouting.__dataclass_fields__)
        if unknown:
            raise BackendConfigError(
                "routing",
                sorted(unknown),
                f"unknown field(s); UpstreamRouting takes "
                f"{', '.join(UpstreamRouting.__dataclass_fields__)}",
            )
        return UpstreamRouting(**value)
    raise BackendConfigError("routing", value, "pass an UpstreamRouting (or a dict of its fields)")


class UpstreamSettings(Settings):
    """``openai_http``'s settings: the server it forwards to, and how it routes there."""

    upstream: str | None = setting(
        None,
        "With --backend openai_http: the OpenAI-compatible server's base URL (…/v1); the "
        "reuse stack runs in front of it (API key from CONTINUUM_UPSTREAM_API_KEY).",
    )
    upstream_model: str | None = setting(None, "The upstream's model name.")
    upstream_api_key: str | None = setting(
        None,
        "The upstream's API key (sent as a bearer token); prefer the environment variable "
        "CONTINUUM_UPSTREAM_API_KEY, which a process list does not show.",
        envvar="CONTINUUM_UPSTREAM_API_KEY",
        secret=True,
    )
    upstream_salt_field: str = setting(
        "none",
        f"Where each request carries its tenant's cache salt (a digest of the tenant): "
        f"{', '.join(SALT_FIELDS)}. cache_salt for vLLM >= 0.9, extra_key for SGLang; none for "
        "OpenAI (it refuses unknown fields) and servers without a salt (llama-server).",
    )
    upstream_salt_secret: str | None = setting(
        None,
        "Secret mixed into every salt and affinity key, so they cannot be computed from "
        "tenant names (env CONTINUUM_UPSTREAM_SALT_SECRET).",
        envvar="CONTINUUM_UPSTREAM_SALT_SECRET",
        secret=True,
    )
    upstream_affinity_header: str = setting(
        "X-Session-ID",
        "Header carrying the conversation's affinity key for the router in front of the "
        "upstream: X-Session-ID (vLLM router), x-user-id (production-stack session routing), "
        "X-SMG-Routing-Key (SGLang gateway), or 'none'.",
    )
    upstream_prompt_cache_key: bool = setting(
        False, "Also send the affinity key as prompt_cache_key (OpenAI's cache routing hint)."
    )

    def routing(self) -> UpstreamRouting:
        """The routing these settings ask for (``affinity header none``: no header); a
        malformed one is a :class:`~continuum.errors.BackendConfigError`."""
        header = self.upstream_affinity_header
        return UpstreamRouting(
            salt_field=self.upstream_salt_field,
            salt_secret=self.upstream_salt_secret,
            affinity_header=None if header.lower() == "none" else header,
            prompt_cache_key=self.upstream_prompt_cache_key,
        )

    def check(self) -> None:
        self.routing()
        super().check()
