"""Continuous batching: the replies of several resident sequences decoded in the same steps.

A :class:`BatchScheduler` runs on one :class:`LlamaCppBackend` context whose sequences belong to
its callers (one resident conversation each). :meth:`~BatchScheduler.submit` hands it a
sequence, the prompt tokens still to decode into it and the decode parameters; it returns a
future of the reply. Its thread builds each step as one batch of every active reply, as
llama-server and vLLM do, decoded in the few ``llama_decode`` calls that keep every token as it
would come out alone (:mod:`continuum.backends.passes`). The calls are chosen one at a time,
each the first of a plan of what is left: each call's replies go on as soon as it is done (a
first token does not wait for the step's other prompts), callers waiting for the context go
between calls, and a prompt that comes meanwhile joins the step if there is room. A step is:

1. one token for every reply that is generating (so no reply waits for another to finish);
2. then, in the room left of ``step_tokens``, every prompt that fits whole, shortest first: an
   agent's next turn (a few dozen tokens) is not held behind another session's long prefill,
   and prompts that arrive together are taken shortest first, which keeps the mean wait for a
   first token lowest;
3. then chunks of the prompts that did not fit, in the room left: a new turn's prefill starts
   at the next step instead of after everyone else's reply, and a long prefill is cut into
   chunks so it cannot hold generation back for more than one chunk. While sessions' replies
   generate, a prompt that yields (a stateless request's) gets only the time ``itl_budget``
   leaves it (:mod:`continuum.backends.step_plan`, which plans every step): it is decoded in
   small chunks between the replies' tokens. Stateless replies do not hold it back so: among
   stateless requests alone (agents that send no session key), the budget would only trade
   one request's first token for another's next one. How the room is shared is a choice
   (``prefill_share``, :class:`PrefillShare`):

   - ``oldest`` (default): the oldest request first. Of prefills that start together the first
     ends soonest; their agents then run a step apart ("a staircase"): each agent's next turn
     gets a step of its own, and its time to first token is its own prompt's decode.
   - ``equal``: equal shares (per tenant, then per prompt), as processor sharing does: a long
     prefill cannot hold a shorter one back, and prefills that start together end together.
     Their agents then run in lockstep: their next turns share one step (passes over the
     weights shared), which lowers the inter-token latency and raises the tokens/s, but their
     first tokens wait on each other's prompts (a call of up to 48 tokens after another).
   - ``las``: least attained service first (Autellix's program-level rule): the prompt whose
     sequence held the fewest tokens before it — its program's service so far, for an agent
     the steps it has run — goes first, for whole prompts and chunks alike. Programs early in
     their work finish sooner; a long one waits while shorter ones run.
   - ``age``: the program that started first (its session's start, ``SequenceView.started``)
     goes first, for whole prompts and chunks alike: programs run to their end one after
     another (program-level first come, first served), as ``lane_order`` ``age`` gives lanes.

A long prompt waits only while whole prompts fill a step's room (short prompts on many
sequences at once, step after step).

A chunk never leaves a 1-7-token tail of a prompt for a later step when it can avoid it (the
backend's batching rule: a prompt decoded in chunks of >= 8 tokens has the same KV as one full
batch), and is never shorter than 8 tokens unless it is the whole rest of the prompt. With the
calls :mod:`~continuum.backends.passes` cuts a step into, a reply decoded in batched steps is
bit-equal to the same reply decoded alone (on a context with a KV stream per sequence).

Failure isolation: a reply whose ``on_text`` raises ends with that exception; its sequence keeps
what it had decoded. A call that finds no free KV cells fails the prompts in it
(:class:`~continuum.errors.KVCacheFull`) and is retried with the generating replies alone.

Tenants share a step's room fairly: the tenant whose prompt was served longest ago goes first
(with ``equal``, the chunks' room is shared equally among tenants, then among each tenant's
prompts; its oldest first when the share is too small to split).

Drafting (the context's ``LlamaConfig.draft`` > 0): a generating reply may decode its next token
with a draft from its own sequence's tokens after it (:class:`~continuum.backends.drafting.
ReplyDraft`, prompt lookup), when the cost model says that pays with the step's other tokens
beside it (:meth:`~continuum.backends.drafting.DraftLength.best`'s ``others``: a plain token
rides in their call almost free, a draft takes a call of its own). Drafts go in calls of their
own, those of one length together (equal ubatches: one pass over the weights for several
replies' drafts), so the other replies' tokens stay in the exact calls above; a greedy reply
that drafts is still plain decoding's token for token (a close call after a drafted stretch
decodes it again one token a step, in the following steps). Each sequence's prompt-lookup
index is kept across its replies (:class:`~continuum.backends.drafting.DraftSources`).

A :meth:`prefill` is a prompt with no reply (a session's wake phase, a message fed as it
arrives); a reply may also start from logits the caller already has (a speculative finish),
with no prompt at all.

Linger: a step of prompts alone (no reply generating in it) waits up to ``linger_ms`` for the
next request of a sequence whose prompt or reply ended just before (an agent loop sends it
within milliseconds; another session's prefill chunk, seconds on a CPU, would hold it back).
A step with a reply generating never waits.

Invariant: a sequence is in at most one reply at a time; between calls, every sequence's
resident tokens are exactly what its reply (or its caller) decoded into it. The context is not
thread-safe, and the loop is its one owner: every llama.cpp action on it is made on the loop's
thread. A caller acting on its own sequence directly (truncate, copy, save or restore a
snapshot) holds the :class:`~continuum.backends.context_guard.ContextGuard` the loop steps
under (shared with the context's other users), and the action is a command the loop applies
meanwhile, between its calls (:meth:`LlamaCppBackend.owned_by` routes it); a call waits for
callers, never the other way round. Prompts wait
while more than ``step_tokens - 8`` replies generate at once; keep the number of sequences
well below it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from continuum.backends.base import MIN_BATCH, GenOut, Logits
from continuum.backends.context_guard import ContextGuard
from continuum.backends.decoding import Decoding
from continuum.backends.drafting import (
    DraftLength,
    DraftSources,
    DraftStats,
    ReplyDraft,
    VerifyCost,
)
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.backends.passes import passes
from continuum.backends.sampling import GrammarSampler
from continuum.backends.step_plan import (
    ITL_BUDGET,
    NOBODY,
    PrefillShare,
    Program,
    StepPlanner,
    check_itl_budget,
    protects,
)
from continuum.errors import (
    BackendError,
    ContextOverflow,
    InvalidRequest,
    KVCacheFull,
    SessionClosed,
    ShuttingDown,
)
from continuum.params import GenerationParams, check_ms

log = logging.getLogger(__name__)
# how long a step of prompts alone waits for the next request of a sequence whose reply just
# ended: an agent loop's turnaround (the reply's last event, the client's next POST) on 127.0.0.1
LINGER_MS = 30.0


@dataclass(eq=False)
class _Reply:
    seq: int
    pending: list[int]  # prompt tokens not decoded yet
    decoding: Decoding | None  # None: a prefill, whose future gets the last logits
    grammar: GrammarSampler | None
    tenant: str = ""
    future: Future[object] = field(default_factory=Future)
    next_token: int | None = None  # chosen, to be decoded in the next step
    steps: int = 0  # steps this reply took part in
    yields: bool = False  # its prompt's chunks keep to the inter-token budget (step_plan)
    context: int = 0  # tokens its sequence held before it: its program's service so far
    started: float = 0.0  # when its program (session) started: prefill_share "age"
    draft: ReplyDraft | None = None  # drafting from its own tokens, once generating
    item: list[int] | None = None  # this step's tokens: next_token, and a draft after it


@dataclass(frozen=True, slots=True)
class StepStats:
    steps: int
    tokens: int  # decoded in all steps
    max_replies: int  # the most sequences in one step
    mixed_steps: int  # steps with prompt chunks and generated tokens together
    draft_calls: int = 0  # calls that verified drafts (of one reply or several)


class _State(enum.Enum):
    OPEN = 1
    CLOSED = 2


class BatchScheduler:
    """The step loop over every active reply on ``backend`` (see the module docstring)."""

    def __init__(
        self,
        backend: LlamaCppBackend,
        *,
        step_tokens: int | None = None,
        guard: ContextGuard | None = None,
        linger_ms: float = LINGER_MS,
        prefill_share: PrefillShare | str = PrefillShare.OLDEST,
        itl_budget: float | None = ITL_BUDGET,
    ) -> None:
        limit = backend.n_batch
        step_tokens = limit if step_tokens is None else step_tokens
        if not MIN_BATCH * 2 <= step_tokens <= limit:
            raise InvalidRequest(
                f"step_tokens must be in {MIN_BATCH * 2}..{limit} (the context's n_batch), "
                f"got {step_tokens}"
            )
        check_ms("linger_ms", linger_ms)
        self.planner = StepPlanner(PrefillShare.parse(prefill_share), check_itl_budget(itl_budget))
        self.backend = backend
        self.step_tokens = step_tokens
        self.linger = linger_ms / 1000
        self._ended: dict[int, float] = {}  # seq -> when its prompt or reply ended (perf_counter)
        self._replies: list[_Reply] = []
        self._cond = threading.Condition()  # guards _replies and the counters
        self.guard = guard or ContextGuard()  # held by every step, and by callers between them
        self._state = _State.OPEN
        self._steps = self._tokens = self._max_replies = self._mixed = self._draft_calls = 0
        self.max_draft = backend.config.draft  # > 0: replies draft from their own tokens
        self.draft_cost = VerifyCost()  # what a call of k rows costs here, timed as steps run
        self.draft_stats = DraftStats()  # what drafting did, over every reply
        self.draft_sources = DraftSources()  # the sequences' own tokens, the tenants' replies
        self._thread = threading.Thread(target=self._loop, name="continuum-batch", daemon=True)
        self._thread.start()

    # -- the callers' side ---------------------------------------------------------------------
    def submit(
        self,
        seq: int,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        logits: Logits | None = None,
        program: Program = NOBODY,
        yields: bool = False,
    ) -> Future[GenOut]:
        """Decode ``tokens`` into ``seq`` and generate a reply there, batched with every other
        active reply. The reply starts from the last prompt token's logits, or — with no
        ``tokens`` — from ``logits`` the caller already has. ``on_text`` runs on the step
        thread: it must be quick (hand the text to a queue). ``yields``: while other replies
        generate, the prompt's chunks keep to the inter-token budget (a stateless request's).
        ``program``: whose prompt it is (its tenant, and when its session began: ``age``
        orders by it)."""
        if not tokens and logits is None:
            raise InvalidRequest("a reply needs at least one prompt token to start from")
        if tokens and logits is not None:
            raise InvalidRequest("a reply starts from its prompt or from logits=, not both")
        grammar = self.backend.grammar_for(params)
        d = Decoding(self.backend, params, grammar=grammar, on_text=on_text, t0=t0, seq=seq)
        reply = _Reply(
            seq, list(tokens), d, grammar, program.tenant, yields=yields, started=program.started
        )
        try:
            self._check(seq, len(tokens) + 1)
            reply.context = len(self.backend.seq_tokens(seq))  # a known sequence, checked
            if logits is not None:
                with self.guard:  # sampling reads the context's vocabulary
                    reply.next_token = d.start(logits)
                    self._start_draft(reply)
                if reply.next_token is None:
                    self._end(reply, None)
                    return reply.future  # type: ignore[return-value]
            self._add(reply)
        except BaseException:
            if grammar is not None:
                grammar.close()
            raise
        return reply.future  # type: ignore[return-value]

    def prefill(
        self, seq: int, tokens: Sequence[int], *, program: Program = NOBODY
    ) -> Future[Logits]:
        """Decode ``tokens`` into ``seq`` in the coming steps; the future gets the last token's
        logits (a copy)."""
        if not tokens:
            raise InvalidRequest("a prefill needs at least one token")
        self._check(seq, len(tokens))
        held = len(self.backend.seq_tokens(seq))
        reply = _Reply(
            seq, list(tokens), None, None, program.tenant, context=held, started=program.started
        )
        self._add(reply)
        return reply.future  # type: ignore[return-value]

    def generate(
        self,
        seq: int,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
    ) -> GenOut:
        """:meth:`submit` and wait for the reply (giving up the guard meanwhile)."""
        return self.guard.wait(self.submit(seq, tokens, params, on_text=on_text, t0=t0))

    def _check(self, seq: int, grow: int) -> None:
        b = self.backend
        if seq not in range(b.config.n_seq_max):
            raise InvalidRequest(f"no sequence {seq}: the context has 0..{b.config.n_seq_max - 1}")
        self._refuse_busy(seq)  # before waiting for a step
        with self.guard:
            resident = len(b.seq_tokens(seq))
        if resident + grow > b.n_ctx:
            raise ContextOverflow(resident + grow, b.n_ctx, f"sequence {seq}")

    def _refuse_busy(self, seq: int) -> None:
        with self._cond:
            if self._state is _State.CLOSED:
                raise SessionClosed("batch scheduler")
            if any(r.seq == seq for r in self._replies):
                raise InvalidRequest(f"sequence {seq} already has a reply in progress")

    def _add(self, reply: _Reply) -> None:
        with self._cond:
            self._refuse_busy(reply.seq)
            self._replies.append(reply)
            self._cond.notify()

    def cancel(self, future: Future[Any]) -> bool:
        """Withdraw a prefill or reply that no step has started yet; its future is cancelled
        (the caller waiting on it gets ``CancelledError``) and its sequence is untouched.
        False once a step has it (it then runs to its end). Holding the guard, no step is
        half-way through it."""
        with self.guard, self._cond:
            r = next((r for r in self._replies if r.future is future), None)
            if r is None or r.steps or (r.decoding is not None and r.next_token is not None):
                return False
            self._replies.remove(r)
        if r.grammar is not None:
            r.grammar.close()
        return future.cancel()

    def exclusive(self) -> ContextGuard:
        """The context to the caller alone, between two steps (``with scheduler.exclusive():``)."""
        return self.guard

    def stats(self) -> StepStats:
        with self._cond:
            return StepStats(
                self._steps, self._tokens, self._max_replies, self._mixed, self._draft_calls
            )

    def close(self) -> None:
        """Stop taking replies; the ones in progress end with :class:`SessionClosed` (a step
        already running finishes first, unless the caller holds the guard: then none is)."""
        with self._cond:
            if self._state is _State.CLOSED:
                return
            self._state = _State.CLOSED
            for r in self._replies:
                self._end(r, SessionClosed("batch scheduler"))
            self._replies.clear()
            self._cond.notify()
        if not self.guard.held:
            self._thread.join()

    def __enter__(self) -> BatchScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the step loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        self.guard.attach(self._wake)
        self.backend.owned_by(self.guard)
        try:
            self._run()
        finally:
            self.backend.owned_by(None)
            self.guard.detach()

    def _wake(self) -> None:  # a command waits for the loop
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        """Steps while replies wait; between them, the callers' commands."""
        while True:
            with self._cond:
                while not self._replies and self._state is _State.OPEN and not self.guard.pending:
                    self._cond.wait()
                if self._state is _State.CLOSED:
                    for r in self._replies:
                        self._end(r, SessionClosed("batch scheduler"))
                    self._replies.clear()
                    return
                self._linger()
            if self.guard.serve() or not self._replies:
                continue  # a command came: look again at what waits
            with self.guard.step():
                try:
                    self._step()
                except BaseException as e:  # a bug must not leave callers waiting forever
                    if not isinstance(e, ShuttingDown):
                        log.exception("batch step failed")
                    with self._cond:
                        for r in list(self._replies):
                            self._drop(r, e)

    def _linger(self) -> None:
        """Under ``_cond``, before a step of prompts alone: wait up to ``linger`` for the next
        request of each sequence whose prompt or reply ended just now. An agent loop sends it
        within milliseconds, and a step started without it (another session's prefill chunk:
        seconds) would hold it back until the step after. A step with a reply generating in it
        never waits: its next token is not held for anyone."""
        while self._state is _State.OPEN and not self.guard.pending:
            now = time.perf_counter()
            live = {r.seq for r in self._replies}
            self._ended = {
                s: t for s, t in self._ended.items() if s not in live and now - t < self.linger
            }
            if not self._ended or any(r.next_token is not None for r in self._replies):
                return
            self._cond.wait(max(self._ended.values()) + self.linger - now)

    def _step(self) -> None:
        """One step: its calls one at a time, each the first of a plan of what is left (the
        room, the replies not in the step yet), so a prompt that comes while a call runs can
        join the step; waiting callers go between calls."""
        decoded: list[tuple[_Reply, int, bool]] = []  # (reply, tokens, a generated token)
        room, seen = self.step_tokens, set[int]()
        with self._cond:
            if not self._replies:  # closed while the step waited for the guard
                return
            generating = protects(self._replies)
            self._draft_items()
        chunks = self.planner.chunk_room(generating)
        while True:
            with self._cond:
                replies = [r for r in self._replies if id(r) not in seen]
            items = [(r, r.item or t) for r, t in self.planner.plan(replies, room, chunks)]
            if not items:
                break
            call = self._next_call(items)
            seen.update(id(r) for r, _ in call)
            room -= sum(len(t) for _, t in call)
            n_gen = sum(r.next_token is not None for r, _ in call)
            n_prompt = sum(len(t) for r, t in call if r.next_token is None)
            if chunks is not None:
                chunks -= sum(len(t) for r, t in call if r.yields and r.next_token is None)
            t0 = time.perf_counter()
            part = self._decode(call)
            seconds = time.perf_counter() - t0
            if sum(len(t) for r, t in call if r.next_token is not None) == n_gen:  # no drafts
                self.planner.timed(n_gen, n_prompt, seconds * 1000)
            else:
                self._draft_calls += 1
            if not n_prompt:
                self.draft_cost.observe(sum(len(t) for _, t in call), seconds)
            decoded += [(r, len(t), r.next_token is not None) for (r, t), _ in part]
            self._took(part)  # before the next call: its replies' tokens do not wait for it
            self.guard.let_callers_in()
        if not seen:  # every prompt waits for room that generation holds: cannot happen
            raise BackendError("a batch step found nothing it could decode")  # with step >= 16
        if not decoded:  # every call failed (no free KV cells)
            return
        with self._cond:
            self._steps += 1
            for r, _, gen in decoded:
                if not gen:
                    self.planner.served[r.tenant] = self._steps
            self._tokens += sum(n for _, n, _ in decoded)
            self._max_replies = max(self._max_replies, len({r.seq for r, _, _ in decoded}))
            n_gen = sum(g for _, _, g in decoded)
            self._mixed += 0 < n_gen < len(decoded)

    def _draft_items(self) -> None:
        """Under ``_cond``, at a step's start: each generating reply that drafts decides this
        step's tokens (its next token, and a draft after it when one pays)."""
        live = [r for r in self._replies if r.next_token is not None]
        for r in live:
            r.item = None
            if r.draft is not None and r.next_token is not None:
                r.item = r.draft.item(r.next_token, others=len(live) - 1)

    def _next_call(self, items: list[tuple[_Reply, list[int]]]) -> list[tuple[_Reply, list[int]]]:
        """The first call of a plan: replies' drafts first, those of one length together (a
        call of equal ubatches, a pass over the weights), within ``n_batch``; else the first
        of the exact calls :func:`passes` cuts."""
        drafts = [(r, t) for r, t in items if r.next_token is not None and len(t) > 1]
        if drafts:
            size = len(drafts[0][1])
            same = [(r, t) for r, t in drafts if len(t) == size]
            return same[: max(1, self.backend.n_batch // size)]
        firsts = [r.decoding is not None and 0 < len(t) == len(r.pending) for r, t in items]
        return [items[i] for i in passes([len(t) for _, t in items], firsts)[0]]

    def _took(self, decoded: list[tuple[tuple[_Reply, list[int]], Logits | None]]) -> None:
        """Each decoded item's reply goes on: its next token chosen (and streamed), its
        prompt's first token once the prompt is in."""
        for (r, toks), lg in decoded:
            r.steps += 1
            if r.next_token is not None:
                r.next_token = r.item = None
                self._advance(r, lg, first=False)
            else:
                del r.pending[: len(toks)]
                if not r.pending:
                    self._advance(r, lg, first=True)

    def _decode(
        self, items: list[tuple[_Reply, list[int]]]
    ) -> list[tuple[tuple[_Reply, list[int]], Logits | None]]:
        """Decode one call's items; each decoded item with its logits. A call that finds no
        free KV cells fails its prompts (:class:`KVCacheFull`) and is retried with its
        generated tokens alone."""
        try:
            return self._decode_call(items)
        except KVCacheFull as full:
            with self._cond:
                for r, _ in items:
                    if r.next_token is None:
                        self._drop(r, full)
            for r, t in items:
                if r.draft is not None and len(t) > 1:
                    r.draft.plain()  # no room for its draft: its token alone
            items = [(r, t[:1]) for r, t in items if r.next_token is not None]
            return self._decode_call(items) if items else []

    def _decode_call(
        self, items: list[tuple[_Reply, list[int]]]
    ) -> list[tuple[tuple[_Reply, list[int]], Logits | None]]:
        """One ``llama_decode`` of ``items``, in sequence order: a context with a KV stream per
        sequence splits a batch into equal ubatches of consecutive sequences, and items out of
        order would be decoded one ubatch (one pass over the weights) each."""
        items = sorted(items, key=lambda item: item[0].seq)
        if any(r.next_token is not None and len(t) > 1 for r, t in items):  # drafts: every row
            rows = self.backend.decode_rows_many([(r.seq, t) for r, t in items])
            return list(zip(items, rows, strict=True))
        batch = [
            (r.seq, toks, r.next_token is not None or len(toks) == len(r.pending))
            for r, toks in items
        ]
        return list(zip(items, self.backend.decode_many(batch), strict=True))

    def _advance(self, r: _Reply, logits: Logits | None, *, first: bool) -> None:
        assert logits is not None
        if r.decoding is None:  # a prefill: done
            with self._cond:
                self._remove(r)
                self._ended[r.seq] = time.perf_counter()
            if not r.future.done():
                r.future.set_result(logits.copy())
            return
        try:
            if first:
                tok = r.decoding.start(logits)
                self._start_draft(r)
            elif r.draft is not None:
                tok = r.draft.advance(logits if logits.ndim == 2 else logits[None, :])
            else:
                tok = r.decoding.step(logits)
        except BaseException as e:  # the caller's on_text raised: its reply ends with it
            with self._cond:
                self._drop(r, e)
            return
        if tok is None:
            with self._cond:
                self._remove(r)
                self._ended[r.seq] = time.perf_counter()
            if r.draft is not None:
                self.draft_sources.ended(r.tenant, r.decoding.gen)
            self._end(r, None)
        else:
            r.next_token = tok

    def _start_draft(self, r: _Reply) -> None:
        """A reply that starts generating drafts from its sequence's tokens, when the
        context drafts and no grammar constrains it."""
        d = r.decoding
        if self.max_draft and r.grammar is None and d is not None and not d.done:
            length = DraftLength(self.max_draft, cost=self.draft_cost)
            stats, sources = self.draft_stats, self.draft_sources
            r.draft = ReplyDraft(self.backend, d, r.seq, length, stats, sources, r.tenant)

    def _drop(self, r: _Reply, error: BaseException) -> None:
        self._remove(r)
        self._end(r, error)

    def _remove(self, r: _Reply) -> None:  # under _cond; close() may have cleared the list
        if r in self._replies:
            self._replies.remove(r)

    @staticmethod
    def _end(r: _Reply, error: BaseException | None) -> None:
        if r.grammar is not None:
            r.grammar.close()
            r.grammar = None
        if r.future.done():
            return
        if error is None:
            assert r.decoding is not None
            r.future.set_result(r.decoding.result())
        else:
            r.future.set_exception(error)
