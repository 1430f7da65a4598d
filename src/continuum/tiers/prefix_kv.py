"""The prefix KV tier's index: a radix tree over canonical token sequences (SGLang-style).

Each namespace has its own root, so no lookup can cross tenants (DESIGN.md §3.8). An *entry* is a
token sequence with a handle (a :class:`~continuum.tiers.state.BackendState` in the engine) whose
KV holds exactly that sequence. Because attention is causal, the KV of a sequence's first L
positions is the KV of its first L tokens, so a lookup returns the longest common prefix between
the query and *any* stored entry, together with an entry that extends that common prefix: the
caller may use that entry's state for exactly those L tokens and no more (§3.5).

Invariants:
- ``self._lru`` holds exactly the nodes that carry a handle, least recently used first.
- A node without a handle always has at least one child (empty leaves are pruned on removal).
- Edges out of a node start with distinct tokens.

Memory is bounded by ``capacity`` entries; the least recently used entry is evicted (and handed
to ``on_evict`` so the owner can free its KV) when an insert would exceed it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from continuum.backends.base import MIN_BATCH, KVBackend
from continuum.metrics import TierOutcome
from continuum.stateful.plan import common_prefix
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss
from continuum.tiers.state import BackendState, StateKind, prefix_hash

H = TypeVar("H")


@dataclass(eq=False)
class _Node(Generic[H]):
    edge: tuple[int, ...]
    parent: _Node[H] | None
    children: dict[int, _Node[H]] = field(default_factory=dict)
    handle: H | None = None
    namespace: str = ""

    def key(self) -> tuple[int, ...]:
        parts: list[tuple[int, ...]] = []
        node: _Node[H] | None = self
        while node is not None:
            parts.append(node.edge)
            node = node.parent
        return tuple(t for part in reversed(parts) for t in part)


@dataclass(frozen=True, slots=True)
class PrefixMatch(Generic[H]):
    """``length`` query tokens are shared with the entry ``key`` whose state is ``handle``."""

    length: int
    key: tuple[int, ...]
    handle: H


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RadixTrie(Generic[H]):
    def __init__(
        self, capacity: int, on_evict: Callable[[str, tuple[int, ...], H], None] | None = None
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._on_evict = on_evict
        self._roots: dict[str, _Node[H]] = {}
        self._lru: OrderedDict[int, _Node[H]] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def _root(self, namespace: str) -> _Node[H]:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Node((), None, namespace=namespace)
        return root

    # -- insert ----------------------------------------------------------------------------------
    def insert(self, namespace: str, tokens: Sequence[int], handle: H) -> None:
        """Store ``handle`` for exactly ``tokens`` (replacing, and evicting, an older one)."""
        if not tokens:
            raise ValueError("cannot store an empty prefix")
        node = self._root(namespace)
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(tuple(tokens[pos:]), node, namespace=namespace)
                node.children[tokens[pos]] = leaf
                node = leaf
                pos = len(tokens)
                break
            n = _common(child.edge, tokens[pos:])
            if n < len(child.edge):  # split the edge at n
                mid = _Node(child.edge[:n], node, namespace=namespace)
                node.children[tokens[pos]] = mid
                child.edge = child.edge[n:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            node = child
            pos += n
        if node.handle is not None:
            old = node.handle
            node.handle = None
            del self._lru[id(node)]
            if self._on_evict is not None:
                self._on_evict(namespace, node.key(), old)
        node.handle = handle
        self._lru[id(node)] = node
        while len(self._lru) > self.capacity:
            self.evict_lru()

    # -- lookup ----------------------------------------------------------------------------------
    def longest(self, namespace: str, tokens: Sequence[int]) -> PrefixMatch[H] | None:
        """Longest common prefix of ``tokens`` with any stored entry, and such an entry."""
        root = self._roots.get(namespace)
        if root is None or not tokens:
            return None
        node, pos = root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common(child.edge, tokens[pos:])
            pos += n
            node = child
            if n < len(child.edge):
                break
        if pos == 0:
            return None
        holder = self._most_recent_in(node)
        self._lru.move_to_end(id(holder))
        assert holder.handle is not None
        return PrefixMatch(pos, holder.key(), holder.handle)

    def _most_recent_in(self, node: _Node[H]) -> _Node[H]:
        best: _Node[H] | None = None
        best_rank = -1
        ranks = {k: i for i, k in enumerate(self._lru)}
        stack = [node]
        while stack:
            n = stack.pop()
            if n.handle is not None and ranks[id(n)] > best_rank:
                best, best_rank = n, ranks[id(n)]
            stack.extend(n.children.values())
        assert best is not None, "invariant: a node without a handle has descendants with one"
        return best

    def get(self, namespace: str, tokens: Sequence[int]) -> H | None:
        """The handle stored for exactly ``tokens`` (no recency change), or None."""
        node = self._exact(namespace, tokens)
        return node.handle if node is not None else None

    def _exact(self, namespace: str, tokens: Sequence[int]) -> _Node[H] | None:
        root = self._roots.get(namespace)
        node = root
        pos = 0
        while node is not None and pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None or tuple(tokens[pos : pos + len(child.edge)]) != child.edge:
                return None
            node, pos = child, pos + len(child.edge)
        return None if node is None or node is root else node

    # -- removal -----------------------------------------------------------------------------
    def remove(self, namespace: str, tokens: Sequence[int]) -> H | None:
        """Remove the entry for exactly ``tokens``; its handle is returned, not evicted."""
        node = self._exact(namespace, tokens)
        if node is None or node.handle is None:
            return None
        handle = node.handle
        self._drop(node)
        return handle

    def _drop(self, node: _Node[H]) -> None:
        node.handle = None
        del self._lru[id(node)]
        while node.parent is not None and node.handle is None and not node.children:
            parent = node.parent
            del parent.children[node.edge[0]]
            node = parent

    def evict_lru(self) -> None:
        """Evict the least recently used entry (handed to ``on_evict``)."""
        _, node = next(iter(self._lru.items()))
        assert node.handle is not None
        handle, key = node.handle, node.key()
        self._drop(node)
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(node.namespace, key, handle)

    def clear(self) -> None:
        while self._lru:
            self.evict_lru()

    def entries(self) -> Iterator[tuple[str, tuple[int, ...], H]]:
        """Every entry, least recently used first."""
        for node in list(self._lru.values()):
            assert node.handle is not None
            yield node.namespace, node.key(), node.handle


LiveSequences = Callable[[str], list[tuple[int, int]]]


class PrefixKVTier:
    """The prefix KV tier: pinned prompt KV in the backend's slots, indexed by a radix trie,
    plus the live sequences of resident conversations.

    A conversation's resident sequence *is* this tier's entry for that conversation: ``live``
    lists, for a namespace, the sequences that hold a conversation and how many of their first
    tokens were decoded as whole prompt batches (the wake prefix), so reusing them gives
    exactly the KV a cold decode would. A hit copies cells (no decode) into the backend's
    working sequence and leaves at least ``min_suffix`` tokens to decode (DESIGN.md §3.4).
    A handle is used only for a prefix it provably holds (§3.5). Evicted entries are spilled
    to layer KV by ``on_evict``.
    """

    name = "prefix_kv"

    def __init__(
        self,
        backend: KVBackend,
        *,
        min_suffix: int,
        on_evict: Callable[[str, tuple[int, ...], BackendState], None],
        live: LiveSequences | None = None,
        replies: bool = True,
    ) -> None:
        """``replies``: pin the reply's tokens with the prompt (False: the prompt alone, the
        KV decoded in whole batches, so a hit is exactly cold)."""
        self.backend = backend
        self.replies = replies
        self.min_suffix = min_suffix
        # no slots (n_slots=0): nothing is ever pinned, but live sequences still serve
        self.trie: RadixTrie[BackendState] = RadixTrie(max(1, backend.n_slots), on_evict=on_evict)
        self._live = live
        # set by the engine: how many of a request's tokens the next KV tier could restore (a
        # layer-KV snapshot); a shorter slot prefix then steps aside for it
        self.deeper: Callable[[str, Sequence[int]], int] | None = None

    def __len__(self) -> int:
        return len(self.trie)

    def lookup(self, request: TierRequest) -> Hit | Miss:
        b, tokens, ns = self.backend, request.tokens, request.namespace
        if not request.policy.enabled:
            return miss(self.name, "skipped", "policy")
        limit = len(tokens) - self.min_suffix
        best, seq = 0, -1
        match = self.trie.longest(ns, tokens)
        if match is not None:
            n, h = min(match.length, limit, match.handle.n_tokens), match.handle
            if h.aligned_with(ns, request.model, match.key) and _holds(b, h.seq_id, tokens, n):
                best, seq = n, h.seq_id
        for live_seq, exact in self._live(ns) if self._live is not None else ():
            held = b.slot_tokens(live_seq)[: min(exact, limit)]
            n = common_prefix(held, list(tokens))  # slices compare in C: no per-token loop
            if n > best:
                best, seq = n, live_seq
        if seq < 0 or not request.policy.allows_prefix(best):
            return miss(self.name, reason="below min_len" if best else "")
        if self.deeper is not None and self.deeper(ns, tokens) > best:
            return miss(self.name, reason="a snapshot holds a longer prefix")
        b.load_slot(seq, best)
        return Hit(TierOutcome(self.name, "hit", tokens=best), reused=best)

    def record(self, request: TierRequest, result: TierResult) -> None:
        """Keep the op's KV in a slot so later ops sharing a prefix skip it: the prompt and
        the reply's tokens as generated (those the working sequence decoded), since the next
        call of a conversation or an agent loop sends that reply back as its next message."""
        if not request.policy.enabled:
            return
        b, ns = self.backend, request.namespace
        tokens = tuple(request.tokens)
        if not self.replies and len(tokens) < MIN_BATCH:
            return  # decoded by the small-batch kernels: no cold prefill has this KV
        held = b.working_tokens()
        if self.replies and len(held) > len(tokens) and tuple(held[: len(tokens)]) == tokens:
            tokens = tuple(held)
        existing = self.trie.longest(ns, tokens)
        if existing is not None and existing.length == len(tokens) == len(existing.key):
            return  # already pinned (and just touched)
        if b.free_slots() == 0 and len(self.trie):
            self.trie.evict_lru()
        slot = b.pin(len(tokens))
        if slot is None:
            return
        handle = BackendState(
            StateKind.LIVE, ns, request.model, len(tokens), prefix_hash(ns, tokens), seq_id=slot
        )
        self.trie.insert(ns, tokens, handle)

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self.trie), "evictions": self.trie.evictions}


def _holds(b: KVBackend, seq: int, tokens: Sequence[int], n: int) -> bool:
    return n > 0 and b.slot_tokens(seq)[:n] == list(tokens[:n])
