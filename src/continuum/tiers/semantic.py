"""The semantic tier: "different wording, same intent", matched by embedding — and guarded.

What is compared. Only ops in the same *partition* are candidates for each other: same tenant
namespace, backend and model identity, op name, every decode parameter, the same embedder
identity, and an identical (canonical) context before the final user turn. Within a partition,
only the final user turn is compared semantically. A chat op whose last message is not a user
turn (a tool result, an assistant prefill) is not eligible; a ``prompt=`` op is compared as a
whole, with an empty context.

The threshold. The score is the cosine similarity of the two final turns' embeddings (unit
vectors, so the inner product); **a candidate can hit only when score >= threshold** (higher is
more similar). The default, :data:`DEFAULT_THRESHOLD`, was chosen from the labelled sweep in
``continuum bench semantic`` (docs/benchmarks.md shows the sweep and the choice).

The guard, then the verifier. A candidate at or above the threshold is rejected when the two
texts differ in numbers, quoted strings, negation, named entities or a one-word substitution
(:mod:`continuum.tiers.features`): a cheap first filter, not the safety argument. The
candidates are tried best first; the first that passes the guard goes to the verifier
(:mod:`continuum.tiers.verifier`, an instruct model judging whether the two requests ask the
same thing) and is the hit only if the verifier accepts it. Only that one candidate is judged,
so a lookup costs at most one judgment.

Outcomes, each counted: ``hit``; ``guard_rejected`` (candidates above the threshold, all
rejected); ``verifier_rejected`` (the verifier said no, ran out of time or could not judge —
fail closed); ``near_miss`` (the best candidate scored below the threshold); ``miss`` (no
candidate in the partition); ``ineligible`` (not a user turn, empty, longer than the
embedder's window — such texts are embedded only by chunking, and a match between averaged
chunks says nothing about their details — or text the guard cannot judge: another script,
code, not English, over 60 words (:func:`~continuum.tiers.features.unjudgeable`); such
requests are never served and never stored: the tier fails closed).

The verified mode (``calibration=Calibration(delta)`` with a judge; ``--semantic-verifier
verified``). No judge on the request path: a candidate that passed the guard is served at first
sight only at or above the threshold :class:`~continuum.tiers.semantic_calibration.Calibration`
learned within ``delta`` from earlier judgments; otherwise the request is a ``near_miss``
(reason ``unvetted``), answered cold, and once its answer is recorded the pair goes to the
promotion worker (:mod:`continuum.tiers.semantic_promotion`), which judges it (the two
requests, or with an answer judge both answers too) and, when the judge accepts, makes the new
request's entry serve the candidate's answer. ``threshold`` is then the lowest cosine worth a
judgment.

Like the memo, entries carry the version they were stored under; resuming a run bumps it, and
only entries of the current version are served (DESIGN.md §3.10). Results are served only for
deterministic requests unless the policy opts in — the engine checks that before calling here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from continuum.backends.embedders import Embedder
from continuum.errors import InvalidRequest, StoreError
from continuum.hashing import canonical_json, digest
from continuum.messages import Message
from continuum.metrics import TierOutcome
from continuum.params import GenerationParams
from continuum.settings import Settings, setting
from continuum.store.redis_vectors import RedisVectorLog
from continuum.tiers.base import Hit, Miss, TierRequest, TierResult, miss
from continuum.tiers.features import Guard, unjudgeable
from continuum.tiers.semantic_calibration import Calibration
from continuum.tiers.semantic_entries import LOCAL_IDS, SemanticEntries, SemanticEntry
from continuum.tiers.semantic_promotion import Promoter, Proposal
from continuum.tiers.verifier import Verdict, Verifier

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.80
METRIC = "cosine"  # of unit embeddings; a hit needs score >= threshold (higher = more similar)


@dataclass(frozen=True, slots=True)
class SemanticLookup:
    outcome: str  # hit | guard_rejected | verifier_rejected | near_miss | miss | ineligible
    entry: SemanticEntry | None = None
    score: float | None = None  # the best candidate's cosine
    reason: str = ""  # the guard check or verifier reason that rejected, or why ineligible
    vector: np.ndarray | None = None  # the query's embedding, reused when the result is stored
    ms: float = 0.0
    verdict: Verdict | None = None  # the verifier's, when a candidate was judged


@dataclass
class SemanticStats:
    lookups: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    guard_rejections: Counter[str] = field(default_factory=Counter)
    ineligible: Counter[str] = field(default_factory=Counter)
    verifier_rejections: Counter[str] = field(default_factory=Counter)
    lookup_ms: list[float] = field(default_factory=list)
    verifier_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        ms = sorted(self.lookup_ms)
        judged = sorted(self.verifier_ms)
        return {
            "lookups": self.lookups,
            "hits": self.outcomes["hit"],
            "near_misses": self.outcomes["near_miss"],
            "guard_rejections": sum(self.guard_rejections.values()),
            "guard_rejections_by_check": dict(self.guard_rejections),
            "misses": self.outcomes["miss"],
            "ineligible": dict(self.ineligible),
            "lookup_ms_median": ms[len(ms) // 2] if ms else 0.0,
            "verifier_judgments": len(judged),
            "verifier_rejections": dict(self.verifier_rejections),
            "verifier_ms_median": judged[len(judged) // 2] if judged else 0.0,
            "verifier_ms_p99": judged[int(len(judged) * 0.99)] if judged else 0.0,
        }


def split_query(
    messages: Sequence[Message] | None, prompt: str | None
) -> tuple[str, str] | tuple[None, str]:
    """(context, query) for a semantic comparison, or (None, why it is not eligible)."""
    if prompt is not None:
        return ("", prompt) if prompt.strip() else (None, "empty")
    if not messages:
        return None, "empty"
    last = messages[-1]
    if last.get("role") != "user":
        return None, "not_user_turn"
    content = last.get("content") or ""
    if not content.strip():
        return None, "empty"
    head = {k: v for k, v in last.items() if k != "content"}
    return canonical_json({"before": list(messages[:-1]), "last": head}).decode(), content


class SemanticSettings(Settings):
    """Whether the server runs the semantic tier, and what accepts its candidates."""

    semantic: bool = setting(
        False,
        "Semantic tier on completions, and /v1/embeddings (needs continuum[semantic]).",
    )
    semantic_verifier: Literal["judge", "guard", "verified"] = setting(
        "judge",
        "What accepts a semantic candidate: the instruct model as a judge, the word-rule guard "
        "alone (faster, and measured to serve different questions: see the README), or "
        "'verified': a threshold learned within --semantic-delta from judgments of near-misses "
        "made off the request path.",
    )
    semantic_judge: str | None = setting(
        None,
        "The judge's model, an alias or GGUF path (default: the bundled instruct model, on "
        "the serving weights when the server runs it; bench semantic-verified measured "
        "qwen2.5-coder-1.5b as the better judge).",
    )
    semantic_delta: float = setting(
        0.01,
        "With --semantic-verifier verified: the largest share of wrong hits to accept.",
        gt=0,
        le=0.5,
    )


class SemanticTier:
    name = "semantic"

    def __init__(
        self,
        embedder: Embedder,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        guard: Guard | None = None,
        verifier: Verifier | None = None,
        k: int = 4,
        capacity: int = 100_000,
        ann_from: int = 10_000,
        calibration: Calibration | None = None,
    ) -> None:
        if not isinstance(threshold, (int, float)) or not -1.0 <= threshold <= 1.0:
            raise InvalidRequest(f"threshold is a cosine in [-1, 1], got {threshold!r}")
        if calibration is not None and verifier is None:
            raise InvalidRequest(
                "the verified mode (calibration=) learns from a judge: give "
                "verifier=JudgeVerifier.open()"
            )
        if calibration is None and getattr(verifier, "kind", "intent") == "answer":
            raise InvalidRequest(
                "an answer judge needs the new request's own answer, so it runs off the request "
                "path: give calibration=Calibration(delta) too (the verified mode)"
            )
        self.embedder = embedder
        self.threshold = float(threshold)
        self.guard = guard if guard is not None else Guard()
        self.verifier = verifier
        self.k = k
        self.capacity = capacity
        self.version = 1
        self.counts = SemanticStats()
        self.store = SemanticEntries(
            embedder.dim, capacity=capacity, ann_from=ann_from, on_evict=self._evicted
        )
        self.shared: RedisVectorLog | None = None  # the entries a fleet shares (see attach)
        self._cursor = "0"  # the last shared record mirrored here
        self.shared_entries = 0  # entries mirrored from the shared log
        self.shared_errors = 0
        self._lock = threading.RLock()  # the entries: request threads and the promotion worker
        # the verified mode (see semantic_calibration and semantic_promotion): serve at first
        # sight by a threshold learned within delta; judge near-misses off the request path
        self.calibration = calibration
        self.promoter: Promoter | None = None
        if calibration is not None:
            assert verifier is not None  # checked above
            self.promoter = Promoter(verifier, self._decided)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.store)

    @property
    def evictions(self) -> int:
        return self.store.evictions

    def _evicted(self, entry_id: int) -> None:
        if self.calibration is not None:
            self.calibration.forget(entry_id)

    def close(self) -> None:
        """Close the verifier (the tier's entries stay until the object goes)."""
        if self.promoter is not None:
            self.promoter.close()  # finishes its worker, closes the judge
        elif self.verifier is not None:
            self.verifier.close()

    def partition(
        self,
        *,
        namespace: str,
        backend: str,
        model: str,
        op_name: str,
        params: GenerationParams,
        context: str,
    ) -> str:
        return digest(
            canonical_json(
                {
                    "ns": namespace,
                    "backend": backend,
                    "model": model,
                    "op": op_name,
                    "params": params.key_fields(),
                    "embedder": self.embedder.identity,
                    "context": context,
                }
            ),
            person=b"cont-semantic",
        )

    def ineligible(self, reason: str) -> SemanticLookup:
        """Count an op the tier cannot compare (see :func:`split_query`)."""
        self.counts.lookups += 1
        self.counts.outcomes["ineligible"] += 1
        self.counts.ineligible[reason] += 1
        return SemanticLookup("ineligible", reason=reason)

    # -- the Tier protocol ---------------------------------------------------------------------
    def lookup(self, request: TierRequest) -> Hit | Miss:
        """Serve a stored result for a request asking the same question in the same partition.
        The embedding computed here is kept in ``request.scratch`` for :meth:`record`."""
        blocked = request.serve_blocked()
        if blocked:
            return miss(self.name, "skipped", blocked)
        context, query = split_query(request.messages, request.prompt)
        if context is not None and request.tools:  # other tools: another question
            context += canonical_json(list(request.tools)).decode()
        judged = self.guard.enabled or self.verifier is not None
        if context is not None and judged and (why := unjudgeable(query)):
            context, query = None, why  # fail closed: never compared, never stored
        if context is None:
            found = self.ineligible(query)
        else:
            part = self.partition(
                namespace=request.namespace,
                backend=request.backend,
                model=request.model,
                op_name=request.op_name,
                params=request.params,
                context=context,
            )
            found = self.search(part, query)
            request.scratch[self.name] = (part, query, found.vector, found)
        outcome = TierOutcome(self.name, found.outcome, found.reason, found.score)
        if found.entry is None or found.outcome != "hit":
            return Miss(outcome)
        e = found.entry
        return Hit(outcome, TierResult(e.text, e.tokens, e.finish_reason, e.prompt_tokens))

    def record(self, request: TierRequest, result: TierResult) -> None:
        looked = request.scratch.get(self.name)
        if looked is None or looked[2] is None:
            return  # not looked up (policy) or not eligible: nothing to compare against later
        part, query, vector, found = looked
        entry = self.put(
            part,
            query,
            vector,
            text=result.text,
            tokens=result.tokens,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
        )
        if self.promoter is not None and found.outcome == "near_miss" and found.entry is not None:
            self.promoter.submit(Proposal(found.entry, entry, float(found.score or 0.0)))

    def _decided(self, proposal: Proposal, verdict: Verdict) -> None:
        """The promotion worker's verdict: an observation (when the judge judged), and on
        acceptance the new request's entry serves the anchor's answer from then on."""
        assert self.calibration is not None
        if verdict.reason in ("", "judge"):
            self.calibration.observe(proposal.anchor.id, proposal.score, verdict.accepted)
        if not verdict.accepted:
            return
        a = proposal.anchor
        with self._lock:
            if self.store.get(proposal.entry.id) == proposal.entry:  # not evicted or replaced
                self.calibration.join(proposal.entry.id, a.id)  # one answer, one group
                self.store.replace(
                    dataclasses.replace(
                        proposal.entry,
                        text=a.text,
                        tokens=a.tokens,
                        finish_reason=a.finish_reason,
                        prompt_tokens=a.prompt_tokens,
                    )
                )

    def stats(self) -> dict[str, Any]:
        out = self.counts.as_dict()
        if self.calibration is not None and self.promoter is not None:
            out["verified"] = self.calibration.as_dict() | self.promoter.stats()
        if self.shared is not None:
            out |= {"shared_entries": self.shared_entries, "shared_errors": self.shared_errors}
        return out

    # -- sharing -------------------------------------------------------------------------------
    def attach(self, shared: RedisVectorLog) -> None:
        """Share entries through ``shared``: what any process stores becomes a candidate here
        from the next lookup on (the log is mirrored into the local indexes), and the version
        is the shared one."""
        self.shared = shared
        self.store.share()
        self.version = max(self.version, self._shared(shared.version, self.version))
        self.sync()

    def sync(self) -> int:
        """Mirror the shared entries this process has not seen into its indexes; how many."""
        log_ = self.shared
        if log_ is None:
            return 0
        got = self._shared(lambda: log_.since(self._cursor), None)
        if got is None:
            return 0
        self._cursor = got.cursor  # past the records it could not read too: each is told once
        for problem in got.malformed:
            self.shared_errors += 1
            log.warning("semantic tier: skipped a shared record it cannot read (%s)", problem)
        added = 0
        for fields, vector in got.entries:
            if fields["id"] in self.store or vector.shape != (self.embedder.dim,):
                continue  # its own entry, or another embedder's dimension
            entry = SemanticEntry(**{**fields, "tokens": tuple(fields["tokens"])})
            self.store.insert(entry, vector, index=True)
            added += 1
        self.shared_entries += added
        shared_version = self._shared(log_.version, None)
        if shared_version is not None and shared_version < self.version:
            # this process bumped while the log was unreachable (bump_version's fallback): move
            # the shared version up to it, else its entries and the fleet's are never served to
            # each other. A bump racing this one can move the version one further: entries of
            # the current version then go unserved, never stale ones served.
            log.info(
                "semantic tier: the shared version %d is behind this process's %d; moving it up",
                shared_version,
                self.version,
            )
            shared_version = self._shared(lambda: log_.bump(self.version - 1), None)
        if shared_version is not None:
            self.version = max(self.version, int(shared_version))
        return added

    def _shared(self, call: Any, fallback: Any) -> Any:
        """One call to the shared log; unreachable: the fallback, logged and counted."""
        try:
            return call()
        except StoreError as e:
            self.shared_errors += 1
            log.warning("semantic tier: shared log failed (%s); this process's entries only", e)
            return fallback

    # -- search ----------------------------------------------------------------------------------
    def search(
        self, partition: str, query: str, vector: np.ndarray | None = None
    ) -> SemanticLookup:
        """Find a stored result for ``query`` in ``partition``. ``vector`` is the query's
        embedding when the caller already has it (otherwise it is computed here)."""
        t0 = time.perf_counter()
        result = self._lookup(partition, query, vector)
        ms = (time.perf_counter() - t0) * 1000
        self.counts.lookups += 1
        self.counts.outcomes[result.outcome] += 1
        self.counts.lookup_ms.append(ms)
        if result.outcome == "guard_rejected":
            self.counts.guard_rejections[result.reason] += 1
        if result.outcome == "ineligible":
            self.counts.ineligible[result.reason] += 1
        if result.verdict is not None:
            self.counts.verifier_ms.append(result.verdict.ms)
        if result.outcome == "verifier_rejected":
            self.counts.verifier_rejections[result.reason] += 1
        return dataclasses.replace(result, ms=ms)

    def _lookup(self, partition: str, query: str, vector: np.ndarray | None) -> SemanticLookup:
        if not query.strip():
            return SemanticLookup("ineligible", reason="empty")
        if not self.embedder.fits(query):
            return SemanticLookup("ineligible", reason="too_long")
        if vector is None:
            vector = self.embedder.embed([query])[0]
        with self._lock:
            return self._candidates(partition, query, vector)

    def _candidates(self, partition: str, query: str, vector: np.ndarray) -> SemanticLookup:
        self.sync()
        index = self.store.index(partition)
        if index is None or len(index) == 0:
            return SemanticLookup("miss", vector=vector)
        best: float | None = None
        rejected = ""
        proposed: SemanticEntry | None = None  # the verified mode's candidate to judge later
        # ask for a few more than k: entries of an older version are skipped, not served
        for key, score in index.search(vector, self.k * 2):
            entry = self.store.get(key)
            # the partition too: an entry is served only to the partition it was stored in
            if entry is None or entry.partition != partition or entry.version != self.version:
                continue
            best = score if best is None else best
            if score < self.threshold:
                break
            check = self.guard.rejects(query, entry.query)
            if check is not None:
                rejected = rejected or check
            elif self.calibration is None:
                return self._verified(key, entry, query, best, vector)
            elif (tau := self.calibration.threshold(key)) is not None and score >= tau:
                if not self.calibration.explores():
                    self.store.touch(key)
                    return SemanticLookup("hit", entry, best, vector=vector)
                proposed = proposed or entry  # judged instead of served: keeps the estimate fresh
            else:
                proposed = proposed or entry
        if proposed is not None:  # answered cold, judged off the path (see record)
            return SemanticLookup("near_miss", proposed, best, reason="unvetted", vector=vector)
        if rejected:
            return SemanticLookup("guard_rejected", score=best, reason=rejected, vector=vector)
        if best is None:
            return SemanticLookup("miss", vector=vector)
        return SemanticLookup("near_miss", score=best, vector=vector)

    def _verified(
        self, key: int, entry: SemanticEntry, query: str, best: float, vector: np.ndarray
    ) -> SemanticLookup:
        """The hit, if the verifier (when there is one) accepts it; else its rejection."""
        verdict = self.verifier.verify(query, entry.query) if self.verifier is not None else None
        if verdict is not None and not verdict.accepted:
            return SemanticLookup(
                "verifier_rejected",
                score=best,
                reason=verdict.reason,
                vector=vector,
                verdict=verdict,
            )
        self.store.touch(key)
        return SemanticLookup("hit", entry, best, vector=vector, verdict=verdict)

    # -- storing ---------------------------------------------------------------------------------
    def put(
        self,
        partition: str,
        query: str,
        vector: np.ndarray,
        *,
        text: str,
        tokens: Sequence[int],
        finish_reason: str,
        prompt_tokens: int,
        version: int | None = None,
    ) -> SemanticEntry:
        vector = np.asarray(vector, dtype=np.float32)
        with self._lock:
            entry = SemanticEntry(
                self._new_id(),
                partition,
                query,
                self.version if version is None else version,
                text,
                tuple(tokens),
                finish_reason,
                prompt_tokens,
            )
            shared = self.shared
            if shared is not None and entry.id < LOCAL_IDS:
                record = dataclasses.asdict(entry)
                self._shared(lambda: shared.append(record, vector), None)
            self.store.insert(entry, vector, index=True)
        return entry

    def _new_id(self) -> int:
        """A shared id (unique across the fleet), else one of this process's own."""
        if self.shared is not None:
            found = self._shared(self.shared.next_id, None)
            if found is not None:
                return int(found)
        return self.store.own_id()

    def bump_version(self, at_least: int = 0) -> int:
        """Move to a version no entry was stored under (above ``at_least``, a resumed run's
        saved version); shared, every process moves there."""
        want = max(self.version, at_least)
        shared = self.shared
        if shared is not None:
            self.version = int(self._shared(lambda: shared.bump(want), want + 1))
        else:
            self.version = want + 1
        return self.version

    # -- persistence (see SemanticEntries) ---------------------------------------------------------
    def entries(self) -> list[tuple[SemanticEntry, np.ndarray]]:
        return self.store.rows()

    def save_indexes(self, directory: Path) -> None:
        self.store.save_indexes(directory)

    def load(
        self, rows: Sequence[tuple[SemanticEntry, np.ndarray]], directory: Path | None
    ) -> dict[str, int]:
        return self.store.load(rows, directory)
