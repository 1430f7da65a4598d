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
import warnings
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
# the modules of the core layer, by name: a new top-level module or package is a decision
CORE_MODULES = {
    "constraints", "errors", "hashing", "keys", "messages", "metrics", "ops", "params", "policy",
    "results", "settings", "toolcalls",
}  # fmt: skip
API_MODULES = {"_native"}  # re-exports for the seed's snippet, like the package itself


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


def rank_of(module: str, src: Path = SRC) -> int | None:
    """Layer rank of a dotted module name; None for modules outside continuum."""
    parts = module.split(".")
    if parts[0] != "continuum":
        return None
    if len(parts) == 1:
        return API_RANK
    first = parts[1]
    if first in LAYER_RANKS:
        return LAYER_RANKS[first]
    if first in CORE_MODULES:
        return CORE_RANK
    if first in API_MODULES:
        return API_RANK
    if (src / f"{first}.py").exists() or (src / first).is_dir():
        raise UnknownLayer(module)
    return API_RANK  # `from continuum import SomeName`: a name re-exported by the public API


class UnknownLayer(AssertionError):
    """A module or package the layer map does not know: add it to a layer on purpose."""


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
    inner = {n: r for n, r in ranks.items() if n.split(".")[1] not in API_MODULES}
    assert all(r is not None and r < API_RANK for r in inner.values()), inner


def test_an_unknown_package_fails_the_layer_check(tmp_path: Path) -> None:
    (tmp_path / "fleet").mkdir()  # a new package nobody placed in a layer
    with pytest.raises(UnknownLayer):
        rank_of("continuum.fleet.router", src=tmp_path)
    assert rank_of("continuum.engine.core") == 5 and rank_of("continuum._native") == API_RANK


def test_no_import_cycles() -> None:
    """Imports between modules form no cycle, counting every import: module level, inside
    functions (lazy) and under ``TYPE_CHECKING``. A module that needs a type of a module above
    it takes a protocol of a module below both instead."""
    names = {name for name, _, _ in package_modules()}
    graph = {
        name: internal_imports(name, is_package, path.read_text(), names)
        for name, is_package, path in package_modules()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


# the front ends among themselves: the command line runs the server and the benchmarks, and a
# benchmark may run a server; the server reaches for neither, and no benchmark for the CLI
FRONT_END_EDGES = {("cli", "server"), ("cli", "bench"), ("bench", "server")}


def test_front_ends_import_each_other_only_downward() -> None:
    names = {name for name, _, _ in package_modules()}
    front = {"cli", "server", "bench"}
    crossing = []
    for name, is_package, path in package_modules():
        here = name.split(".")[1]
        for target in internal_imports(name, is_package, path.read_text(), names):
            there = target.split(".")[1] if target.count(".") else ""
            if {here, there} <= front and here != there and (here, there) not in FRONT_END_EDGES:
                crossing.append(f"{name} -> {target}")
    assert not crossing, f"front ends reaching into each other: {crossing}"


def internal_imports(module: str, is_package: bool, source: str, modules: set[str]) -> set[str]:
    """The modules of the package that ``source`` imports anywhere: a name imported from a
    module counts as that module (``from continuum.engine import Engine``: the package)."""
    out: set[str] = set()
    for _, target in imported_modules(module, is_package, source):
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in modules and target != module:
            out.add(target)
    return out


def test_lazy_and_type_checking_imports_count_as_edges() -> None:
    modules = {"continuum.a", "continuum.b", "continuum.c"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from continuum.b import Thing\n"
        "def f():\n"
        "    from continuum.c import helper\n"
    )
    assert internal_imports("continuum.a", False, source, modules) == {
        "continuum.b",
        "continuum.c",
    }


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


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


# -- tests mirror src/ ----------------------------------------------------------------------
def test_every_test_module_is_named_after_a_module_it_tests() -> None:
    """tests/<package>/test_<module>[_<aspect>].py, for a module under src/continuum/<package>
    (tests of the whole package, and of core modules, sit in tests/ itself)."""
    tests = ROOT / "tests"
    strays = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        pkg = SRC.joinpath(*rel.parts[:-1])
        names = {p.stem for p in pkg.rglob("*.py")} | {p.name for p in pkg.rglob("*") if p.is_dir()}
        if len(rel.parts) == 1:
            names |= {"architecture"}
        stem = path.stem.removeprefix("test_")
        if not pkg.is_dir() or not any(stem == n or stem.startswith(n + "_") for n in names):
            strays.append(str(rel))
    assert not strays, f"test modules that name no module of their package: {strays}"


MODULE_WARN_LINES = 500  # STYLE.md: past about here a module is asking to be split
MODULE_MAX_LINES = 650  # past this it is two modules: find the second object


def test_no_function_over_80_lines_and_no_module_over_the_ceiling() -> None:
    """A module past 500 lines is a warning (split it along an object when one shows), never a
    reason to pack lines; past 650 it fails. A function past 80 lines fails."""
    too_long, warned = [], []
    for name, _, path in package_modules():
        source = path.read_text()
        lines = source.count("\n")
        if lines > MODULE_MAX_LINES:
            too_long.append(f"{name}: {lines} lines")
        elif lines > MODULE_WARN_LINES:
            warned.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 80:
                    too_long.append(f"{name}.{node.name}: {n} lines")
    assert not too_long, "split these along a new object with one job: " + ", ".join(too_long)
    if warned:
        warnings.warn("modules asking to be split: " + ", ".join(warned), stacklevel=1)


SKIP = "# fmt" + ": skip"  # spelled apart so this file's own lines never match


def data_table_ends(tree: ast.Module) -> set[int]:
    """The last lines of module-level constants written as literal tables."""
    tables = (ast.Dict, ast.List, ast.Tuple, ast.Set)
    return {
        node.end_lineno or node.lineno
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, tables)
    }


