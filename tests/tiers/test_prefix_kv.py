"""The radix trie against a naive oracle (linear longest-common-prefix scan + LRU list)."""

from __future__ import annotations

from collections import OrderedDict

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from continuum.tiers.prefix_kv import RadixTrie

TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=8)
NAMESPACES = st.sampled_from(["a", "b"])


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class TrieVsOracle(RuleBasedStateMachine):
    CAPACITY = 5

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[tuple[str, tuple[int, ...], int]] = []
        self.trie: RadixTrie[int] = RadixTrie(
            self.CAPACITY, on_evict=lambda ns, key, h: self.evicted.append((ns, key, h))
        )
        self.oracle: OrderedDict[tuple[str, tuple[int, ...]], int] = OrderedDict()
        self.counter = 0
        self.expected_evicted: list[tuple[str, tuple[int, ...], int]] = []

    @rule(ns=NAMESPACES, tokens=TOKENS)
    def insert(self, ns: str, tokens: list[int]) -> None:
        self.counter += 1
        key = (ns, tuple(tokens))
        if key in self.oracle:
            self.expected_evicted.append((ns, key[1], self.oracle.pop(key)))
        self.oracle[key] = self.counter
        while len(self.oracle) > self.CAPACITY:
            (ons, okey), h = self.oracle.popitem(last=False)
            self.expected_evicted.append((ons, okey, h))
        self.trie.insert(ns, tokens, self.counter)

    @rule(ns=NAMESPACES, query=TOKENS)
    def longest(self, ns: str, query: list[int]) -> None:
        q = tuple(query)
        best = max((lcp(k, q) for (n, k) in self.oracle if n == ns), default=0)
        got = self.trie.longest(ns, q)
        if best == 0:
            assert got is None
            return
        assert got is not None
        assert got.length == best
        assert got.key[:best] == q[:best]  # the handle's own tokens extend the match
        assert self.oracle[(ns, got.key)] == got.handle  # tenant-local, and the live handle
        # the oracle's LRU: the returned entry was touched; it must be the most recent holder
        holders = [k for (n, k) in self.oracle if n == ns and lcp(k, q) >= best]
        assert got.key == holders[-1]
        self.oracle.move_to_end((ns, got.key))

    @rule(ns=NAMESPACES, tokens=TOKENS)
    def remove(self, ns: str, tokens: list[int]) -> None:
        expected = self.oracle.pop((ns, tuple(tokens)), None)
        assert self.trie.remove(ns, tokens) == expected

    @invariant()
    def same_entries(self) -> None:
        assert len(self.trie) == len(self.oracle)
        got = [(ns, k, h) for ns, k, h in self.trie.entries()]
        assert got == [(ns, k, h) for (ns, k), h in self.oracle.items()]
        assert self.evicted == self.expected_evicted


TrieVsOracle.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_trie_matches_oracle = TrieVsOracle.TestCase
test_trie_matches_oracle.pytestmark = [pytest.mark.slow]


def test_namespaces_never_share_entries() -> None:
    t: RadixTrie[str] = RadixTrie(10)
    t.insert("tenant-a", [1, 2, 3], "a")
    assert t.longest("tenant-b", [1, 2, 3]) is None
    match = t.longest("tenant-a", [1, 2, 9])
    assert match is not None and match.length == 2 and match.handle == "a"


def test_evictions_are_counted() -> None:
    t: RadixTrie[int] = RadixTrie(2)
    for i in range(5):
        t.insert("n", [i, i], i)
    assert t.evictions == 3 and len(t) == 2
