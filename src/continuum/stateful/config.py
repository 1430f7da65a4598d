"""A stateful worker's settings, and the backend and lanes it opens for itself.

:class:`WorkerConfig` is everything a :class:`~continuum.stateful.worker.Worker` can be told;
:func:`own_backend` asks the registry for a context of the worker's own (a worker on someone
else's is given a :class:`SharedContext` instead), and :func:`open_lanes` makes the lanes
sessions are active in: one sequence of that context, or — with ``parallel`` > 1 — a sibling
context on the same weights with one KV stream per lane, decoded together by a
:class:`~continuum.backends.batching.BatchScheduler`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from continuum.backends.base import OpBackend, SequenceBackend, SequenceView
from continuum.backends.batched_sequence import BatchedSequence
from continuum.backends.batching import LINGER_MS, BatchScheduler
from continuum.backends.context_guard import ContextGuard
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile
from continuum.backends.registry import BackendNeeds, BackendRegistry
from continuum.backends.step_plan import ITL_BUDGET, PrefillShare, check_itl_budget
from continuum.errors import InvalidRequest
from continuum.params import check_ms
from continuum.settings import Settings, setting
from continuum.stateful.compaction import NOTE_TOKENS, CompactionMode
from continuum.stateful.lane_order import LaneOrder
from continuum.store.base import SnapshotStore


class LaneSettings(Settings):
    """How sessions share the model: lanes, batch steps, exactness, and what a full one does."""

    parallel: int = setting(
        4,
        "Sessions resident at once, decoded together in each batch step (continuous "
        "batching); the others are parked as KV snapshots. 1: one turn at a time.",
        ge=1,
        le=32,
    )
    prefill_share: Literal["oldest", "equal", "las", "age"] = setting(
        "oldest",
        "With --parallel > 1, how a step's room goes to prefills too long for it: the oldest "
        "request first (lowest time to first token), equal shares (agents that start together "
        "run in lockstep: lower inter-token latency, more tokens/s, a later first token), las: "
        "the program with the least attained service first (the shortest conversation so "
        "far), or age: the program (session) that started first.",
    )
    exact: bool = setting(
        False,
        "Every reuse hit answers exactly as a cold prefill of the whole prompt (greedy replies "
        "token for token): KV is reused only where it was decoded in whole prompt batches, so "
        "a reply's KV is decoded again (while the session is idle, else in the next turn's "
        "prefill) before it is reused. Off: replies' KV is reused as decoded, and a near-tie "
        "can flip an answer.",
    )
    itl_budget: float = setting(
        ITL_BUDGET,
        "With --parallel > 1, while replies stream, a stateless request's prompt may make a "
        "step at most this many times as long as the replies' tokens alone (a long stateless "
        "prompt then no longer stalls the streams; its first token comes later). 0: no budget.",
        ge=0,
    )
    eager_glue: bool = setting(
        True,
        "After a reply, decode the template tokens that open the next user message while the "
        "session waits for it (an agent's tool call, a person typing): the next turn's prefill "
        "is that much shorter.",
        flags=("--eager-glue/--no-eager-glue",),
    )
    park_policy: Literal["price", "lru"] = setting(
        "price",
        "When a lane is needed, which resident session is parked: the one whose return costs "
        "least per second of lane it frees (its reload from RAM, disk or a prefill, over when "
        "it is expected back), or the least recently used.",
    )
    lane_order: Literal["arrival", "age", "las"] = setting(
        "arrival",
        "With more sessions than lanes, which waiting turn gets the next lane: the one waiting "
        "longest, the session that started first (programs then finish one after another: a "
        "lower median job time on a saturated server), or las: the session with the fewest "
        "tokens so far. A turn waiting 120 s goes first whatever the order.",
    )
    compaction: CompactionMode = setting(
        "window",
        "At a session's high-water mark: drop the oldest turns from its window, or have the "
        "model summarise them into a continuity note.",
    )

    def worker_config(self) -> WorkerConfig:
        """The worker these settings ask for."""
        return WorkerConfig(
            eager_glue=self.eager_glue,
            compaction=self.compaction,
            parallel=self.parallel,
            prefill_share=self.prefill_share,
            itl_budget=self.itl_budget or None,
            exact=self.exact,
            park_policy=self.park_policy,
            lane_order=self.lane_order,
        )


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Settings of a worker. ``high_water`` is a fraction of n_ctx (<= 1.0) or a token count."""

    llama: LlamaConfig = field(default_factory=LlamaConfig)
    # a worker on a context of its own asks the registry for this backend (with no prefix
    # slots) and runs on its resident sequence; it must keep resident sequences
    backend: str = "llamacpp"
    high_water: float = 0.9
    # a window that must move (prompt + reply would cross the high-water mark) moves far
    # enough to fit under this share of the mark, so it moves again only after several turns
    # instead of at nearly every one; 1.0: just under the mark
    low_water: float = 0.75
    park_budget_bytes: int = 512 << 20  # RAM for parked KV snapshots (LRU)
    # KV snapshots on disk: a session pushed out of the park budget, closed, or left open when
    # the worker closes is written to <snapshot_dir>, and comes back from there without
    # re-prefill (None: a "snapshots" folder next to the history store); least recently used
    # files are deleted past ``snapshot_disk_bytes``. An engine shares its own store instead.
    session_snapshots: bool = True
    snapshot_dir: Path | None = None
    snapshot_disk_bytes: int | None = 4 << 30
    rebuild_reserve_tokens: int = 256  # room left for a reply when rebuilding on reopen
    # what a session does with the turns that leave its window at the high-water mark:
    # "window" drops them from it; "summary" has the model summarise the conversation into a
    # continuity note of at most ``note_tokens`` (see continuum.stateful.compaction)
    compaction: CompactionMode = "window"
    note_tokens: int = NOTE_TOKENS
    # eager glue: after a reply, decode the template tokens that open the next user message
    # while the session is idle (a background thread that steps aside for waiting requests).
    # Off by default in the library, where a caller looping over turns leaves no idle time and
    # the glue would only cost one extra small decode per turn; on in `continuum serve` and
    # `continuum chat`, where a person or a tool leaves a gap between messages.
    eager_glue: bool = False
    idle_glue: bool = True  # False: the glue is decoded at the start of the next turn instead
    # speculative finish: once a message being fed has been quiet this long, the idle runner
    # decodes the rest of the prompt as if the message had ended (its last word, the end of
    # the turn and the reply header); if commit() then finds the same prompt, the first token
    # is sampled at once. More text simply truncates it. None: off.
    speculate_after_ms: float | None = 30.0
    # sessions active at once, each in a lane of the context, decoded together in batch steps
    # (continuum.backends.batching); the rest are parked. 1: one turn at a time, no scheduler
    parallel: int = 1
    # with parallel > 1: eager glue waits this long after a reply, so that a next request sent
    # at once decodes the glue in its own prefill instead of waiting for it
    glue_quiet_ms: float = 30.0
    # with parallel > 1: a step of prompts alone waits up to this long for the next request
    # of a session whose reply just ended (continuum.backends.batching, "Linger")
    step_linger_ms: float = LINGER_MS
    # with parallel > 1: how a step's room goes to prefills that do not fit whole, "oldest"
    # (first come, first served) or "equal" (shares: agents run in lockstep; see batching)
    prefill_share: str = "oldest"
    # with parallel > 1: while replies generate, a stateless request's prompt may make a step
    # at most this many times as long as the replies' tokens alone; None: no budget
    itl_budget: float | None = ITL_BUDGET
    # every turn's reply is exactly the one a cold prefill of its whole prompt gives (issue
    # "cache invariance"): a session keeps only KV decoded in whole batches, so its last reply
    # (decoded a token at a time) is decoded again in one batch — while the session is idle
    # with eager glue or a message fed as it arrives, else at the start of the next turn
    exact: bool = False
    # which resident session gives way for a lane: "price" (its reload cost over its expected
    # time until it returns, continuum.stateful.park_price) or "lru" (least recently used)
    park_policy: str = "price"
    # with more sessions than lanes, which waiting turn gets a lane first: "arrival", "age"
    # (the session that started first) or "las" (continuum.stateful.lane_order)
    lane_order: str = "arrival"

    def __post_init__(self) -> None:
        if not isinstance(self.exact, bool):
            raise InvalidRequest(f"exact must be True or False, got {self.exact!r}")
        if self.park_policy not in ("price", "lru"):
            raise InvalidRequest(f"park_policy must be 'price' or 'lru', got {self.park_policy!r}")
        LaneOrder.parse(self.lane_order)
        lw = self.low_water
        if isinstance(lw, bool) or not isinstance(lw, (int, float)) or not 0 < lw <= 1:
            raise InvalidRequest(
                f"low_water must be a share of the high-water mark in (0, 1], got {lw!r}"
            )
        check_itl_budget(self.itl_budget)
        check_ms("speculate_after_ms", self.speculate_after_ms, off=True)
        check_ms("glue_quiet_ms", self.glue_quiet_ms)
        check_ms("step_linger_ms", self.step_linger_ms)

    def high_water_tokens(self, n_ctx: int, override: float | None = None) -> int:
        hw = self.high_water if override is None else override
        if isinstance(hw, bool) or not isinstance(hw, (int, float)) or hw <= 0:
            raise InvalidRequest(f"high_water must be a positive number, got {hw!r}")
        tokens = int(hw * n_ctx) if hw <= 1.0 else int(hw)
        if tokens > n_ctx:
            raise InvalidRequest(f"high_water {tokens} exceeds n_ctx {n_ctx}")
        return tokens


