"""``continuum chat``'s options come from its settings tree: a bad value is a usage error naming
the option, before any model loads."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from continuum.cli import chat as chat_cli


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-tokens", "many"], "--max-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--high-water", "0"], "--high-water"),
        (["--n-ctx", "0"], "--n-ctx"),
        (["--threads", "0"], "--threads"),
        (["--n-slots", "3"], "--n-slots"),  # the llamacpp backend's option, not chat's
    ],
)
def test_a_bad_chat_option_is_a_usage_error_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, args: list[str], option: str
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(chat_cli, "open_engine", lambda *a: opened.append(a))
    r = CliRunner().invoke(chat_cli.chat, args)
    assert r.exit_code == 2 and option in r.output, r.output
    assert opened == []


def test_the_options_reach_the_engine_and_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []

    def stop(*a: Any) -> None:
        opened.append(a)
        raise SystemExit(0)

    monkeypatch.setattr(chat_cli, "open_engine", stop)
    args = ["-m", "gemma3-270m", "--n-ctx", "1024", "-t", "1", "--chat-format", "gemma"]
    r = CliRunner().invoke(chat_cli.chat, [*args, "--high-water", "0.5", "--store", "x.db"])
    assert r.exit_code == 0, r.output
    ((model, n_ctx, threads, chat_format, address, high_water),) = opened
    assert (model, n_ctx, threads, chat_format, high_water) == (
        "gemma3-270m",
        1024,
        1,
        "gemma",
        0.5,
    )
    assert str(address.sqlite) == "x.db"
