"""Shared fixtures: the real models and workers on them (no fakes stand in for a model).

The suite runs on the fastest model that shows each behaviour: Gemma 3 270M, through
``CONTINUUM_MODEL`` (inherited by the CLI and server processes the tests start). Tests of the
default model itself (Qwen2.5-Coder-0.5B-Instruct) remove the variable and say so.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from continuum import LlamaConfig, ModelFile, Worker, WorkerConfig, resolve_model
from continuum.backends.llama_process import Weights
from tests.redis_server import RedisServer

os.environ.setdefault("CONTINUUM_MODEL", "gemma3-270m")


def corrupt_files(directory: Path) -> int:
    """Flip a byte in the middle of every file under ``directory`` (KV snapshots on disk);
    how many there were."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    for f in files:
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    return len(files)


MODELS = ("gemma3-270m", "smollm2-135m")
_resolved: dict[str, ModelFile] = {}


def model(alias: str) -> ModelFile:
    if alias not in _resolved:
        _resolved[alias] = resolve_model(alias)
    return _resolved[alias]


@pytest.fixture(scope="session", autouse=True)
def _weights_stay_loaded() -> Iterator[None]:
    """A model's weights are loaded once for the whole run, not once per test that opens a
    backend on it (about 0.5 s each for Gemma 3 270M: a fifth of the default run's time)."""
    with Weights.retained():
        yield


@pytest.fixture(params=MODELS)
def model_file(request: pytest.FixtureRequest) -> ModelFile:
    return model(request.param)


@pytest.fixture
def gemma() -> ModelFile:
    return model("gemma3-270m")


WorkerFactory = Callable[..., Worker]


@pytest.fixture
def make_worker(tmp_path: Path) -> Iterator[WorkerFactory]:
    """Build workers on a real model with a fresh SQLite store in tmp_path; closed at teardown."""
    made: list[Worker] = []

    def make(mf: ModelFile, n_ctx: int = 2048, store: Path | None = None, **kw: object) -> Worker:
        cfg = WorkerConfig(llama=LlamaConfig(n_ctx=n_ctx), **kw)  # type: ignore[arg-type]
        w = Worker(mf, cfg, store=store or tmp_path / "history.db")
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session's tests; each test takes its own key prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer, request: pytest.FixtureRequest) -> str:
    """A URL with a key prefix of this test's own, so tests never see each other's keys."""
    import hashlib

    tag = hashlib.blake2b(request.node.nodeid.encode(), digest_size=6).hexdigest()
    return f"{redis_server.url}?prefix=t{tag}"
