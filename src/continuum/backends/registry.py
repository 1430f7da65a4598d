"""``BackendRegistry``: backend names to entries — built-ins and entry points alike.

A backend is one :class:`BackendEntry`: the :class:`~continuum.settings.Settings` model it can
be told (its section of a settings tree, and so its command-line options) and how it is built
from those settings and the :class:`BackendNeeds` of the engine it serves. Third-party packages
register theirs under the ``continuum.backends`` entry-point group, as an entry (or a bare
factory of keyword options); no if/elif chain on names anywhere.

    [project.entry-points."continuum.backends"]
    mine = "mine.backend:ENTRY"

:meth:`BackendRegistry.settings_tree` is the :class:`BackendSettings` section with one field per
registered backend, so ``continuum serve --help`` lists an installed backend's options.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import create_model

from continuum.backends.base import Generation, OpBackend
from continuum.backends.models import ModelSettings
from continuum.backends.routing import UpstreamSettings
from continuum.errors import InvalidRequest, UnknownBackend
from continuum.settings import Settings, setting

ENTRY_POINT_GROUP = "continuum.backends"
log = logging.getLogger(__name__)
__all__ = [
    "BackendEntry",
    "BackendNeeds",
    "BackendRegistry",
    "BackendSettings",
    "Factory",
    "Generation",
    "LlamaCppSettings",
    "NoSettings",
    "OpBackend",
]


Factory = Callable[..., OpBackend]


@dataclass(frozen=True, slots=True)
class BackendNeeds:
    """What an engine asks of any backend: ``lanes`` — sessions and ops decode in that many
    KV streams of one context, batched together (a backend without resident sequences ignores
    it); ``exact`` — every reuse gives exactly the cold answer (a backend that keeps KV then
    gives each sequence a stream of its own)."""

    lanes: int = 1
    exact: bool = False


class NoSettings(Settings):
    """A backend that can be told nothing."""


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """A backend as the registry knows it. ``build(settings, needs)``: from its settings model;
    ``from_options(needs, **options)``: from flat keyword options (``Engine.open(n_ctx=...)``,
    ``Session(..., model=...)``), where a test or a library caller passes objects that are no
    settings (a context to share, an HTTP transport)."""

    settings: type[Settings]
    build: Callable[[Any, BackendNeeds], OpBackend]
    from_options: Callable[..., OpBackend]

    @classmethod
    def of_factory(cls, factory: Factory) -> BackendEntry:
        """A bare factory of keyword options as an entry: no settings, no needs."""
        return cls(NoSettings, lambda _s, _n: factory(), lambda _n, **o: factory(**o))


class LlamaCppSettings(ModelSettings):
    """The in-process backend's: the model and its context, and its prefix KV slots."""

    n_slots: int = setting(
        7,
        "With --parallel 1: prompts whose KV stays resident for the next request that starts "
        "with it (prefix KV slots; more are kept as snapshots).",
        ge=0,
        le=62,
    )


def _llamacpp_build(s: LlamaCppSettings, needs: BackendNeeds) -> OpBackend:
    from continuum.backends.llamacpp import LlamaConfig
    from continuum.backends.models import resolve_model

    threads = s.threads
    config = LlamaConfig(
        n_ctx=s.n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        chat_format=s.chat_format,
        draft=s.draft,
    )
    return _llamacpp_options(needs, model=resolve_model(s.model), config=config, n_slots=s.n_slots)


def _llamacpp_options(needs: BackendNeeds, **options: Any) -> OpBackend:
    from continuum.backends.llamacpp_ops import LlamaCppOpBackend

    if needs.lanes > 1:
        options.setdefault("lanes", needs.lanes)  # ops run in the sessions' lanes
    if needs.exact:
        options.setdefault("unified", False)  # nothing is exact in a unified cache
    return LlamaCppOpBackend.from_options(**options)


def _openai_http_build(s: UpstreamSettings, needs: BackendNeeds) -> OpBackend:
    if s.upstream is None:
        raise InvalidRequest("--backend openai_http needs --upstream URL")
    return _openai_http_options(
        needs,
        base_url=s.upstream,
        model=s.upstream_model or "default",
        api_key=s.upstream_api_key,
        routing=s.routing(),
    )


def _openai_http_options(needs: BackendNeeds, **options: Any) -> OpBackend:
    from continuum.backends.openai_http import OpenAIHTTPBackend

    return OpenAIHTTPBackend.from_options(**options)  # no lanes, no KV of its own: no needs


