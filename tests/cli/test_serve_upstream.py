"""``continuum serve --backend openai_http``'s ``--upstream-*`` routing options: they reach the
server's configuration as one :class:`UpstreamRouting`, and a malformed one is one ``error:``
line and exit status 2, before anything loads."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from continuum import UpstreamRouting
from continuum.cli import serve as serve_cli
from continuum.cli.main import main
from continuum.server.state import ServerConfig


class Stop(Exception):
    """Raised in place of loading anything: the options were read."""


def routing_of(monkeypatch: pytest.MonkeyPatch, *args: str) -> UpstreamRouting:
    seen: dict[str, Any] = {}

    def build(config: ServerConfig) -> None:
        seen["upstream_routing"] = config.engine.backend.openai_http.routing()
        raise Stop

    monkeypatch.setattr(serve_cli, "build_state", build)
    r = CliRunner().invoke(serve_cli.serve, ["--port", "0", "--backend", "openai_http", *args])
    assert isinstance(r.exception, Stop), r.output
    routing = seen["upstream_routing"]
    assert isinstance(routing, UpstreamRouting)
    return routing


def test_the_defaults_send_no_salt_and_the_vllm_router_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert routing_of(monkeypatch) == UpstreamRouting(
        salt_field="none", affinity_header="X-Session-ID", prompt_cache_key=False
    )


def test_every_routing_option_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    got = routing_of(
        monkeypatch,
        "--upstream-salt-field",
        "extra_key",
        "--upstream-salt-secret",
        "s3cret",
        "--upstream-affinity-header",
        "X-SMG-Routing-Key",
        "--upstream-prompt-cache-key",
    )
    assert got == UpstreamRouting(
        salt_field="extra_key",
        salt_secret="s3cret",
        affinity_header="X-SMG-Routing-Key",
        prompt_cache_key=True,
    )


def test_the_secret_comes_from_the_environment_and_none_means_no_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTINUUM_UPSTREAM_SALT_SECRET", "from-env")
    got = routing_of(monkeypatch, "--upstream-affinity-header", "none")
    assert got.salt_secret == "from-env" and got.affinity_header is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--upstream-salt-field", "vllm"], "use one of cache_salt, extra_key, both, none"),
        (["--upstream-affinity-header", ""], "name the header the router hashes on"),
        (["--upstream-affinity-header", "X Session"], "a header name is"),
        (["--upstream-affinity-header", "Authorization"], "sets that header itself"),
        (["--upstream-salt-secret", ""], "non-empty secret"),
    ],
)
def test_a_malformed_option_is_one_error_line_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    def build(config: ServerConfig) -> None:
        raise AssertionError("the server was built despite a malformed option")

    monkeypatch.setattr(serve_cli, "build_state", build)
    r = CliRunner().invoke(
        main,
        ["serve", "--port", "0", "--backend", "openai_http", "--upstream", "http://x/v1", *args],
    )
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend option "), r.stderr
    assert says in lines[0] and "Traceback" not in r.output


def test_help_names_the_routers_and_the_fields() -> None:
    r = CliRunner().invoke(main, ["serve", "--help"], terminal_width=400)
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    for name in (
        "--upstream-salt-field",
        "cache_salt",
        "extra_key",
        "--upstream-salt-secret",
        "--upstream-affinity-header",
        "x-user-id",
        "X-SMG-Routing-Key",
        "--upstream-prompt-cache-key",
        "prompt_cache_key",
    ):
        assert name in text, name
