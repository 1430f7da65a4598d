"""Architecture: layers import downward only, the public API is honest, and the code is lint-clean.

Layers (DESIGN.md §2), lowest first: core (top-level modules), store, backends, stateful, tiers,
engine, then the thin front ends (cli, server, bench). ``continuum/__init__.py`` is the public API
and may import anything; nothing inside the package may import it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import continuum
from continuum import errors

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "continuum"

LAYER_RANKS = {
    "store": 1,
    "backends": 2,
    "stateful": 3,
    "tiers": 4,
    "engine": 5,
    "cli": 6,
    "server": 6,
    "bench": 6,
}
CORE_RANK = 0
API_RANK = 7  # the package itself (continuum/__init__.py) sits above every layer


class UpwardImport(NamedTuple):
    module: str
    line: int
    target: str
    module_rank: int
    target_rank: int

    def __str__(self) -> str:
        return (
            f"{self.module}:{self.line} imports {self.target} "
            f"(rank {self.module_rank} -> rank {self.target_rank})"
        )


def rank_of(module: str) -> int | None:
    """Layer rank of a dotted module name; None for modules outside continuum."""
    parts = module.split(".")
    if parts[0] != "continuum":
        return None
    if len(parts) == 1:
        return API_RANK
    first = parts[1]
    if first in LAYER_RANKS:
        return LAYER_RANKS[first]
    if (SRC / f"{first}.py").exists() or (SRC / first).is_dir():
        return CORE_RANK
    return API_RANK  # `from continuum import SomeName`: a name re-exported by the public API


def imported_modules(module: str, is_package: bool, source: str) -> list[tuple[int, str]]:
    """(line, dotted target) for every import in ``source``, relative ones resolved."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                parent = ".".join([*base, node.module] if node.module else base)
            else:
                parent = node.module or ""
            found.extend((node.lineno, f"{parent}.{alias.name}") for alias in node.names)
    return found


def upward_imports(module: str, source: str, *, is_package: bool = False) -> list[UpwardImport]:
    own = rank_of(module)
    assert own is not None, module
    out = []
    for line, target in imported_modules(module, is_package, source):
        target_rank = rank_of(target)
        if target_rank is not None and target_rank > own:
            out.append(UpwardImport(module, line, target, own, target_rank))
    return out


def package_modules() -> list[tuple[str, bool, Path]]:
    """(dotted name, is_package, path) of every module under src/continuum except the API."""
    mods = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        if parts == ["continuum"]:
            continue  # the public API is exempt
        mods.append((".".join(parts), is_package, path))
    return mods


# -- layering ---------------------------------------------------------------------------------
def test_checker_catches_upward_imports() -> None:
    source = (
        "from continuum.errors import StoreError\n"  # core: fine
        "from continuum.stateful.worker import Worker\n"  # stateful: upward
        "from ..backends import models\n"  # relative, backends: upward
        "from . import sqlite\n"  # same layer: fine
        "import continuum.cli.main\n"  # cli: upward
        "from continuum import ChatSession\n"  # the public API: upward
        "import json\n"  # not ours
        "def f():\n"
        "    from continuum.tiers import memo\n"  # lazy imports count too
    )
    found = upward_imports("continuum.store.sqlite", source)
    assert [(v.line, v.target) for v in found] == [
        (2, "continuum.stateful.worker.Worker"),
        (3, "continuum.backends.models"),
        (5, "continuum.cli.main"),
        (6, "continuum.ChatSession"),
        (9, "continuum.tiers.memo"),
    ]


def test_checker_resolves_relative_imports_in_packages() -> None:
    source = "from .sqlite import HistoryStore"
    assert upward_imports("continuum.store", source, is_package=True) == []
    found = upward_imports("continuum.errors", "from .stateful import session")
    assert [v.target for v in found] == ["continuum.stateful.session"]


def test_checker_allows_downward_imports() -> None:
    source = "from continuum.store.sqlite import HistoryStore\nfrom ..messages import Message\n"
    assert upward_imports("continuum.cli.main", source) == []


def test_every_module_is_mapped_to_a_layer() -> None:
    modules = package_modules()
    assert len(modules) >= 10
    ranks = {name: rank_of(name) for name, _, _ in modules}
    assert ranks["continuum.errors"] == CORE_RANK
    assert ranks["continuum.store.sqlite"] == 1
    assert ranks["continuum.backends.llamacpp"] == 2
    assert ranks["continuum.stateful.session"] == 3
    assert ranks["continuum.cli.main"] == 6
    assert all(r is not None and r < API_RANK for r in ranks.values()), ranks


def test_layers_import_downward_only() -> None:
    violations = [
        v
        for name, is_package, path in package_modules()
        for v in upward_imports(name, path.read_text(), is_package=is_package)
    ]
    assert not violations, "upward imports:\n" + "\n".join(map(str, violations))


# -- public API -----------------------------------------------------------------------------
def test_all_names_exist() -> None:
    missing = [name for name in continuum.__all__ if not hasattr(continuum, name)]
    assert not missing


def test_all_is_sorted_without_duplicates() -> None:
    assert list(continuum.__all__) == sorted(continuum.__all__)
    assert len(set(continuum.__all__)) == len(continuum.__all__)


def test_every_error_is_exported() -> None:
    error_classes = [
        name
        for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]
    assert "ContinuumError" in error_classes
    assert sorted(set(error_classes) - set(continuum.__all__)) == []


def test_every_exception_class_derives_from_continuum_error() -> None:
    defined = []
    for info in pkgutil.walk_packages(continuum.__path__, prefix="continuum."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                defined.append(obj)
    assert errors.SessionNotFound in defined and errors.StoreError in defined
    strays = [c.__qualname__ for c in defined if not issubclass(c, errors.ContinuumError)]
    assert not strays, f"exceptions outside the hierarchy: {strays}"


# -- lint -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["ruff", "check", "src", "tests"], id="ruff"),
        pytest.param(["mypy"], id="mypy"),
    ],
)
def test_lint_is_clean(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
