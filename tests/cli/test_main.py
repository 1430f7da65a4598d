"""The ``continuum`` command tree: exactly the expected commands, each with working --help,
and a user error from any depth of the tree is one ``error:`` line and exit status 2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from continuum.cli.main import main

EXPECTED = {
    "info",
    "chat",
    "serve",
    "bench",
    "bench eva",
    "bench memory",
    "bench interference",
    "bench shared-prefix",
    "bench sweep",
    "bench residency",
    "bench compaction",
    "bench tiers",
    "bench semantic",
    "bench prefill",
    "bench draft-cost",
    "bench speculative",
    "bench semantic-verified",
    "bench restore",
    "bench overhead",
    "bench http",
    "bench agent",
    "bench agents-paused",
    "bench park-return",
    "bench concurrent",
    "bench fleet",
    "bench all",
    "bench plot",
    "bench report",
    "bench codex",
    "keys",
    "keys add",
    "fleet",
    "fleet config",
    "fleet up",
}


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    """Every command path under ``group``, groups included ("bench", "bench eva", ...)."""
    for name, cmd in group.commands.items():
        path = (*prefix, name)
        yield " ".join(path)
        if isinstance(cmd, click.Group):
            yield from command_paths(cmd, path)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_command_tree_is_exactly_the_expected_set() -> None:
    paths = list(command_paths(main))
    assert len(paths) == len(set(paths))
    assert set(paths) == EXPECTED


def test_top_level_help_lists_every_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    for name in ("info", "chat", "serve", "bench"):
        assert f"  {name} " in result.stdout


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_every_command_has_help(path: str) -> None:
    result = invoke(*path.split(), "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: main {path} ")
    assert result.stderr == ""


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0, result.output
    assert "version" in result.stdout


def assert_user_error(result: Result, *expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], result.stderr


def test_user_error_in_a_top_level_command() -> None:
    assert_user_error(invoke("info", "--model", "/nonexistent.gguf"), "/nonexistent.gguf")


def test_user_error_in_a_bench_command(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    for cmd in ("report", "plot"):
        assert_user_error(invoke("bench", cmd, "--results", str(missing)), "not a folder")


def test_bad_parameter_is_a_usage_error_not_a_traceback() -> None:
    result = invoke("bench", "residency", "--sizes", "big")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "sizes must be integers" in result.stderr
    assert "Traceback" not in result.stderr
