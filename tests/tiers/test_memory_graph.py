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

import numpy as np
import pytest

from continuum import EngineConfig, GenerationParams, InvalidRequest, ModelFile, Session, TokenOp
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.errors import StoreError
from continuum.hashing import canonical_json
from continuum.store.graph import GraphStore
from continuum.tiers.base import TierResult
from continuum.tiers.memory_graph import MemoryGraph, OpRecord, mentions

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedder() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(params=["sqlite", "redis"])
def graph(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, request: pytest.FixtureRequest
) -> Iterator[MemoryGraph]:
    """The graph on each store: a SQLite file, and a real Redis (what a fleet shares)."""
    where = (
        tmp_path / "graph.db" if request.param == "sqlite" else request.getfixturevalue("redis_url")
    )
    g = MemoryGraph(where, embedder=embedder)
    yield g
    g.close()


@pytest.fixture
def sqlite_graph(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> Iterator[MemoryGraph]:
    g = MemoryGraph(tmp_path / "graph.db", embedder=embedder)
    yield g
    g.close()


def op(g: MemoryGraph, ns: str, key: str, question: str, answer: str, input_text: str = "") -> int:
    return g.record_op(
        OpRecord(
            ns,
            key,
            op_name="ask",
            query=question,
            input_text=input_text or question,
            result=TierResult(answer, (1, 2, 3), "stop", 20),
            deterministic=True,
        )
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
    op(
        graph,
        "ns",
        "review",
        "Is there a bug?",
        "Yes: add() subtracts instead of adding",
        "Summary: add() subtracts its arguments. Is there a bug?",
    )
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


# -- crashes and graphs left incomplete by one ------------------------------------------------
def incomplete(path: Path) -> list[tuple[str, str]]:
    """(kind, key) of every op or tool call without exactly one result, and of every result no
    op or tool call produced."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT kind, key FROM nodes n WHERE kind IN ('op', 'tool_call') AND (SELECT COUNT(*)"
            " FROM edges WHERE src=n.id AND kind='produced') != 1 UNION ALL SELECT kind, key FROM"
            " nodes n WHERE kind IN ('result', 'tool_result') AND NOT EXISTS (SELECT 1 FROM edges"
            " WHERE dst=n.id AND kind='produced')"
        ).fetchall()
        return [(str(k), str(key)) for k, key in rows]
    finally:
        db.close()


def test_a_write_failing_part_way_records_nothing_of_the_op(
    sqlite_graph: MemoryGraph, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = sqlite_graph
    op(graph, "ns", "k0", "What is the capital of Portugal?", "Lisbon")
    before = graph.store.counts()

    def full_disk(self: GraphStore, *args: Any) -> Any:
        raise StoreError(self.path, "write failed (database or disk is full)")

    for method in ("add_edges", "entity"):  # after the nodes; after the edges, at the mentions
        with monkeypatch.context() as m:
            m.setattr(GraphStore, method, full_disk)
            with pytest.raises(StoreError, match="disk is full"):
                op(graph, "ns", "k1", "What is the capital of Spain?", "Madrid")
            # a tool call always runs: a store failure costs its recording, not the call
            errors = graph.counts.store_errors
            assert graph.record_tool("ns", "tool:get_order", "get_order", {}, {"order": 42}) == 0
            assert graph.counts.store_errors == errors + 1
    assert incomplete(graph.store.path) == []
    assert graph.store.counts() == before  # nothing of k1 or the tool call
    graph.new_run("ns")
    assert graph.answer("ns", "k1").outcome == "miss"
    assert graph.answer("ns", "k0").outcome == "hit"
    surfaced = graph.surface("ns", "What is the capital of Portugal?")
    assert [i.answer for i in surfaced] == ["Lisbon"]
    op(graph, "ns", "k1", "What is the capital of Spain?", "Madrid")  # recorded on a retry
    graph.new_run("ns")
    assert graph.answer("ns", "k1").text == "Madrid"


CRASH = """
import os, sys
from continuum.store.graph import GraphStore
from continuum.tiers.base import TierResult
from continuum.tiers.memory_graph import MemoryGraph, OpRecord
g = MemoryGraph(sys.argv[1])
def op(key, query, text):
    return OpRecord("ns", key, op_name="ask", query=query, input_text="q",
                    result=TierResult(text, (1,), "stop", 3), deterministic=True)
g.record_op(op("k0", "Where is order 42 going?", "To Lisbon"))
GraphStore.add_edges = lambda self, edges: os._exit(3)  # the process dies mid-op
g.record_op(op("k1", "Is order 42 still in Lisbon?", "Yes"))
"""


def test_a_process_dying_mid_op_leaves_a_usable_graph(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    died = subprocess.run([sys.executable, "-c", CRASH, str(path)], cwd=REPO, timeout=120)
    assert died.returncode == 3
    assert incomplete(path) == []
    g = MemoryGraph(path)
    try:
        assert g.answer("ns", "k1").outcome == "miss"
        assert g.answer("ns", "k0").text == "To Lisbon"
        surfaced = g.surface("ns", "When does order 42 reach Lisbon?")
        assert [i.answer for i in surfaced] == ["To Lisbon"]
    finally:
        g.close()


def test_ops_an_older_crash_left_without_a_result_are_skipped(sqlite_graph: MemoryGraph) -> None:
    graph = sqlite_graph
    question = "Where is order 42 going?"
    op(graph, "ns", "k", question, "To Lisbon, arriving Friday.")
    embedder = graph.embedder
    assert embedder is not None
    vector = np.asarray(embedder.embed([question])[0], np.float32).tobytes()
    db = sqlite3.connect(graph.store.path)
    with db:  # what an older continuum could leave behind when it crashed mid-op
        run = db.execute("SELECT MAX(id) FROM runs").fetchone()[0]

        def add(kind: str, key: str, meta: str) -> int:
            emb = vector if kind == "op" else None
            cur = db.execute(
                "INSERT INTO nodes (kind, namespace, run_id, key, text, meta, embedding,"
                " embedder, created) VALUES (?, 'ns', ?, ?, ?, ?, ?, ?, 0)",
                (kind, run, key, question, meta, emb, embedder.identity if emb else ""),
            )
            return int(cur.lastrowid or 0)

        op_meta = '{"deterministic": true, "prompt_tokens": 20}'
        add("op", "k", op_meta)  # newer than the complete op of the same key; no result
        add("op", "orphan", op_meta)  # its result, but no edge to it
        add("result", "orphan", '{"tokens": [1], "finish_reason": "stop"}')
        partial = add("op", "partial", op_meta)  # a result without its tokens
        res = add("result", "partial", '{"finish_reason": "stop"}')
        db.execute("INSERT INTO edges VALUES (?, ?, 'produced')", (partial, res))
    db.close()
    graph.new_run("ns")
    found = graph.answer("ns", "k")
    assert found.outcome == "hit" and found.text == "To Lisbon, arriving Friday."
    assert graph.answer("ns", "orphan").outcome == "miss"
    assert graph.answer("ns", "partial").outcome == "miss"
    items = graph.surface("ns", question)
    assert [i.answer for i in items] == ["To Lisbon, arriving Friday."]
    op(graph, "ns", "orphan", question, "Lisbon")  # recording in that namespace still works
    graph.new_run("ns")
    assert graph.answer("ns", "orphan").text == "Lisbon"


# -- on the real model ---------------------------------------------------------------------------
def run_agent(run: int, graph: str, cache: Path) -> dict[str, Any]:
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


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_two_processes_share_the_graph(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    graph = (
        str(tmp_path / "graph.db") if store == "sqlite" else request.getfixturevalue("redis_url")
    )
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
        s.run(
            TokenOp(
                "ask",
                messages=({"role": "user", "content": "Where is order 42 going?"},),
                params=params,
            )
        )
        graph.new_run("ns")
        related = TokenOp(
            "ask",
            messages=({"role": "user", "content": "When will order 42 arrive?"},),
            params=params,
        )
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
