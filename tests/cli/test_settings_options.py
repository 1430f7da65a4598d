"""Options generated from a settings tree: names, types, bounds, defaults and errors come from
the fields the components declare; ``continuum serve``'s tree reaches its ServerConfig whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import ValidationError, field_validator

from continuum.cli import serve as serve_cli
from continuum.cli.settings_options import flag_of, leaves, options, settings_from
from continuum.server.settings import ServeSettings, server_config
from continuum.server.state import ServerConfig
from continuum.settings import Settings, setting

# every option `continuum serve` had when it listed them by hand, and those its components
# declared since (--n-slots, --upstream-api-key, --snapshot-dir, --eager-glue/--no-eager-glue,
# --chat-format, --draft, --snapshot-ram, --park-policy, --lane-order)
SERVE_FLAGS = {
    "--model", "--n-ctx", "--threads", "--host", "--port", "--api-key", "--api-keys",
    "--admin-key", "--allowed-host", "--parallel", "--prefill-share", "--exact", "--itl-budget",
    "--seed", "--max-queue", "--max-body-bytes", "--store", "--max-sessions",
    "--max-open-sessions", "--idle-close", "--semantic", "--semantic-verifier",
    "--semantic-judge", "--semantic-delta", "--graph",
    "--backend", "--upstream", "--upstream-model", "--upstream-salt-field",
    "--upstream-salt-secret", "--upstream-affinity-header", "--upstream-prompt-cache-key",
    "--compaction", "--hosted-tools", "--n-slots", "--upstream-api-key", "--snapshot-dir",
    "--eager-glue", "--no-eager-glue", "--chat-format", "--draft", "--snapshot-ram",
    "--park-policy", "--lane-order",
}  # fmt: skip

# ServerConfig's fields a settings tree sets: their defaults must agree with the tree's
SHARED_DEFAULTS = (
    "engine", "max_queue", "max_body_bytes", "seed", "sessions", "admin_key", "hosted_tools",
    "allowed_hosts",
)  # fmt: skip


class Inner(Settings):
    level: Literal["low", "high"] = setting("low", "A choice.")
    ratio: float = setting(0.5, "Above zero.", gt=0, le=1)
    name: str = setting("x", "Lower case only.")

    @field_validator("name")
    @classmethod
    def _lower(cls, v: str) -> str:
        if v != v.lower():
            raise ValueError("use lower case")
        return v


class Tree(Settings):
    count: int = setting(3, "At least one.", ge=1, flags=("--count", "-c"))
    verbose: bool = setting(False, "A flag.")
    tags: tuple[str, ...] = setting((), "Repeatable.", flags=("--tag",))
    secret: str | None = setting(None, "From the environment.", envvar="TREE_SECRET")
    file: Path | None = setting(None, "Must exist.", exists=True)
    inner: Inner = Inner()


@click.command()
@options(Tree)
def tree_cmd(**flags: Any) -> None:
    click.echo(repr(settings_from(Tree, flags)))


def run(*args: str, env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(tree_cmd, list(args), env=env)


def test_defaults_build_the_default_tree() -> None:
    r = run()
    assert r.exit_code == 0, r.output
    assert r.output.strip() == repr(Tree())


def test_each_kind_of_field_parses_into_its_section(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    args = ["-c", "5", "--verbose", "--tag", "a", "--tag", "b", "--file", str(f)]
    args += ["--level", "high", "--ratio", "1", "--name", "ok"]
    r = run(*args, env={"TREE_SECRET": "s"})
    assert r.exit_code == 0, r.output
    want = Tree(
        count=5,
        verbose=True,
        tags=("a", "b"),
        secret="s",
        file=f,
        inner=Inner(level="high", ratio=1.0, name="ok"),
    )
    assert r.output.strip() == repr(want)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--count", "0"], "--count"),
        (["--count", "many"], "--count"),
        (["--ratio", "0"], "--ratio"),  # gt=0: zero itself refused
        (["--ratio", "1.5"], "--ratio"),
        (["--level", "mid"], "'low', 'high'"),
        (["--file", "/no/such/file"], "--file"),
        (["--name", "UPPER"], "--name"),  # only pydantic's validator refuses this one
        (["--nope"], "--nope"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_option(args: list[str], names: str) -> None:
    r = run(*args)
    assert r.exit_code == 2 and names in r.output, r.output


def test_help_shows_each_fields_help_and_default() -> None:
    r = run("--help")
    text = " ".join(r.output.split())
    for words in ("At least one.", "default: 3", "Repeatable.", "Lower case only.", "-c"):
        assert words in text, words


def test_leaves_and_flags_follow_the_tree() -> None:
    names = [name for name, _ in leaves(Tree)]
    assert names[:5] == ["count", "verbose", "tags", "secret", "file"]
    assert names[5:] == ["inner__level", "inner__ratio", "inner__name"]
    assert flag_of(Tree, "inner__ratio") == "--ratio" and flag_of(Tree, "tags") == "--tag"


def test_a_settings_value_is_frozen_and_takes_no_unknown_field() -> None:
    with pytest.raises(ValidationError):
        Tree(inner={"bogus": 1})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Tree().count = 4  # type: ignore[misc]


def test_serve_offers_exactly_the_options_it_always_had() -> None:
    longs = {
        flag
        for p in serve_cli.serve.params
        if isinstance(p, click.Option)
        for flag in (*p.opts, *p.secondary_opts)
        if flag.startswith("--")
    }
    assert longs == SERVE_FLAGS


def test_the_default_tree_is_the_default_server_config() -> None:
    got, want = server_config(ServeSettings()), ServerConfig()
    for field in SHARED_DEFAULTS:
        assert getattr(got, field) == getattr(want, field), field
    assert got.keys.open


def test_snapshot_ram_drafting_and_the_park_policy_reach_what_they_set() -> None:
    """--snapshot-ram (MiB) is the snapshot store's RAM budget, --park-policy and --lane-order
    the worker's, --draft the llama.cpp context's; each bad value is a usage error naming its
    option."""
    from continuum.errors import InvalidRequest
    from continuum.stateful.config import WorkerConfig

    engine = ServeSettings.of(snapshot_ram=64, park_policy="lru", draft=8, lane_order="age").engine
    assert engine.engine_config().snapshot_ram_bytes == 64 << 20
    assert engine.engine_config().place().ram_budget_bytes == 64 << 20
    assert engine.lanes.worker_config().park_policy == "lru"
    assert engine.lanes.worker_config().lane_order == "age"
    assert engine.backend.llamacpp.draft == 8
    assert ServeSettings().engine.engine_config().snapshot_ram_bytes == 512 << 20
    assert ServeSettings().engine.lanes.worker_config().park_policy == "price"
    with pytest.raises(InvalidRequest, match="park_policy"):
        WorkerConfig(park_policy="fifo")
    for args, flag in (
        (["--snapshot-ram", "-1"], "--snapshot-ram"),
        (["--park-policy", "fifo"], "--park-policy"),
        (["--lane-order", "oldest"], "--lane-order"),
        (["--draft", "33"], "--draft"),
    ):
        r = CliRunner().invoke(serve_cli.serve, args)
        assert r.exit_code == 2 and flag in r.output, r.output


def test_a_malformed_store_url_is_refused_before_anything_loads() -> None:
    from continuum.errors import InvalidRequest

    settings = ServeSettings.model_validate({"engine": {"store": {"store": "redis://h:1/abc"}}})
    with pytest.raises(InvalidRequest, match="not a number"):
        server_config(settings)


@pytest.mark.parametrize(
    ("tree", "error", "says"),
    [
        ({"engine": {"graph": {"graph": "redis://h:1/abc"}}}, "InvalidRequest", "not a number"),
        ({"engine": {"backend": {"backend": "nope"}}}, "UnknownBackend", "nope"),
        (
            {"engine": {"backend": {"openai_http": {"upstream_salt_field": "model"}}}},
            "BackendConfigError",
            "salt",
        ),
        (
            {"engine": {"backend": {"backend": "openai_http", "llamacpp": {"draft": 8}}}},
            "InvalidRequest",
            "--draft 8 needs --backend llamacpp",
        ),
    ],
)
def test_each_section_checks_its_own_values_before_anything_loads(
    tree: dict[str, Any], error: str, says: str
) -> None:
    """``Settings.check`` walks the tree: the graph, the backend's name and the upstream's
    routing are refused by the sections that declare them, not by a list in the server."""
    import continuum.errors

    settings = ServeSettings.model_validate(tree)
    with pytest.raises(getattr(continuum.errors, error), match=says):
        settings.check()
    with pytest.raises(getattr(continuum.errors, error), match=says):
        server_config(settings)
    ServeSettings().check()  # the defaults pass


def test_keys_and_secrets_stay_out_of_the_settings_repr() -> None:
    """A log line of the settings shows no key: serve's API keys, the admin key, the upstream's
    key and salt secret are read by name and left out of the repr."""
    secrets = {
        "api_keys": ("alpha=K-API-0123456789abcdef",),
        "admin_key": "K-ADMIN",
        "upstream_api_key": "K-UP",
        "upstream_salt_secret": "K-SALT",
    }
    settings = ServeSettings.of(**secrets)
    text = repr(settings) + str(settings)
    assert not [k for k in ("K-API", "K-ADMIN", "K-UP", "K-SALT") if k in text]
    assert settings.http.admin_key == "K-ADMIN"
    assert settings.engine.backend.openai_http.upstream_api_key == "K-UP"
    assert server_config(settings).admin_key == "K-ADMIN"
