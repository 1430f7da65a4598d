"""The bench commands' options are generated from their settings trees: every flag they had is
still there, a bad value is a usage error naming its flag before anything runs, and a
comma-separated list is read as it always was."""

from __future__ import annotations

from typing import Any

import click
import pytest
from click.testing import CliRunner

from continuum.bench.concurrent import ConcurrentConfig
from continuum.cli.main import main
from continuum.cli.settings_options import options, settings_from
from continuum.settings import Counts, Names, Settings, setting

COMMON = ("--model", "-m", "--threads", "-t", "--reps", "--json", "--out")
PEER = (*COMMON, "--llama-server")
# every flag each converted command took when its options were listed by hand
FLAGS: dict[str, tuple[str, ...]] = {
    "eva": (*COMMON, "--system-tokens", "--max-tokens", "--turns", "--modes", "--exact"),
    "prefill": (*PEER, "--sizes", "--idle-ms", "--rate", "--max-tokens"),
    "shared-prefix": (
        *COMMON, "--sessions", "--system-tokens", "--max-tokens", "--n-ctx", "--lanes",
    ),
    "fleet": (
        "--model", "-m", "--workers", "--sessions", "--turns", "--max-tokens", "--threads", "-t",
        "--parallel", "--n-ctx", "--system-tokens", "--hop-pairs", "--health-pairs", "--note",
        "--plot", "--json", "--out",
    ),
    "agent": (*PEER, "--steps", "--max-tokens", "--n-ctx", "--modes"),
    "codex": (
        *PEER, "--steps", "--sessions", "--max-output-tokens", "--n-ctx", "--llama-server-args",
    ),
    "concurrent": (
        *PEER, "--clients", "--turns", "--max-tokens", "--system-tokens", "--idle-ms",
        "--prefill-share", "--exact",
    ),
    "http": (
        *PEER, "--max-tokens", "--system-tokens", "--turns", "--modes", "--idle-ms", "--rate",
        "--end-delay-ms", "--name",
    ),
    "sweep": (
        *PEER, "--sizes", "--max-tokens", "--turns", "--modes", "--idle-ms", "--cold-full-upto",
        "--cold-all-reps-upto",
    ),
    "speculative": (*PEER, "--tasks", "--max-draft", "--max-tokens", "--agents", "--temperature"),
    "interference": (
        *COMMON, "--sessions", "--prompt-tokens", "--reply-tokens", "--system-tokens",
        "--warmup", "--n-ctx", "--compare",
    ),
}  # fmt: skip


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["bench", *args])


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_help_lists_every_flag_the_command_had(command: str) -> None:
    r = invoke(command, "--help")
    assert r.exit_code == 0, r.output
    words = set(r.output.replace(",", " ").split())
    assert set(FLAGS[command]) <= words, set(FLAGS[command]) - words


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["agent", "--reps", "0"], "--reps"),
        (["agent", "--steps", "1"], "--steps"),
        (["prefill", "--rate", "0.5"], "--rate"),
        (["prefill", "--sizes", "1"], "--sizes"),  # each at least 2, as before
        (["http", "--turns", "17"], "--turns"),
        (["eva", "--reps", "0"], "--reps"),
        (["shared-prefix", "--sessions", "65"], "--sessions"),
        (["shared-prefix", "--lanes", "0"], "--lanes"),
        (["shared-prefix", "--lanes", "17"], "--lanes"),
        (["shared-prefix", "--lanes", "two"], "--lanes"),
        (["interference", "--warmup", "0"], "--warmup"),
        (["fleet", "--workers", "1,x"], "--workers"),
        (["concurrent", "--clients", "0"], "--clients"),
        (["draft-cost", "--max-draft", "0"], "--max-draft"),
        (["draft-cost", "--max-draft", "33"], "--max-draft"),
        (["draft-cost", "--contexts", "1"], "--contexts"),
        (["draft-cost", "--contexts", "64,x"], "--contexts"),
        (["draft-cost", "--reps", "0"], "--reps"),
        (["speculative", "--max-draft", "33"], "--max-draft"),
        (["speculative", "--tasks", "poetry"], "--tasks"),
        (["speculative", "--max-tokens", "0"], "--max-tokens"),
        (["speculative", "--temperature", "-0.5"], "--temperature"),
        (["speculative", "--temperature", "2.5"], "--temperature"),
        (["speculative", "--temperature", "warm"], "--temperature"),
        (["speculative", "--llama-server", "/no/such/llama-server"], "--llama-server"),
        (["speculative", "--agents", "0"], "--agents"),
        (["speculative", "--agents", "2,17"], "--agents"),
        (["speculative", "--agents", "2", "--llama-server", "pyproject.toml"], "--llama-server"),
        (["semantic-verified", "--sets", "groups,independent"], "--sets"),  # a pair set first
        (["semantic-verified", "--limit", "1"], "--limit"),
        (["semantic-verified", "--delta", "0"], "--delta"),
        (["semantic-verified", "--delta", "0.6"], "--delta"),
        (["semantic-verified", "--judges", "qwen2.5-coder-0.5b"], "--judges"),
        (["semantic-verified", "--judges", "qwen2.5-coder-0.5b:both"], "--judges"),
        (["semantic-verified", "--sets", "dev"], "--sets"),
        (["semantic-verified", "--floor", "1.5"], "--floor"),
        (["semantic-verified", "--answer-tokens", "0"], "--answer-tokens"),
        (["semantic-verified", "--answers", "/"], "--answers"),  # a folder, not a cache
        (["semantic-verified", "--answers", "pyproject.toml"], "--answers"),  # not JSON
    ],
)
def test_a_bad_value_is_a_usage_error_naming_its_flag(args: list[str], flag: str) -> None:
    r = invoke(*args)
    assert r.exit_code == 2 and flag in r.output, r.output
    assert "Traceback" not in r.output


class Lists(Settings):
    modes: Names | None = setting(None, "Comma-separated names.")
    clients: Counts = setting((1, 2, 4, 8), "Comma-separated counts.")


@click.command()
@options(Lists)
def lists(**flags: Any) -> None:
    click.echo(repr(settings_from(Lists, flags)))


def test_a_comma_separated_setting_reads_the_text_it_always_read() -> None:
    r = CliRunner().invoke(lists, ["--modes", " delta, input,,", "--clients", "1,4"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == repr(Lists(modes=("delta", "input"), clients=(1, 4)))
    r = CliRunner().invoke(lists, [])
    assert r.output.strip() == repr(Lists())
    assert "[default: 1,2,4,8]" in CliRunner().invoke(lists, ["--help"]).output


def test_a_config_made_in_code_is_checked_as_the_command_line_is() -> None:
    cfg = ConcurrentConfig(clients="2,4", llama_server="/usr/bin/llama-server")
    assert cfg.clients == (2, 4) and cfg.llama_server == "/usr/bin/llama-server"
    with pytest.raises(ValueError, match="each >= 1"):
        ConcurrentConfig(clients=(0,))
    with pytest.raises(ValueError, match="extra"):
        ConcurrentConfig(client=(2,))  # type: ignore[call-arg]
