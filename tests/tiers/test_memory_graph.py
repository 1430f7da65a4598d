"""The memory graph: recording, verified answers, surfaced context, invalidation and namespaces —
in-process on a real SQLite file, and across two processes running a scripted agent on the real
default model."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from continuum import EngineConfig, GenerationParams, InvalidRequest, ModelFile, Session, TokenOp
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.errors import StoreError
from continuum.hashing import canonical_json
from continuum.tiers.memory_graph import MemoryGraph, mentions

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture
def graph(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> Iterator[MemoryGraph]:
    g = MemoryGraph(tmp_path / "graph.db", embedder=embedder)
    yield g
    g.close()


def op(g: MemoryGraph, ns: str, key: str, question: str, answer: str, input_text: str = "") -> int:
    return g.record_op(
        ns,
        key,
        op_name="ask",
        query=question,
        input_text=input_text or question,
        text=answer,
        tokens=(1, 2, 3),
        finish_reason="stop",
        prompt_tokens=20,
        deterministic=True,
    )


def tool(g: MemoryGraph, ns: str, name: str, value: Any) -> str:
    g.record_tool(ns, f"tool:{name}", name, {"id": 1}, value)
    return canonical_json(value).decode()


def test_a_pure_op_is_answered_across_runs(graph: MemoryGraph) -> None:
    assert graph.answer("ns", "k1").outcome == "miss"
    op(graph, "ns", "k1", "What is the capital of Portugal?", "Lisbon")
    graph.new_run("ns")
    found = graph.answer("ns", "k1")
    assert found.outcome == "hit" and found.text == "Lisbon" and found.tokens == (1, 2, 3)
    assert graph.answer("other", "k1").outcome == "miss"  # namespaces are partitioned
    assert graph.counts.hits == 1 and graph.counts.misses == 2


def test_a_dependency_must_be_observed_again_unchanged(graph: MemoryGraph) -> None:
    record = tool(graph, "ns", "get_order", {"order": 42, "city": "Lisbon"})
    op(graph, "ns", "k", "Where is order 42 going?", "Lisbon", f"Order: {record}")
    graph.new_run("ns")
    unverified = graph.answer("ns", "k")
    assert unverified.outcome == "unverified" and unverified.unconfirmed == ("get_order",)
    tool(graph, "ns", "get_order", {"order": 42, "city": "Lisbon"})  # observed again, unchanged
    assert graph.answer("ns", "k").outcome == "hit"
    graph.new_run("ns")
    assert tool(graph, "ns", "get_order", {"order": 42, "city": "Porto"})  # it changed
    assert graph.answer("ns", "k").outcome == "stale"
    assert graph.counts.invalidated == 2  # the op and its result


def test_invalidation_is_transitive_through_quoted_answers(graph: MemoryGraph) -> None:
    record = tool(graph, "ns", "read_file", "def add(a, b): return a - b")
    op(graph, "ns", "summary", "Summarise the file", "add() subtracts its arguments", record)
    op(graph, "ns", "review", "Is there a bug?", "Yes: add() subtracts instead of adding",
       "Summary: add() subtracts its arguments. Is there a bug?")  # fmt: skip
    op(graph, "ns", "other", "What is 2+2?", "4")
    graph.new_run("ns")
    tool(graph, "ns", "read_file", "def add(a, b): return a + b")
    assert graph.answer("ns", "summary").outcome == "stale"
    assert graph.answer("ns", "review").outcome == "stale"  # it used the stale summary
    assert graph.answer("ns", "other").outcome == "hit"
    # stale work is never surfaced either
    surfaced = graph.surface("ns", "Does add() have a bug?")
    assert all("add()" not in item.answer for item in surfaced)


def test_surfacing_finds_prior_runs_by_meaning_and_entities(graph: MemoryGraph) -> None:
    op(graph, "ns", "a", "Where is order 42 going?", "To Lisbon, arriving Friday.")
    op(graph, "ns", "b", "How do I bake sourdough bread?", "Feed the starter first.")
    op(graph, "other", "c", "Where is order 42 going?", "Secret of another tenant.")
    assert graph.surface("ns", "When does order 42 reach Lisbon?") == []  # same run: not prior
    graph.new_run("ns")
    items = graph.surface("ns", "When does order 42 reach Lisbon?")
    assert [i.question for i in items] == ["Where is order 42 going?"]
    assert "42" in items[0].shared_entities and items[0].similarity is not None
    assert all("another tenant" not in i.answer for i in items)
    assert graph.surface("ns", "Tell me about the stock market") == []
    assert graph.counts.surfaced_ops == 1 and graph.counts.surfaced_items == 1
    with pytest.raises(InvalidRequest):
        graph.surface("ns", None)  # type: ignore[arg-type]


def test_mentions() -> None:
    found = mentions('Ship order 42 to "Rua Augusta 12" in Lisbon for Ana Silva.')
    assert {"42", "rua augusta 12", "lisbon", "ana silva"} <= found


def test_bad_graph_files(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreError, match="cannot be opened"):
        MemoryGraph(tmp_path / "dir.db")
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        MemoryGraph(tmp_path / "junk.db")
    db = sqlite3.connect(tmp_path / "future.db")
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StoreError, match="schema 99"):
        MemoryGraph(tmp_path / "future.db")


def test_a_graph_without_an_embedder_surfaces_by_entities(tmp_path: Path) -> None:
    g = MemoryGraph(tmp_path / "g.db")
    try:
        op(g, "ns", "a", "Where is order 42 going?", "To Lisbon.")
        g.new_run("ns")
        items = g.surface("ns", "Has order 42 shipped to Lisbon yet?")
        assert [i.question for i in items] == ["Where is order 42 going?"]
        assert items[0].similarity is None
    finally:
        g.close()


# -- on the real model ---------------------------------------------------------------------------
def run_agent(run: int, graph: Path, cache: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.tiers.graph_agent", str(run), str(graph), str(cache)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_two_processes_share_the_graph(tmp_path: Path) -> None:
    graph = tmp_path / "graph.db"
    first = run_agent(1, graph, tmp_path)
    steps = ("order", "stock", "pure", "customer")
    assert all(first[k]["backend_called"] and first[k]["graph"] == "miss" for k in steps)
    second = run_agent(2, graph, tmp_path)
    # the same question with an unchanged tool result: answered from the graph, no backend call
    assert second["order"]["tier"] == "memory_graph" and not second["order"]["backend_called"]
    assert second["order"]["text"] == first["order"]["text"]
    assert second["pure"]["tier"] == "memory_graph"  # no dependencies: pure in its key
    # the stock changed in run 2: run 1's answer is stale and is not reused
    assert second["stock"]["graph"] == "stale" and second["stock"]["backend_called"]
    # the customer record was not fetched again in run 2: unverified, so it runs
    assert second["customer"]["graph"] == "unverified" and second["customer"]["backend_called"]
    # a related question surfaces run 1's order answer (never the stale stock one)
    assert "Where is order 42 going?" in second["related"]["surfaced"]
    assert not any("widget" in q for q in second["related"]["surfaced"])
    assert second["related"]["tier"] != "memory_graph"  # surfaced context is not a hit
    # another namespace sees nothing of acme's runs
    assert second["other_tenant"]["graph"] == "miss"
    assert second["other_tenant"]["surfaced"] == [] and second["other_tenant"]["backend_called"]
    stats = second["graph_stats"]
    assert stats["hits"] == 2 and stats["stale_rejections"] == 1 and stats["unverified"] == 1
    assert stats["invalidated"] >= 2 and stats["surfaced_ops"] >= 1


def test_injected_context_reaches_the_prompt(
    gemma: ModelFile, embedder: SentenceTransformerEmbedder, tmp_path: Path
) -> None:
    graph = MemoryGraph(tmp_path / "g.db", embedder=embedder, inject=True)
    s = Session(
        "ns",
        model=gemma,
        n_ctx=1024,
        n_slots=2,
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
        graph=graph,
    )
    params = GenerationParams(max_tokens=8)
    try:
        s.run(TokenOp("ask", messages=({"role": "user", "content": "Where is order 42 going?"},),
                      params=params))  # fmt: skip
        graph.new_run("ns")
        related = TokenOp(
            "ask", messages=({"role": "user", "content": "When will order 42 arrive?"},),
            params=params,
        )  # fmt: skip
        with_context = s.run(related)
        assert [i.question for i in with_context.surfaced] == ["Where is order 42 going?"]
        assert with_context.metrics.tier("memory_graph").surfaced == 1  # type: ignore[union-attr]
        assert with_context.metrics.hit_tier in ("cold", "prefix_kv")  # never a graph hit
        bare = s.backend.prompt_tokens(list(related.messages or ()), None)
        assert with_context.metrics.prompt_tokens > len(bare) + 10  # the context went in
        assert s.metrics()["memory_graph"]["surfaced_items"] == 1
    finally:
        s.close()
        graph.close()
