"""A backend is one module plus an entry point: installed as a package, its settings become
``continuum serve``'s options and :func:`compose` builds an engine on it, with nothing else
changed. The package here is real (a dist-info with ``entry_points.txt`` on ``sys.path``, found
by importlib.metadata as pip's would be); its backend runs the bundled Gemma 3 270M through
llama.cpp under settings of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from continuum.backends.registry import (
    BackendEntry,
    BackendNeeds,
    BackendRegistry,
    BackendSettings,
    NoSettings,
)
from continuum.cli.settings_options import options, settings_from
from continuum.engine import compose
from continuum.errors import InvalidRequest, UnknownBackend
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.server.settings import ServeSettings, server_config

MODULE = '''
"""A third party's backend: llama.cpp on a small model, with settings of its own."""
from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.llamacpp_ops import LlamaCppOpBackend
from continuum.backends.models import resolve_model
from continuum.backends.registry import BackendEntry
from continuum.settings import Settings, setting

BUILT = []


class TinySettings(Settings):
    tiny_model: str = setting("gemma3-270m", "The tiny backend's model.")
    tiny_ctx: int = setting(512, "The tiny backend's context.", ge=64)


def build(s, needs):
    BUILT.append((s, needs))
    config = LlamaConfig(n_ctx=s.tiny_ctx, n_threads=2, n_threads_batch=2)
    return LlamaCppOpBackend(resolve_model(s.tiny_model), config=config, n_slots=1)


def from_options(needs, **options):
    return build(TinySettings(**options), needs)


ENTRY = BackendEntry(TinySettings, build, from_options)
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package ``tiny-backend`` installed into ``tmp_path`` (on sys.path)."""
    (tmp_path / "tiny_backend.py").write_text(MODULE)
    info = tmp_path / "tiny_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [continuum.backends]
            tiny = tiny_backend:ENTRY
            broken = tiny_backend:BUILT
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_installed_backend_is_listed_and_loaded_on_first_use(installed: Path) -> None:
    import sys

    registry = BackendRegistry()
    assert {"tiny", "llamacpp", "openai_http"} <= set(registry.names())
    assert "tiny_backend" not in sys.modules  # listed without importing the package
    entry = registry.entry("tiny")
    assert entry.settings.__name__ == "TinySettings"
    with pytest.raises(InvalidRequest, match=r"'broken'.*BackendEntry or a callable"):
        registry.entry("broken")  # a list is neither an entry nor a factory


def test_an_installed_backends_settings_are_serves_options(installed: Path) -> None:
    tree = ServeSettings.with_backends(BackendRegistry())

    @click.command()
    @options(tree)
    def serve(**flags: object) -> None:
        settings = settings_from(tree, dict(flags))
        click.echo(repr(settings.engine.backend.chosen()))

    r = CliRunner().invoke(serve, ["--backend", "tiny", "--tiny-ctx", "1024"])
    assert r.exit_code == 0, r.output
    assert "tiny_model='gemma3-270m', tiny_ctx=1024" in r.output
    assert "--broken" not in CliRunner().invoke(serve, ["--help"]).output  # left out, warned
    bad = CliRunner().invoke(serve, ["--backend", "tiny", "--tiny-ctx", "8"])
    assert bad.exit_code == 2 and "--tiny-ctx" in bad.output  # its bounds are checked too


def test_continuum_serve_lists_an_installed_backends_options(installed: Path) -> None:
    exe = shutil.which("continuum")
    assert exe is not None
    env = {**os.environ, "PYTHONPATH": f"{installed}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([exe, "serve", "--help"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--tiny-model" in out.stdout and "The tiny backend's context." in out.stdout
    plain = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True)
    assert "--tiny-model" not in plain.stdout  # not installed: not offered


def test_compose_builds_an_engine_on_an_installed_backend(installed: Path) -> None:
    tree = ServeSettings.with_backends(BackendRegistry())
    backend = {"backend": "tiny", "tiny": {"tiny_ctx": 1024}}
    store = {"store": str(installed / "h.db")}
    engine = {"backend": backend, "store": store, "snapshot_dir": installed / "snaps"}
    settings = tree.model_validate({"engine": engine})
    config = server_config(settings)
    import tiny_backend  # type: ignore[import-not-found]

    with compose(config.engine) as engine:
        (built, needs), *_ = tiny_backend.BUILT
        assert built.tiny_ctx == 1024 and needs == BackendNeeds(lanes=4, exact=False)
        assert engine.backend_name == "tiny" and engine.n_ctx == 1024
        op = TokenOp("q", prompt="The capital of France is", params=GenerationParams(max_tokens=4))
        r = engine.run(op, namespace="t")
        assert r.metrics.prompt_tokens_evaluated > 0 and r.text
        assert engine.run(op, namespace="t").metrics.hit_tier == "memo"  # the tiers in front


def test_an_unknown_backend_is_refused_before_anything_loads() -> None:
    settings = ServeSettings.model_validate({"engine": {"backend": {"backend": "vllm-typo"}}})
    with pytest.raises(UnknownBackend, match=r"vllm-typo.*llamacpp, openai_http"):
        server_config(settings)
    with pytest.raises(UnknownBackend, match="vllm-typo"):
        BackendRegistry(entry_points_group=None).create("vllm-typo")


def test_a_remote_backend_without_an_upstream_is_refused() -> None:
    settings = BackendSettings(backend="openai_http")
    with pytest.raises(InvalidRequest, match="needs --upstream URL"):
        BackendRegistry(entry_points_group=None).build(settings)


def test_register_takes_an_entry_or_a_factory_and_refuses_the_rest() -> None:
    registry = BackendRegistry(entry_points_group=None)
    with pytest.raises(InvalidRequest, match="non-empty string"):
        registry.register("", lambda **o: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(InvalidRequest, match="BackendEntry or a callable"):
        registry.register("x", 42)  # type: ignore[arg-type]
    made: list[dict[str, object]] = []

    def factory(**options: object) -> object:
        made.append(options)
        return object()

    registry.register("bare", factory)  # type: ignore[arg-type]
    assert registry.entry("bare").settings is NoSettings
    registry.create("bare", BackendNeeds(lanes=2), a=1)
    assert made == [{"a": 1}]  # a bare factory gets its options, not the engine's needs
    entry = BackendEntry(NoSettings, lambda s, n: factory(lanes=n.lanes), factory)  # type: ignore[arg-type,return-value]
    registry.register("mine", entry)
    assert registry.entry("mine") is entry