BUILT_IN = {
    "llamacpp": BackendEntry(LlamaCppSettings, _llamacpp_build, _llamacpp_options),
    "openai_http": BackendEntry(UpstreamSettings, _openai_http_build, _openai_http_options),
}


class BackendSettings(Settings):
    """Which backend answers, and a section of settings per backend (the chosen one's count).
    :meth:`BackendRegistry.settings_tree` adds the sections of backends installed as entry
    points."""

    backend: str = setting(
        "llamacpp",
        "Backend by registry name: llamacpp (in process), openai_http (--upstream), or one an "
        "installed package registers.",
    )
    llamacpp: LlamaCppSettings = LlamaCppSettings()
    openai_http: UpstreamSettings = UpstreamSettings()

    def chosen(self) -> Settings:
        """The chosen backend's section."""
        section = getattr(self, self.backend, None)
        if not isinstance(section, Settings):
            known = [k for k in type(self).model_fields if k != "backend"]
            raise UnknownBackend(self.backend, sorted(known))
        return section

    def check(self) -> None:
        """An unknown backend, then each backend's own section; drafting asked of a backend
        without it."""
        self.chosen()
        if self.llamacpp.draft and self.backend != "llamacpp":
            raise InvalidRequest(
                f"--draft {self.llamacpp.draft} needs --backend llamacpp (drafts are verified "
                f"in the in-process llama.cpp context); backend {self.backend!r} has no "
                "drafting: leave --draft out"
            )
        super().check()


class BackendRegistry:
    """Names to backend entries: the built-ins, then entry points, then :meth:`register`."""

    def __init__(self, *, entry_points_group: str | None = ENTRY_POINT_GROUP) -> None:
        self._entries: dict[str, BackendEntry] = dict(BUILT_IN)
        self._pending: dict[str, Callable[[], Any]] = {}
        if entry_points_group:
            for ep in entry_points(group=entry_points_group):
                if ep.name not in self._entries:
                    self._pending.setdefault(ep.name, ep.load)

    def register(self, name: str, backend: Factory | BackendEntry) -> None:
        """Register ``backend`` (an entry, or a bare factory of keyword options) as ``name``."""
        if not isinstance(name, str) or not name:
            raise InvalidRequest("a backend name must be a non-empty string")
        self._pending.pop(name, None)
        self._entries[name] = _entry(name, backend)

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._pending})

    def entry(self, name: str) -> BackendEntry:
        """The entry registered as ``name`` (an entry point's is loaded on first use)."""
        if name in self._pending:
            load = self._pending.pop(name)
            try:
                loaded = load()
            except Exception as e:  # an installed package that does not import
                raise InvalidRequest(
                    f"backend {name!r} could not be loaded ({type(e).__name__}: {e}); "
                    "reinstall the package that provides it"
                ) from e
            self._entries[name] = _entry(name, loaded)
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownBackend(name, self.names()) from None

    def create(self, name: str, needs: BackendNeeds | None = None, **options: Any) -> OpBackend:
        """Backend ``name`` from flat keyword options."""
        return self.entry(name).from_options(needs or BackendNeeds(), **options)

    def build(self, settings: BackendSettings, needs: BackendNeeds | None = None) -> OpBackend:
        """The backend ``settings`` chose, from its section."""
        entry = self.entry(settings.backend)
        section = settings.chosen()
        if not isinstance(section, entry.settings):
            section = entry.settings.model_validate(section.model_dump())
        return entry.build(section, needs or BackendNeeds())

    def settings_tree(self) -> type[BackendSettings]:
        """:class:`BackendSettings` with a section for every registered backend; one that
        cannot be loaded is left out (with a warning), and refused if chosen."""
        extra: dict[str, Any] = {}
        for name in self.names():
            if name in BackendSettings.model_fields:
                continue
            try:
                kind = self.entry(name).settings
            except InvalidRequest as e:
                log.warning("%s", e)
                continue
            extra[name] = (kind, kind())
        if not extra:
            return BackendSettings
        made = create_model("BackendSettings", __base__=BackendSettings, **extra)
        return made


def _entry(name: str, backend: Any) -> BackendEntry:
    if isinstance(backend, BackendEntry):
        return backend
    if callable(backend):
        return BackendEntry.of_factory(backend)
    raise InvalidRequest(f"backend {name!r}: register a BackendEntry or a callable factory")
