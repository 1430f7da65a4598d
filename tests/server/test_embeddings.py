"""`continuum serve --semantic`: /v1/embeddings, the semantic tier and the memory graph behind
the OpenAI API, and the OpenAIEmbedder as a client of it — on 127.0.0.1, real models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from continuum.backends.embedders import OpenAIEmbedder, SentenceTransformerEmbedder
from continuum.errors import EmbeddingError, InvalidRequest
from tests.server.test_app import SYSTEM, Running, _serve, free_port


@pytest.fixture(scope="module")
def semantic_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("semantic")
    yield from _serve(tmp, semantic=True, graph=tmp / "graph.db")


@pytest.mark.slow
def test_embeddings_endpoint_matches_the_in_process_embedder(semantic_srv: Running) -> None:
    client = semantic_srv.client()
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=["What is the capital of France?"])
    remote = np.array(r.data[0].embedding, dtype=np.float32)
    local = SentenceTransformerEmbedder().embed(["What is the capital of France?"])[0]
    assert remote.shape == (384,) and np.allclose(remote, local, atol=1e-5)
    e = OpenAIEmbedder(semantic_srv.url + "/v1", model="all-MiniLM-L6-v2")
    try:
        assert e.dim == 384 and e.identity.startswith("openai:")
        v = e.embed(["a cat", "a kitten", "x " * 5000])  # the last is split at max_chars
        assert v.shape == (3, 384) and float(v[0] @ v[1]) > 0.7
        with pytest.raises(EmbeddingError, match="empty"):
            e.embed([""])
    finally:
        e.close()


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_embeddings_bad_input(semantic_srv: Running) -> None:
    with semantic_srv.http() as h:
        wrong_model = h.post("/v1/embeddings", json={"model": "nope", "input": "hi"})
        assert wrong_model.status_code == 404
        assert wrong_model.json()["error"]["code"] == "model_not_found"
        empty = h.post("/v1/embeddings", json={"model": "continuum", "input": ["ok", " "]})
        assert empty.status_code == 400 and empty.json()["error"]["code"] == "embedding_error"
        not_text = h.post("/v1/embeddings", json={"model": "continuum", "input": [{"a": 1}]})
        assert not_text.status_code == 400
        base64 = h.post(
            "/v1/embeddings", json={"model": "continuum", "input": "hi", "encoding_format": "x"}
        )
        assert base64.status_code == 400
    with pytest.raises(EmbeddingError, match="404"):
        OpenAIEmbedder(semantic_srv.url, model="nope")
    with pytest.raises(EmbeddingError, match="cannot reach"):
        OpenAIEmbedder(f"http://127.0.0.1:{free_port()}", model="x", timeout=2)
    with pytest.raises(InvalidRequest, match="http"):
        OpenAIEmbedder("localhost:8000", model="x")


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_semantic_hits_through_chat_completions(semantic_srv: Running) -> None:
    client = semantic_srv.client()

    def ask(q: str):  # type: ignore[no-untyped-def]
        return client.chat.completions.create(
            model=semantic_srv.state.model_id,
            max_tokens=8,
            temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        )

    first = ask("Explain what Kubernetes is.")
    second = ask("Can you tell me what Kubernetes is?")  # a paraphrase the judge accepts
    usage = second.usage.model_extra["continuum"]  # type: ignore[union-attr,index]
    assert usage["hit_tier"] == "semantic"
    assert {"tier": "semantic", "outcome": "hit"}.items() <= usage["tiers"][-1].items()
    assert second.choices[0].message.content == first.choices[0].message.content
    third = ask("Explain what Docker is.")
    assert third.usage.model_extra["continuum"]["hit_tier"] != "semantic"  # type: ignore[union-attr,index]
    metrics = semantic_srv.state.ops.metrics()
    assert metrics["semantic"]["hits"] == 1 and metrics["memory_graph"]["misses"] >= 2
    assert metrics["semantic"]["verifier_judgments"] >= 1  # the hit was judged, on by default


def test_embeddings_need_a_semantic_server(tmp_path: Path) -> None:
    for running in _serve(tmp_path):
        with running.http() as h:
            r = h.post("/v1/embeddings", json={"model": "continuum", "input": "hi"})
        assert r.status_code == 400 and "--semantic" in r.json()["error"]["message"]
