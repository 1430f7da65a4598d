"""Command-line options generated from a settings tree (:mod:`continuum.settings`).

:func:`options` walks a :class:`~continuum.settings.Settings` model — sections are fields whose
type is itself a settings model — and makes one click option per leaf: its names from the
field's ``flags`` (default ``--field-name``), its help and default from the field, and its type
from the annotation and bounds (``Path``, or text marked ``exists``/``directory``: a path;
``bool``: a flag; ``Literal``: a choice; ``int``/``float`` with
``ge``/``gt``/``le``: a range; ``tuple[str, ...]``: repeatable, or one comma-separated value when
the setting is marked :class:`~continuum.settings.Commas`), so click refuses a bad value
with the option's name before anything runs. :func:`settings_from` builds the tree back from the
parsed values; what only pydantic checks is a usage error naming the option too.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import click
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from continuum import settings
from continuum.settings import Commas, Settings

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S", bound=Settings)
SEP = "__"  # joins a leaf's path into its click parameter name


def leaves(tree: type[Settings]) -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf field of ``tree`` with its parameter name (its path joined by ``__``)."""
    for path, info in settings.leaves(tree):
        yield SEP.join(path), info


def options(tree: type[Settings]) -> Callable[[F], F]:
    """A decorator adding an option for every leaf of ``tree``, in the tree's order."""

    def decorate(f: F) -> F:
        for param, info in reversed(list(leaves(tree))):
            f = _option(param, info)(f)
        return f

    return decorate


def field_option(tree: type[Settings], name: str) -> Callable[[F], F]:
    """The option of one leaf field of ``tree`` (a command that takes ``--model`` as serve's
    tree declares it, without the rest), passed to the command as ``name``."""
    return _option(name, tree.model_fields[name])


def settings_from(tree: type[S], values: dict[str, Any]) -> S:
    """The tree from the values click parsed (by parameter name); a value pydantic refuses is a
    :class:`click.BadParameter` naming the option."""
    nested: dict[str, Any] = {}
    for param, value in values.items():
        *sections, name = param.split(SEP)
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    try:
        return tree.model_validate(nested)
    except ValidationError as e:
        first = e.errors()[0]
        param = _leaf_of(tree, first["loc"])
        cause = first.get("ctx", {}).get("error") if first["type"] == "value_error" else None
        message = str(cause) if cause is not None else first["msg"]  # a validator's own words
        raise click.BadParameter(message, param_hint=flag_of(tree, param)) from None


def _leaf_of(tree: type[Settings], loc: tuple[int | str, ...]) -> str:
    """The leaf an error's location names (a location may go on inside the leaf's value: an
    item's index, a union's member)."""
    names = {name for name, _ in leaves(tree)}
    for end in range(len(loc), 0, -1):
        param = SEP.join(str(p) for p in loc[:end])
        if param in names:
            return param
    return SEP.join(str(p) for p in loc)


def flag_of(tree: type[Settings], param: str) -> str:
    """The long option name of the leaf ``param`` (``model__n_ctx`` -> ``--n-ctx``)."""
    for name, info in leaves(tree):
        if name == param:
            return _flags(name, info)[0]
    return param


def _flags(param: str, info: FieldInfo) -> list[str]:
    extra = _extra(info)
    flags = list(extra.get("flags") or ())
    return flags or ["--" + param.rsplit(SEP, 1)[-1].replace("_", "-")]


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _option(param: str, info: FieldInfo) -> Callable[[F], F]:
    extra = _extra(info)
    kind, optional = _unwrap(info.annotation)
    kw: dict[str, Any] = {"help": info.description, "default": info.default}
    if extra.get("envvar"):
        kw["envvar"] = extra["envvar"]
    if kind is bool:
        kw["is_flag"] = True
    elif _comma_separated(kind, info):
        default = info.default
        kw["default"] = None if default is None else ",".join(str(x) for x in default)
        kw["show_default"] = default is not None
    elif get_origin(kind) is tuple:
        kw["multiple"] = True
    else:
        kw["type"] = _click_type(kind, info, extra)
        kw["show_default"] = info.default is not None and not optional
    return click.option(*_flags(param, info), param, **kw)


def _comma_separated(kind: Any, info: FieldInfo) -> bool:
    """A tuple setting marked :class:`Commas` (its metadata is the field's, or inside ``kind``
    when the field is optional)."""
    inner = kind.__metadata__ if get_origin(kind) is Annotated else ()
    return any(isinstance(m, Commas) for m in (*info.metadata, *inner))


def _unwrap(kind: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (it, False)."""
    if get_origin(kind) in (Union, types.UnionType):
        rest = [a for a in get_args(kind) if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return kind, False


def _click_type(kind: Any, info: FieldInfo, extra: dict[str, Any]) -> Any:
    if get_origin(kind) is Literal:
        return click.Choice([str(a) for a in get_args(kind)])
    if kind is Path or (kind is str and (extra.get("exists") or extra.get("directory"))):
        folder = bool(extra.get("directory"))
        exists = bool(extra.get("exists"))
        path_type = Path if kind is Path else str  # a path kept as text: checked all the same
        return click.Path(dir_okay=folder, file_okay=not folder, exists=exists, path_type=path_type)
    low = high = None
    low_open = False
    for bound in info.metadata:  # pydantic's annotated_types.Ge, Gt, Le
        if (ge := getattr(bound, "ge", None)) is not None:
            low = ge
        elif (gt := getattr(bound, "gt", None)) is not None:
            low, low_open = gt, True
        elif (le := getattr(bound, "le", None)) is not None:
            high = le
    if kind is int:
        if low_open and low is not None:
            low, low_open = low + 1, False
        return click.IntRange(low, high) if (low, high) != (None, None) else int
    if kind is float:
        if (low, high) == (None, None):
            return float
        return click.FloatRange(low, high, min_open=low_open)
    return str


__all__ = ["field_option", "flag_of", "leaves", "options", "settings_from"]
