"""A scripted support agent, run in its own process by test_memory_graph (one process per run).

    python -m tests.tiers.graph_agent RUN GRAPH CACHE_DIR     (GRAPH: a SQLite path or redis:// URL)

Prints one JSON object: for every step, the tier that served it, the graph's outcome, what was
surfaced, the text, and whether the backend was called.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from continuum import EngineConfig, GenerationParams, Session, TokenOp, ToolOp
from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.tiers.memory_graph import MemoryGraph

PARAMS = GenerationParams(max_tokens=12)
ORDER = {"order": 42, "status": "shipped", "city": "Lisbon", "eta": "Friday"}
CUSTOMER = {"customer": 7, "name": "Ana Silva", "tier": "gold"}
STOCK = {1: {"sku": "widget", "in_stock": 7}, 2: {"sku": "widget", "in_stock": 0}}


def ask(context: str, question: str) -> TokenOp:
    return TokenOp(
        "support.answer",
        messages=(
            {"role": "system", "content": f"You are a support agent. {context}".strip()},
            {"role": "user", "content": question},
        ),
        params=PARAMS,
    )


def record(s: Session, name: str, op: TokenOp | ToolOp, out: dict[str, Any], ns: str) -> str:
    r = s.run(op, namespace=ns)
    m = r.metrics
    out[name] = {
        "tier": m.hit_tier,
        "graph": m.outcome_of("memory_graph"),
        "backend_called": m.backend_called,
        "text": r.text,
        "surfaced": [item.question for item in r.surfaced],
    }
    return json.dumps(r.value, sort_keys=True) if isinstance(op, ToolOp) else r.text


def main(run: int, graph_path: str, cache: Path) -> dict[str, Any]:
    embedder = SentenceTransformerEmbedder()
    graph = MemoryGraph(graph_path, embedder=embedder)
    out: dict[str, Any] = {}
    s = Session(
        "acme",
        n_ctx=1024,
        n_slots=2,
        config=EngineConfig(snapshot_dir=cache / f"snaps{run}"),
        graph=graph,
    )
    try:
        order = record(
            s,
            "get_order",
            ToolOp("get_order", lambda order_id: ORDER, {"order_id": 42}),
            out,
            "acme",
        )
        old_stock = json.dumps(STOCK[1], sort_keys=True)
        if run == 1:
            customer = record(
                s,
                "get_customer",
                ToolOp("get_customer", lambda cid: CUSTOMER, {"cid": 7}),
                out,
                "acme",
            )
            record(
                s,
                "customer",
                ask(f"Customer: {customer}", "What tier is this customer?"),
                out,
                "acme",
            )
        stock = record(
            s,
            "get_stock",
            ToolOp("get_stock", lambda sku: STOCK[run], {"sku": "widget"}),
            out,
            "acme",
        )
        record(s, "order", ask(f"Order record: {order}", "Where is order 42 going?"), out, "acme")
        # run 2 still holds run 1's stock text (an agent's stale copy): the graph must not serve
        record(
            s,
            "stock",
            ask(f"Stock record: {old_stock}", "How many widgets are in stock?"),
            out,
            "acme",
        )
        del stock
        record(s, "pure", ask("", "What is the capital of Portugal?"), out, "acme")
        if run == 2:
            # asked again without fetching the customer: its dependency is not re-observed
            customer = json.dumps(CUSTOMER, sort_keys=True)
            record(
                s,
                "customer",
                ask(f"Customer: {customer}", "What tier is this customer?"),
                out,
                "acme",
            )
            record(s, "related", ask("", "When will order 42 arrive in Lisbon?"), out, "acme")
            record(
                s,
                "other_tenant",
                ask(f"Order record: {order}", "Where is order 42 going?"),
                out,
                "globex",
            )
        out["graph_stats"] = graph.stats()
        out["counts"] = graph.store.counts()
    finally:
        s.close()
        graph.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))))
