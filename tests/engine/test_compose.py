"""The composition root: an engine from one settings tree, its parts given to its constructor;
what the lanes and exactness ask of the backend reaches it as needs, not as its name."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from continuum.backends.registry import BackendRegistry
from continuum.engine import Engine, EngineSettings, compose
from continuum.errors import InvalidRequest, StoreUnavailable
from continuum.ops import TokenOp
from continuum.params import GenerationParams
from continuum.store.stores import SnapshotPlace, Stores
from tests.server.test_app import free_port

OP = TokenOp("q", prompt="The capital of France is", params=GenerationParams(max_tokens=4))


def settings(tmp: Path, **values: object) -> EngineSettings:
    base = {"model": "gemma3-270m", "n_ctx": 1024, "store": tmp / "h.db", "snapshot_dir": tmp / "s"}
    return EngineSettings.of(**{**base, **values})


@pytest.mark.parametrize("parallel", [1, 2])
def test_compose_builds_the_engine_its_settings_describe(tmp_path: Path, parallel: int) -> None:
    with compose(settings(tmp_path, parallel=parallel, n_slots=3)) as engine:
        assert engine.backend_name == "llamacpp" and engine.n_ctx == 1024
        assert engine.op_lanes == (parallel > 1)  # the lanes reach the backend as its needs
        if parallel == 1:
            assert engine.backend.n_slots == 3  # type: ignore[attr-defined]
        assert engine.worker().config.parallel == parallel and engine.worker().config.eager_glue
        cold = engine.run(OP, namespace="t")
        assert cold.metrics.hit_tier == "cold" and cold.metrics.prompt_tokens_evaluated > 0
        assert engine.run(OP, namespace="t").metrics.hit_tier == "memo"
        session = engine.create_session("Be brief.")
        reply = session.append([{"role": "user", "content": "Hi."}], GenerationParams(max_tokens=3))
        assert reply.metrics.prompt_tokens_evaluated > 0
    assert (tmp_path / "h.db").exists()  # the store it was given, not the default


def test_an_exact_engine_gets_a_stream_per_sequence_and_an_exact_worker(tmp_path: Path) -> None:
    with compose(settings(tmp_path, exact=True, parallel=1)) as engine:
        assert engine.config.exact and engine.worker().config.exact
        assert engine.backend.llama.config.unified is False  # type: ignore[attr-defined]


def test_no_eager_glue_reaches_the_worker(tmp_path: Path) -> None:
    with compose(settings(tmp_path, eager_glue=False, parallel=1)) as engine:
        assert not engine.worker().config.eager_glue


def test_a_malformed_store_url_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    built: list[object] = []
    registry = BackendRegistry(entry_points_group=None)
    registry.register("watch", lambda **o: built.append(o))  # type: ignore[arg-type,func-returns-value]
    bad = EngineSettings.with_backends(registry).of(backend="watch", store="redis://h:1/abc")
    with pytest.raises(InvalidRequest, match="not a number"):
        compose(bad, registry=registry)
    assert built == []


class Closing:
    """Only what compose touches before the stores open."""

    closed = False

    def close(self) -> None:
        self.closed = True


def test_an_unreachable_store_closes_the_backend_it_built(tmp_path: Path) -> None:
    made = Closing()
    registry = BackendRegistry(entry_points_group=None)
    registry.register("watch", lambda **o: made)  # type: ignore[arg-type,return-value]
    gone = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailable):
        compose(
            EngineSettings.with_backends(registry).of(backend="watch", store=gone),
            registry=registry,
        )
    assert made.closed


def test_settings_by_leaf_name_refuse_what_the_tree_has_not() -> None:
    with pytest.raises(InvalidRequest, match="no setting 'n_ctxx'"):
        EngineSettings.of(n_ctxx=1024)
    with pytest.raises(ValidationError):
        EngineSettings.of(parallel=0)  # the bounds the command line checks too
    assert EngineSettings.of(store=Path("/tmp/x.db")).store.store == "/tmp/x.db"


def test_the_constructor_takes_a_backend_not_a_name(tmp_path: Path) -> None:
    stores = Stores.open(tmp_path / "h.db", SnapshotPlace(1 << 20, directory=tmp_path / "s"))
    try:
        with pytest.raises(InvalidRequest, match=r"Engine.open\(...\) or continuum.engine.compose"):
            Engine("llamacpp", stores=stores)  # type: ignore[arg-type]
    finally:
        stores.close()
