"""Prometheus metrics of a server (one registry per app, never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from continuum.backends.drafting import DraftStats
from continuum.results import Result
from continuum.stateful.residency import Borrowed
from continuum.store.base import SnapshotStats


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "continuum_hits",
            "Requests served, by the tier that served them",
            ["tier"],
            registry=registry,
        )
        self.tier_outcomes = Counter(
            "continuum_tier_outcomes",
            "What each tier said about each request (hit, miss, near_miss, skipped, ...)",
            ["tier", "outcome"],
            registry=registry,
        )
        self.tokens_reused = Counter(
            "continuum_tokens_reused",
            "Prompt tokens not evaluated thanks to reuse",
            registry=registry,
        )
        self.prompt_tokens_evaluated = Counter(
            "continuum_prompt_tokens_evaluated", "Prompt tokens evaluated", registry=registry
        )
        self.ttft = Histogram(
            "continuum_ttft_seconds",
            "Time to first token",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.resets = Counter(
            "continuum_resets", "Session rebuilds, by reason", ["reason"], registry=registry
        )
        self.resident_sessions = Gauge(
            "continuum_resident_sessions", "Stateful sessions open in the worker", registry=registry
        )
        self.resident_bytes = Gauge(
            "continuum_resident_bytes",
            "Bytes of KV snapshots (parked sessions and layer KV), in RAM and on disk",
            ["kind"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "continuum_queue_depth", "Requests waiting for the model", registry=registry
        )
        self.tokens_borrowed = Gauge(
            "continuum_tokens_borrowed",
            "Prompt tokens sessions took from another sequence of their tenant instead of "
            "decoding them, since the server started: a KV copy from a lane, or a snapshot no "
            "lane holds (a parked sibling's, what a stateless request left)",
            ["source"],
            registry=registry,
        )
        self.draft_tokens = Gauge(
            "continuum_draft_tokens",
            "Tokens of drafts from the replies' own context since the server started (serve "
            "--draft): drafted, kept, and decoded again one a step for a close call",
            ["kind"],
            registry=registry,
        )
        self.draft_calls = Gauge(
            "continuum_draft_calls",
            "Replies' verifications of a draft since the server started (serve --draft)",
            registry=registry,
        )

    def observe(self, result: Result) -> None:
        m = result.metrics
        self.hits.labels(m.hit_tier).inc()
        for o in m.tiers:
            self.tier_outcomes.labels(o.tier, o.outcome).inc()
        self.tokens_reused.inc(m.tokens_reused)
        self.prompt_tokens_evaluated.inc(m.prompt_tokens_evaluated)
        self.ttft.observe(m.ttft_ms / 1000)
        for r in m.resets:
            self.resets.labels(r.reason.value).inc()

    def observe_gauges(
        self,
        sessions: int | None,
        snapshots: SnapshotStats,
        queue_depth: int,
        drafts: DraftStats | None = None,
        borrowed: Borrowed | None = None,
    ) -> None:
        """The server's levels now: resident sessions (None: no worker), snapshot bytes,
        requests waiting, what drafting did (None: no context that drafts), and the tokens
        sessions borrowed (None: no worker)."""
        if sessions is not None:
            self.resident_sessions.set(sessions)
        if borrowed is not None:
            self.tokens_borrowed.labels("lane").set(borrowed.from_lanes)
            self.tokens_borrowed.labels("snapshot").set(borrowed.from_snapshots)
        if drafts is not None:
            self.draft_tokens.labels("drafted").set(drafts.drafted)
            self.draft_tokens.labels("kept").set(drafts.accepted)
            self.draft_tokens.labels("decoded_again").set(drafts.redone)
            self.draft_calls.set(drafts.calls)
        self.resident_bytes.labels("snapshots_ram").set(snapshots.ram_bytes)
        self.resident_bytes.labels("snapshots_disk").set(snapshots.disk_bytes)
        self.queue_depth.set(queue_depth)