def test_the_formatter_skips_only_data_tables() -> None:
    """The formatter's skip marker may keep a module-level table of constants in rows (src/ and
    tests/); code is formatted."""
    skipped = []
    for path in sorted([*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        source, name = path.read_text(), path.relative_to(ROOT)
        if SKIP not in source:
            continue
        tables = data_table_ends(ast.parse(source))
        for n, line in enumerate(source.splitlines(), 1):
            if SKIP in line and n not in tables:
                skipped.append(f"{name}:{n}")
    assert not skipped, f"format these (a size limit is no reason to pack lines): {skipped}"


def test_the_data_table_rule_tells_code_from_tables() -> None:
    source = "T = (\n  1, 2,\n)\ndef f():\n    x = [1,\n 2]\n    return x\n"
    assert data_table_ends(ast.parse(source)) == {3}


# debts, named: front ends whose options are still one parameter each, until the settings tree
# generates them (the "Foundations" issue). The list may only shrink: a new function over the
# limit fails, and so does a listed one that no longer is.
MANY_PARAMETERS: set[str] = set()


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller may pass: ``self`` and ``cls`` not counted, ``*a`` and ``**kw`` are."""
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return len([n for n in names if n not in ("self", "cls")]) + bool(a.vararg) + bool(a.kwarg)


def test_parameter_count_counts_what_a_caller_passes() -> None:
    source = "class C:\n    def f(self, a, /, b, *args, c, **kw): ...\n"
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    assert parameter_count(node) == 5


def test_no_function_takes_more_than_eight_parameters() -> None:
    over = set()
    for name, _, path in package_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if parameter_count(node) > 8:
                over.add(f"{name}.{node.name}")
    assert not over - MANY_PARAMETERS, (
        "more than 8 parameters: group them along the object they describe: "
        + ", ".join(sorted(over - MANY_PARAMETERS))
    )
    assert not MANY_PARAMETERS - over, (
        "no longer over the limit: take them off MANY_PARAMETERS: "
        + ", ".join(sorted(MANY_PARAMETERS - over))
    )


# the front ends: they ask the worker or the engine, never the context guard itself
FRONT_ENDS = ("continuum.server", "continuum.cli", "continuum.bench")


def guard_uses(source: str) -> list[int]:
    """Lines of ``source`` that name the context guard (its class, or an object's ``guard``)."""
    tree = ast.parse(source)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "guard")
        or (isinstance(node, ast.Name) and node.id == "ContextGuard")
        or (isinstance(node, ast.alias) and "context_guard" in node.name)
    )


def test_the_guard_rule_finds_a_guard() -> None:
    assert guard_uses("with worker.guard:\n    pass\n") == [1]
    assert guard_uses("from continuum.backends import context_guard\n") == [1]
    assert guard_uses("with worker.claim():\n    guard = 1\n") == []


def test_front_ends_never_handle_the_context_guard() -> None:
    """The server, the CLI and the benchmarks ask the worker or the engine (``claim()``); the
    context's actions are the step loop's to apply (issue 37: one owner of the context)."""
    found = [
        f"{name}:{line}"
        for name, _, path in package_modules()
        if name.startswith(FRONT_ENDS)
        for line in guard_uses(path.read_text())
    ]
    assert not found, f"front-end modules that handle the context guard: {found}"