def check_parallel(cfg: WorkerConfig) -> int:
    parallel = cfg.parallel
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= 32:
        raise InvalidRequest(f"parallel must be an int in 1..32, got {parallel!r}")
    return parallel


def own_backend(
    registry: BackendRegistry, model: ModelFile, config: WorkerConfig
) -> tuple[OpBackend, SequenceBackend, int]:
    """A backend of the worker's own, from the registry: it and its resident sequence."""
    needs = BackendNeeds(lanes=check_parallel(config), exact=config.exact)  # lanes of its own
    made = registry.create(config.backend, needs, model=model, config=config.llama, n_slots=0)
    resident = getattr(made, "resident_sequence", None)
    if not made.capabilities.resident_sequences or resident is None:
        made.close()
        raise InvalidRequest(
            f"backend {config.backend!r} keeps no resident sequences: a stateful worker "
            "needs one that does (llamacpp)"
        )
    backend, seq = resident()
    return made, backend, seq


@dataclass(frozen=True, slots=True)
class SharedContext:
    """A context someone else owns (an engine's) that a worker runs on: sequence ``seq`` of
    ``backend``, every use of it holding the owner's ``lock``, with parked sessions' KV kept
    in the owner's ``snapshots`` store. The owner closes them; the worker never does."""

    backend: SequenceBackend
    seq: int
    lock: ContextGuard
    snapshots: SnapshotStore


