"""``BackendRegistry``: backend names to factories — built-ins and entry points alike.

A factory takes keyword options and returns an :class:`OpBackend`. Third-party packages
register theirs under the ``continuum.backends`` entry-point group; no if/elif chain on names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Protocol

from continuum.errors import InvalidRequest, UnknownBackend
from continuum.messages import Message
from continuum.params import GenerationParams

ENTRY_POINT_GROUP = "continuum.backends"


@dataclass(frozen=True, slots=True)
class Generation:
    """What a backend produced for one op, and what it cost."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    evaluated: int  # prompt tokens the backend decoded (tokens_sent)
    reused: int  # prompt tokens served from reused state (tokens_saved)
    ttft_ms: float
    total_ms: float
    reused_known: bool = True  # False: the server did not say what it reused


class OpBackend(Protocol):
    """What the reuse stack needs from a backend. It knows nothing of tiers."""

    name: str
    model_identity: str  # the model file's digest (or the remote model's stated identity)

    def prompt_tokens(
        self, messages: Sequence[Message] | None, prompt: str | None
    ) -> list[int]: ...

    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        reuse: int = 0,
        on_text: Callable[[str], None] | None = None,
        messages: Sequence[Message] | None = None,
        prompt: str | None = None,
    ) -> Generation:
        """Generate for ``tokens`` (an in-process backend) or for the ``messages``/``prompt``
        they were made from (a remote backend, which always receives the whole request)."""
        ...

    def close(self) -> None: ...


Factory = Callable[..., OpBackend]


def _llamacpp(**options: Any) -> OpBackend:
    from continuum.backends.llamacpp_ops import LlamaCppOpBackend

    return LlamaCppOpBackend(**options)


def _openai_http(**options: Any) -> OpBackend:
    from continuum.backends.openai_http import OpenAIHTTPBackend

    return OpenAIHTTPBackend(**options)


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
