"""Walks over the memory graph's edges (:mod:`continuum.store.graph`), one question each: what
an op used, what a changed tool result invalidates, whether an op's tool inputs were observed
again. Pure reads of a :class:`~continuum.store.graph.GraphLog`; the tier decides what they
mean (:mod:`continuum.tiers.memory_graph`)."""

from __future__ import annotations

import logging

from continuum.store.graph import GraphLog, Node, NodeQuery

log = logging.getLogger(__name__)

MIN_QUOTE = 16  # an earlier answer counts as "used" only if at least this many chars recur


def used_edges(store: GraphLog, run: int, op: int, input_text: str) -> list[tuple[int, int, str]]:
    """``used`` edges from ``op`` to the earlier outputs of ``run`` its input contains."""
    edges = []
    for node in store.nodes(NodeQuery(run_id=run, kinds=("tool_result", "result"), below=op)):
        if node.kind == "tool_result":
            forms = node.meta.get("forms") or [node.text]
            if any(f and f in input_text for f in forms):
                edges.append((op, node.id, "used"))
        elif len(node.text) >= MIN_QUOTE and node.text in input_text:
            edges.append((op, node.id, "used"))
    return edges


def complete_result(store: GraphLog, op: Node) -> Node | None:
    """The result ``op`` produced, or None where a crash left it incomplete."""
    produced = store.targets(op.id, "produced")
    res = store.node(produced[0]) if len(produced) == 1 else None
    if (
        res is None
        or res.kind != "result"
        or not isinstance(res.meta.get("tokens"), list)
        or not isinstance(res.meta.get("finish_reason"), str)
    ):
        log.debug("memory graph: op %d has no complete result; skipped", op.id)
        return None
    return res


def dependents(store: GraphLog, node_id: int) -> set[int]:
    """Every op and result that transitively used ``node_id``."""
    out: set[int] = set()
    frontier = [node_id]
    while frontier:
        current = frontier.pop()
        for op in store.sources(current, "used"):
            if op in out:
                continue
            out.add(op)
            results = store.targets(op, "produced")
            out.update(results)
            frontier.extend(results)
    return out


def tool_dependencies(store: GraphLog, op_id: int) -> list[Node]:
    """The tool results ``op_id`` used, directly or through earlier ops' results."""
    deps: list[Node] = []
    seen: set[int] = set()
    frontier = [op_id]
    while frontier:
        current = frontier.pop()
        for used in store.targets(current, "used"):
            if used in seen:
                continue
            seen.add(used)
            node = store.node(used)
            if node is None:
                continue
            if node.kind == "tool_result":
                deps.append(node)
            else:  # an earlier op's result: follow what that op used
                frontier.extend(store.sources(used, "produced"))
    return deps


def unconfirmed(store: GraphLog, op: Node, run: int) -> tuple[str, ...]:
    """Tool results ``op`` depended on that ``run`` has not observed again, unchanged."""
    missing = []
    for dep in tool_dependencies(store, op.id):
        again = store.nodes(
            NodeQuery(run_id=run, kinds=("tool_result",), key=dep.key, hash=dep.hash)
        )
        if not again:
            missing.append(dep.label or dep.key)
    return tuple(missing)