@dataclass(frozen=True, slots=True)
class Lanes:
    """The lanes' views, and — with several — the scheduler decoding them together and, when
    the context they were given is not laid out in lanes, the context apart they live in (its
    own KV stream per lane, on the same weights)."""

    views: list[SequenceView]
    scheduler: BatchScheduler | None = None
    context: LlamaCppBackend | None = None  # a context apart, owned (closed) by the lanes

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        if self.context is not None:
            self.context.close()


def open_lanes(backend: SequenceBackend, seq: int, cfg: WorkerConfig, guard: ContextGuard) -> Lanes:
    """One lane: sequence ``seq`` of ``backend``. Several (``cfg.parallel``): the sequences of
    ``backend``'s context when it was made in that many streams (an engine's lanes context),
    else a sibling context of that many sequences, each its own stream of ``backend``'s n_ctx
    cells; and a batch scheduler on it stepping under ``guard`` (lingering
    ``cfg.step_linger_ms``, sharing prompt room by ``cfg.prefill_share``)."""
    parallel = check_parallel(cfg)
    share = PrefillShare.parse(cfg.prefill_share)  # refused even where one lane ignores it
    if parallel == 1:
        return Lanes([SequenceView(backend, seq)])
    if not isinstance(backend, LlamaCppBackend):
        raise InvalidRequest("parallel > 1 needs the in-process llamacpp backend")
    own = backend.config.n_seq_max != parallel or backend.config.unified
    context = backend
    if own:  # the backend's context is not laid out in lanes: a context apart for them
        config = dataclasses.replace(backend.config, n_seq_max=parallel, kv_unified=False)
        context = backend.sibling(config)
    try:
        scheduler = BatchScheduler(
            context,
            guard=guard,
            linger_ms=cfg.step_linger_ms,
            prefill_share=share,
            itl_budget=cfg.itl_budget,
        )
    except BaseException:
        if own:
            context.close()
        raise
    views: list[SequenceView] = [BatchedSequence(scheduler, s) for s in range(parallel)]
    return Lanes(views, scheduler, context if own else None)
