"""``continuum serve``'s options reach the server's configuration: the request body limit
(``--max-body-bytes``, which a session bundle with its KV may need raised) and its bounds, and
how batch steps share their prompt room (``--prefill-share``)."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from continuum.cli import serve as serve_cli
from continuum.server.state import ServerConfig
from continuum.settings import Settings


class Stop(Exception):
    """Raised in place of loading the model: the options were read."""


def leaves_of(tree: Settings) -> dict[str, Any]:
    """A settings tree's leaves by name (sections flattened)."""
    out: dict[str, Any] = {}
    for name, value in tree:
        out.update(leaves_of(value) if isinstance(value, Settings) else {name: value})
    return out


def parsed(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, dict[str, Any], str]:
    seen: dict[str, Any] = {}

    def build(config: ServerConfig) -> None:
        seen.update(vars(config))
        seen.update(leaves_of(config.engine))
        raise Stop

    monkeypatch.setattr(serve_cli, "build_state", build)
    r = CliRunner().invoke(serve_cli.serve, ["--port", "0", *args])
    assert r.exit_code == 2 or isinstance(r.exception, Stop), r.output
    return r.exit_code, seen, r.output


def test_the_body_limit_defaults_to_4_mib_and_can_be_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parsed(monkeypatch)[1]["max_body_bytes"] == 4 << 20
    assert parsed(monkeypatch, "--max-body-bytes", "67108864")[1]["max_body_bytes"] == 64 << 20


@pytest.mark.parametrize("value", ["10", "lots", "-1"])
def test_a_body_limit_under_1_kib_or_not_a_number_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    code, seen, output = parsed(monkeypatch, "--max-body-bytes", value)
    assert code == 2 and "--max-body-bytes" in output and seen == {}


def test_the_prefill_share_defaults_to_oldest_and_can_be_equal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parsed(monkeypatch)[1]["prefill_share"] == "oldest"
    assert parsed(monkeypatch, "--prefill-share", "equal")[1]["prefill_share"] == "equal"
    code, seen, output = parsed(monkeypatch, "--prefill-share", "fair")
    assert code == 2 and "--prefill-share" in output and "'oldest', 'equal'" in output
    assert seen == {}
