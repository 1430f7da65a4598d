"""``BackendRegistry``: backend names to factories — built-ins and entry points alike.

A factory takes keyword options and returns an :class:`OpBackend`. Third-party packages
register theirs under the ``continuum.backends`` entry-point group; no if/elif chain on names.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from continuum.backends.base import Generation, OpBackend
from continuum.errors import InvalidRequest, UnknownBackend

ENTRY_POINT_GROUP = "continuum.backends"
__all__ = ["BackendRegistry", "Factory", "Generation", "OpBackend"]


Factory = Callable[..., OpBackend]


def _llamacpp(**options: Any) -> OpBackend:
    from continuum.backends.llamacpp_ops import LlamaCppOpBackend

    return LlamaCppOpBackend.from_options(**options)


def _openai_http(**options: Any) -> OpBackend:
    from continuum.backends.openai_http import OpenAIHTTPBackend

    return OpenAIHTTPBackend.from_options(**options)


class BackendRegistry:
    """Names to backend factories. ``llamacpp`` is built in; entry points add more."""

    def __init__(self, *, entry_points_group: str | None = ENTRY_POINT_GROUP) -> None:
        self._factories: dict[str, Factory] = {"llamacpp": _llamacpp, "openai_http": _openai_http}
        if entry_points_group:
            for ep in entry_points(group=entry_points_group):
                self._factories.setdefault(ep.name, _lazy(ep.load))

    def register(self, name: str, factory: Factory) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidRequest("a backend name must be a non-empty string")
        if not callable(factory):
            raise InvalidRequest(f"backend {name!r}: the factory must be callable")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> OpBackend:
        try:
            factory = self._factories[name]
        except KeyError:
            raise UnknownBackend(name, self.names()) from None
        return factory(**options)


def _lazy(load: Callable[[], Any]) -> Factory:
    def factory(**options: Any) -> OpBackend:
        made: OpBackend = load()(**options)
        return made

    return factory
