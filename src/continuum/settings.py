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

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    """A component's settings: frozen, and no field it does not declare."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def setting(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    envvar: str | None = None,
    exists: bool = False,
    **bounds: Any,
) -> Any:
    """A field of a :class:`Settings` model. ``flags``: its command-line names (default: the field
    name with dashes); ``envvar``: an environment variable that sets it; ``exists``: a path that
    must exist; ``bounds``: pydantic's numeric constraints (``ge=1``...), which the command line
    checks too."""
    extra: dict[str, Any] = {"flags": list(flags), "exists": exists}
    if envvar is not None:
        extra["envvar"] = envvar
    return Field(default, description=help, json_schema_extra=extra, **bounds)


__all__ = ["Settings", "setting"]
