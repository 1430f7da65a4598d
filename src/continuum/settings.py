"""What a component can be told, declared by the component itself.

Each component — the model, a backend, the lanes, a tier, the store, the HTTP front — declares its
options as a :class:`Settings` model whose fields are made by :func:`setting`: the default, the
help, the bounds (pydantic's ``ge``, ``gt``, ``le``), and how a command line names it. A front end
assembles the components' models into one tree (``continuum serve``'s is
:class:`continuum.server.settings.ServeSettings`) and generates its options from that tree
(:mod:`continuum.cli.settings_options`), so an option is written down once: adding a flag to a
tier is one field of its model.

Settings are values: frozen, and validated by pydantic when made, so a bad value names its field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.fields import FieldInfo

from continuum.errors import InvalidRequest

S = TypeVar("S", bound="Settings")


class Settings(BaseModel):
    """A component's settings: frozen, and no field it does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def of(cls: type[S], **values: Any) -> S:
        """The tree with leaves set by their names alone (``EngineSettings.of(n_ctx=1024,
        parallel=1)``), as a command line sets them; a name the tree has not is refused."""
        paths = {path[-1]: path for path, _ in leaves(cls)}
        nested: dict[str, Any] = {}
        for name, value in values.items():
            if name not in paths:
                raise InvalidRequest(
                    f"{cls.__name__} has no setting {name!r}; it has {sorted(paths)}"
                )
            *sections, leaf = paths[name]
            node = nested
            for section in sections:
                node = node.setdefault(section, {})
            node[leaf] = value
        return cls.model_validate(nested)

    def check(self) -> None:
        """Refuse what the fields' own types and bounds cannot: a section overrides it for
        values that only mean something together (an address to parse, a routing to build)
        and calls ``super().check()``, which checks every section below it. Called once,
        before anything is built from the tree (``continuum serve`` does)."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, Settings):
                value.check()


class Commas:
    """Marks a tuple setting that a command line gives as one comma-separated value (``--modes
    a,b``, ``--sizes 10,100``): its option takes the text, and the setting's validator splits
    it into the items."""


def split_commas(value: Any) -> Any:
    """A comma-separated text as its items, blank ones dropped; any other value as given."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def sizes_at_least(least: int) -> Callable[[Any], tuple[int, ...]]:
    """A validator of sizes: integers, one or more, each at least ``least``, from a
    comma-separated text or a sequence."""

    def parse(value: Any) -> tuple[int, ...]:
        try:
            parsed = tuple(int(x) for x in split_commas(value))
        except (TypeError, ValueError):
            raise ValueError(f"sizes must be integers, got {value!r}") from None
        if not parsed or min(parsed) < least:
            raise ValueError(f"give one or more sizes, each >= {least}")
        return parsed

    return parse


# tuple settings a command line gives comma-separated: names (modes), and sizes or counts
Names = Annotated[tuple[str, ...], BeforeValidator(split_commas), Commas()]
Sizes = Annotated[tuple[int, ...], BeforeValidator(sizes_at_least(2)), Commas()]
Counts = Annotated[tuple[int, ...], BeforeValidator(sizes_at_least(1)), Commas()]


def fspath(value: Any) -> Any:
    """A path given where a settings field takes a path or a URL as text: its text."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def leaves(
    tree: type[Settings], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    """Every leaf field of ``tree`` with its path: sections are fields whose type is itself a
    settings model."""
    for name, info in tree.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, Settings):
            yield from leaves(kind, (*path, name))
        else:
            yield (*path, name), info


def setting(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    envvar: str | None = None,
    exists: bool = False,
    directory: bool = False,
    secret: bool = False,
    **bounds: Any,
) -> Any:
    """A field of a :class:`Settings` model. ``flags``: its command-line names (default: the field
    name with dashes); ``envvar``: an environment variable that sets it; ``exists``: a path that
    must exist; ``directory``: a path that names a folder; ``secret``: a key or password, left
    out of the settings' repr (a log of them shows no secret); ``bounds``: pydantic's numeric
    constraints (``ge=1``...), which the command line checks too."""
    extra: dict[str, Any] = {"flags": list(flags), "exists": exists, "directory": directory}
    if envvar is not None:
        extra["envvar"] = envvar
    return Field(default, description=help, json_schema_extra=extra, repr=not secret, **bounds)


__all__ = [
    "Commas",
    "Counts",
    "Names",
    "Settings",
    "Sizes",
    "fspath",
    "leaves",
    "setting",
    "sizes_at_least",
    "split_commas",
]
