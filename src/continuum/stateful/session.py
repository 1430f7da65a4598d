"""One stateful conversation: verify the resident prefix, decode only the suffix, generate.

A session's *history* (system prompt plus messages) is authoritative and lives in the SQLite
store; its *resident state* is the token sequence whose KV sits in the worker's llama.cpp
context (or in a parked snapshot). Each turn:

1. validates the whole incoming message list (nothing changes on bad input);
2. finds the first message whose identity (role, content, name, tool-call ids; hashed) differs
   from the history — the divergence point (DESIGN.md §3.2);
3. renders the window into per-message token segments (:mod:`~continuum.stateful.transcript`),
   reusing cached segments before the divergence point;
4. asks the result tiers above (:mod:`~continuum.stateful.hooks`) whether a stored reply
   answers exactly this prompt: a hit is committed with nothing decoded;
5. otherwise keeps the longest resident prefix inside the verified segments, truncates the KV
   there and decodes only the rest (:mod:`~continuum.stateful.plan`), and generates; the
   generated token ids stay resident exactly as generated, and are stored with the reply so a
   reopened session rebuilds the very same sequence;
6. commits the turn (new messages, reply, metrics, resets) in one transaction.

Rebuilds are visible: a changed system prompt (``divergence``), crossing the high-water mark
(``high_water``), lost KV (``evicted``, ``restore_failed``) or another model file
(``model_changed``) each produce a :class:`~continuum.metrics.Reset` in the next turn's metrics
and in the store.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from continuum.backends.exactness import exact_reuse
from continuum.errors import (
    BackendError,
    ContextOverflow,
    InvalidRequest,
    SessionBusy,
    SessionClosed,
)
from continuum.hashing import message_identity
from continuum.messages import Message, normalize_messages
from continuum.metrics import Reset, ResetReason
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.results import Result
from continuum.stateful.arrival import (
    FEED_ROLES,
    Arriving,
    Lookahead,
    finished_prompt,
    new_message,
    settled_tokens,
)
from continuum.stateful.compaction import CompactionMode, Summary, compacting_plan
from continuum.stateful.hooks import TurnLookup, TurnQuery
from continuum.stateful.park_price import PauseClock
from continuum.stateful.plan import common_prefix
from continuum.stateful.transcript import Tools, Transcript
from continuum.stateful.turn import (
    Reply,
    TurnLimits,
    TurnPlan,
    TurnRequest,
    prepare_turn,
    reply_message,
    turn_metrics,
)
from continuum.store.sqlite import SessionId, StoredMessage
from continuum.toolcalls import ToolParsing, normalize_tools

if TYPE_CHECKING:
    from continuum.backends.base import SequenceView
    from continuum.stateful.conversation import Conversation
    from continuum.stateful.kv_space import Lane
    from continuum.stateful.session_worker import SessionWorker

OnText = Callable[[str], None]


class ChatSession:
    """A stateful conversation bound to one :class:`Worker`. Use one thread per turn."""

    def __init__(
        self,
        worker: SessionWorker[ChatSession],
        session_id: SessionId,
        conversation: Conversation,
        *,
        high_water: int,
        compaction: CompactionMode = "window",
    ) -> None:
        self._worker = worker
        self._seq = worker.seq  # the sequence of its lane (bind()), while it has one
        self.lane: Lane | None = None
        self.id = session_id
        self.tenant = ""  # the namespace that owns it (set by the worker)
        self.policy = ReusePolicy.always()
        self._system = conversation.system
        self._history = list(conversation.history)
        self.high_water = high_water
        self.turns = conversation.turns
        self.transcript = Transcript(worker.backend, conversation.continuity, conversation.clock)
        self.transcript.note = conversation.note
        self.compaction = compaction  # "window": turns leaving the window are dropped from it
        self.resident: list[int] = []  # tokens of the parked snapshot while another is active
        self.resident_exact = 0  # how many of them are exact (continuum.backends.exactness)
        self.restored_from = ""  # "ram" | "disk": this activation came back from a snapshot
        self.pauses = PauseClock()  # when its last turn ended: what parking it costs
        self.started = time.monotonic()  # when its program began here (lane_order "age")
        self.pauses.open(time.monotonic())
        self.pending_resets: list[Reset] = []
        self.wake_decoded = 0  # tokens its last wake phase decoded (the rest were resident)
        self._busy = threading.Lock()
        self.closed = False
        self.last: Result | None = None
        # eager glue, a message fed as it arrives, a speculative finish
        self._ahead = Lookahead(
            self._seq, glue_rides=worker.scheduler is not None, exact=worker.config.exact
        )

    @property
    def low_water(self) -> int:
        """Where a moving window goes down to (the worker's share of the high-water mark)."""
        return max(1, int(self.high_water * self._worker.config.low_water))

    def bind(self, seq: SequenceView) -> None:
        """Its lane's sequence is ``seq`` from now on (the worker's residency moved it)."""
        self._seq = self._ahead.seq = seq

    # -- public API ------------------------------------------------------------------------
    @property
    def system(self) -> str | None:
        return self._system

    @property
    def history(self) -> list[Message]:
        """The authoritative conversation, system message first when there is one."""
        msgs = [dict(m.message) for m in self._history]
        return ([{"role": "system", "content": self._system}] if self._system else []) + msgs

    def wake_tokens(self, system: str | None) -> tuple[int, ...]:
        return self.transcript.wake_tokens(system)

    def turn(
        self,
        messages: list[Message],
        params: GenerationParams | None = None,
        on_text: OnText | None = None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        calls: ToolParsing | None = None,
    ) -> Result:
        """Run a turn from the *full* message list (OpenAI shape). A leading system message
        replaces the session's system prompt; without one, the session keeps its own (later
        ones stay in the history where the template takes them: ``ChatFormat.fit_systems``).
        ``tools`` (OpenAI function tools) are rendered into the prompt's preamble by the
        template, so a turn with other tools rebuilds from the wake; with ``calls`` the reply
        is parsed for tool calls, which the history keeps (ids and all) with the reply's
        tokens exactly as generated, so the next turn that sends them back appends."""
        wire = len(json.dumps(messages, ensure_ascii=False, default=str))
        msgs = self._worker.backend.chat_format.fit_systems(normalize_messages(messages))
        system = self._system
        if msgs[0]["role"] == "system":
            system, msgs = msgs[0]["content"], msgs[1:]
        shaped = normalize_tools(tools) or None if tools is not None else None
        return self._locked_turn(system, msgs, params, on_text, wire, tools=(shaped, calls))

    def append(
        self,
        new_messages: list[Message],
        params: GenerationParams | None = None,
        on_text: OnText | None = None,
    ) -> Result:
        """Run a turn from only the messages added since the last turn (seed 000's delta)."""
        wire = len(json.dumps(new_messages, ensure_ascii=False, default=str))
        new = normalize_messages(new_messages)
        msgs = [dict(m.message) for m in self._history] + new
        return self._locked_turn(self._system, msgs, params, on_text, wire)

    def close(self) -> None:
        """Release this session's resident state; its history stays in the store."""
        if not self.closed:
            self.closed = True
            self._worker.release(self)

    # -- prefill on arrival ------------------------------------------------------------------
    def feed(
        self,
        chunk: str,
        *,
        role: str = "user",
        name: str | None = None,
        tool_call_id: str | None = None,
    ) -> int:
        """Add ``chunk`` to the message that is still arriving and decode what of it can no
        longer change (see :mod:`~continuum.stateful.arrival`); return the message's tokens
        decoded so far. Call ``commit()`` when the message ends (or ``abandon()``). The first
        call fixes the role (``user``, or ``tool`` for a tool result streamed in); later calls
        only add text."""
        if not isinstance(chunk, str):
            raise InvalidRequest(f"feed() takes text, got {type(chunk).__name__}")
        with self._turn_lock():
            self._ahead.glue_for_turn()
            inp = self._ahead.input
            if inp is None:
                if role not in FEED_ROLES:
                    raise InvalidRequest(f"feed() role must be one of {FEED_ROLES}, got {role!r}")
                message = new_message(role, name, tool_call_id)
                base = self.transcript.base_tokens(self._system, self._history)
                header = self.transcript.header_for(self._system, self._history, message)
                inp = Arriving(message, tuple(base), header, len(self._seq.tokens))
                self._ahead.input = inp
            elif role != inp.message["role"]:
                raise InvalidRequest(
                    f"a {inp.message['role']} message is already arriving; commit() or "
                    "abandon() it before feeding a message of another role"
                )
            inp.grow(chunk)
            self._ahead.spec = None
            want = settled_tokens(self._worker.backend.tokenize, inp)
            self._worker.reserve(len(want))
            self._ahead.feed(want)
            self._worker.schedule_speculation(self)
            return max(0, len(self._seq.tokens) - len(inp.base))

    def commit(
        self, params: GenerationParams | None = None, on_text: OnText | None = None
    ) -> Result:
        """End the arriving message and generate the reply. The prompt is the one an
        ``append()`` of the whole message would decode; ``ttft_ms`` runs from this call."""
        inp = self._ahead.input
        if inp is None:
            raise InvalidRequest("nothing to commit: feed() a message first")
        msgs = [dict(m.message) for m in self._history] + [dict(inp.message)]
        wire = len(json.dumps(inp.message, ensure_ascii=False))
        try:
            return self._locked_turn(self._system, msgs, params, on_text, wire, fed=inp)
        except BaseException:
            if self._ahead.input is inp:  # a failed commit ends the message: the next starts anew
                with contextlib.suppress(SessionBusy, SessionClosed):
                    self.abandon()
            raise

    def abandon(self) -> int:
        """Drop the message that was arriving (e.g. its client disconnected): its tokens are
        truncated away and the history records nothing of it. Returns the tokens dropped."""
        with self._turn_lock(ends=True):
            return self._ahead.drop_input()

    @property
    def arriving(self) -> str | None:
        """The text of the message still arriving, or None."""
        return self._ahead.input.message["content"] if self._ahead.input is not None else None

    @property
    def arrival(self) -> Arriving | None:
        return self._ahead.input

    # -- idle work (called by the worker's idle runner, under the worker lock) ----------------
    @property
    def pending_glue(self) -> bool:
        return bool(self._ahead.glue)

    @property
    def in_turn(self) -> bool:
        """A turn (or feed, commit, abandon) of this session runs or waits for the worker."""
        return self._busy.locked()

    def idle_step(self, speculate: bool) -> None:
        self._ahead.settle_glue()
        if speculate and not self._worker.busy:
            self._speculate()

    def _speculate(self) -> int:
        """Decode the rest of the prompt as if the arriving message ended now; return the
        tokens decoded (see :meth:`Lookahead.speculate`)."""
        inp = self._ahead.input
        if inp is None or self._ahead.spec is not None:
            return 0
        backend = self._worker.backend
        window = self.transcript.render_list(self._system, self._history, self.transcript.window)
        full = finished_prompt(self.transcript.render, backend.tokenize, window, inp)
        if full is None or len(full) + 1 >= min(backend.n_ctx, self.high_water):
            return 0  # the template rewrote, or commit() will move the window
        return self._ahead.speculate(full)

    # -- the turn ----------------------------------------------------------------------------
    @contextmanager
    def _turn_lock(self, *, ends: bool = False) -> Iterator[None]:
        """This session's turn lock, then the worker's lock with this session active. The
        session's pause ends as it is asked (before any wait for a lane); with ``ends``, a new
        one starts after the block (the turn's reply is out, or its message dropped)."""
        if self.closed:
            raise SessionClosed(self.id)
        if not self._busy.acquire(blocking=False):
            raise SessionBusy(self.id)
        self.pauses.start_turn(time.monotonic())
        try:
            with self._worker.claim(), self._worker.holding(self):
                yield
        finally:
            if ends:
                self.pauses.end_turn(time.monotonic())
            self._busy.release()

    def _locked_turn(
        self,
        system: str | None,
        msgs: list[Message],
        params: GenerationParams | None,
        on_text: OnText | None,
        wire_chars: int,
        fed: Arriving | None = None,
        tools: tuple[Tools, ToolParsing | None] = (None, None),
    ) -> Result:
        params = params or GenerationParams()
        params.validate()
        self._worker.backend.chat_format.check_systems(msgs)
        t0 = time.perf_counter()
        with self._turn_lock(ends=True):
            if fed is None:
                self._ahead.input = None  # a whole-message turn replaces anything arriving
                self._ahead.spec = None
            elif self._ahead.input is not fed:
                raise InvalidRequest("the arriving message was abandoned or already committed")
            self._ahead.glue_for_turn()
            if fed is None:
                self.transcript.turn_tools = tools[0]
            prepare = functools.partial(
                prepare_turn,
                self.transcript,
                self._history,
                TurnRequest(system, msgs, params, self.policy),
                resident=list(self._seq.tokens),  # as before the turn (a summary adds to it)
                lookahead=self._ahead,
                pending=self.pending_resets,
            )
            limits = TurnLimits(self.high_water, self._worker.backend.n_ctx, 0, self.low_water)
            note, summary = self.transcript.note, None
            try:
                if self.compaction == "summary":
                    prep, summary = compacting_plan(
                        prepare,
                        limits,
                        self.transcript,
                        self._seq,
                        self._history,
                        self._worker.config.note_tokens,
                        self._worker.reserve,
                    )
                else:
                    prep = prepare(limits)
                result = self._run(prep, params, on_text, wire_chars, t0, tools[1], summary)
            except BaseException:
                self.transcript.note = note
                raise
            self._ahead.input = None
            self.restored_from = ""
        self._worker.schedule_glue(self)
        return result

    def _run(
        self,
        prep: TurnPlan,
        params: GenerationParams,
        on_text: OnText | None,
        wire_chars: int,
        t0: float,
        parsing: ToolParsing | None,
        summary: Summary | None = None,
    ) -> Result:
        looked = self._lookup(prep, params)
        try:
            out = self._reply(prep, looked, params, on_text, t0)
            reply, calls = reply_message(out.text, out.finish, parsing)
            digest = self._worker.backend.model.digest
            stored = StoredMessage(reply, message_identity(reply), out.tokens, digest)
            reply_seg = self.transcript.reply_segment(
                prep.system, prep.new_hist, prep.target, stored
            )  # after TTFT
            context = (len(self._seq.tokens), self._worker.backend.n_ctx, self.high_water)
            metrics = turn_metrics(
                prep,
                out,
                looked,
                wire_chars,
                t0,
                context,
                self.restored_from,
                summary.cost if summary is not None else None,
            )
            # guard held: a step started meanwhile (a prefill chunk: seconds) would delay the end
            turn_no = self._worker.store.commit_turn(
                self.id,
                keep=prep.diverged_at,
                new=[*prep.new_hist[prep.diverged_at :], stored],
                finish_reason=out.finish,
                metrics=metrics.to_dict(),
                system=prep.system,
                note=self.transcript.note,
                expected_turn=self.turns,
            )
        except BaseException:
            # Nothing was committed. The KV may hold the new messages (and part of a reply):
            # the next turn verifies it; the segment cache must describe only the history.
            self.transcript.forget_after(prep.n_cached, prep.keep_cache)
            self._ahead.failed()
            raise
        if out.tier is None and looked is not None:
            self._worker.tiers_record(looked, out.text, out.tokens, out.finish)
        self._system = prep.system
        self.transcript.remember(prep.system, prep.target, reply_seg)
        self._history = [*prep.new_hist, stored]
        self._ahead.settled()
        self._predict_glue()
        self.pending_resets = []
        self.turns = turn_no
        self.last = Result(out.text, out.tokens, out.finish, metrics, calls, turn_no)
        return self.last

    def _reply(
        self,
        prep: TurnPlan,
        looked: TurnLookup | None,
        params: GenerationParams,
        on_text: OnText | None,
        t0: float,
    ) -> Reply:
        """The turn's reply: a stored one a result tier served, or decode the plan and sample."""
        looked_ms = (time.perf_counter() - t0) * 1000  # the lookup is done: the reply starts
        spec, self._ahead.spec = self._ahead.spec, None
        served = looked.reply if looked is not None else None
        if served is not None:  # nothing decoded; the resident KV catches up next turn
            if on_text is not None and served.text:
                on_text(served.text)
            ttft = (time.perf_counter() - t0) * 1000
            return Reply(
                served.text,
                served.tokens,
                served.finish_reason,
                ttft_ms=ttft,
                prefill_ms=0.0,
                evaluated=0,
                reused=0,
                tier=served.tier,
                lookup_ms=looked_ms,
            )
        plan = prep.plan
        if plan.use_spec:
            assert spec is not None
            g = self._seq.generate(spec.logits, params, on_text=on_text, t0=t0)
            prefill_ms, evaluated, start = 0.0, 0, plan.reused
        else:
            start = self._worker.residency.prefill_from(self, prep.full, plan.decode_from)
            self._worker.reserve(len(prep.full) + params.max_tokens)
            g, prefill_ms = self._seq.reply(prep.full[start:], params, on_text=on_text, t0=t0)
            evaluated = len(prep.full) - start
        return Reply(
            g.text,
            g.tokens,
            g.finish_reason,
            ttft_ms=g.ttft_ms,
            prefill_ms=prefill_ms,
            evaluated=evaluated,
            reused=start,
            lookup_ms=looked_ms,
        )

    def _lookup(self, prep: TurnPlan, params: GenerationParams) -> TurnLookup | None:
        """Ask the result tiers above (if any) about this exact prompt."""
        if self._worker.tiers is None or not self.policy.enabled:
            return None
        window = self.transcript.render_list(prep.system, prep.new_hist, prep.target.window)
        query = TurnQuery(self.tenant, tuple(window), tuple(prep.full), params, self.policy)
        return self._worker.tiers_lookup(query)

    # -- eager glue --------------------------------------------------------------------------
    def _predict_glue(self) -> None:
        """After a reply (or the wake phase): the glue to decode while the session is idle."""
        self._ahead.glue, self._ahead.glue_at = (), -1
        if not self._worker.config.eager_glue:
            return
        backend = self._worker.backend
        base = self.transcript.base_tokens(self._system, self._history)
        header = self.transcript.header_for(
            self._system, self._history, {"role": "user", "content": ""}
        )
        self._ahead.predict_glue(base, backend.tokenize(header) if header else [], backend.n_ctx)

    # -- called by the worker, under its lock ----------------------------------------------------
    def wake_up(self) -> int:
        """Prefill the stable identity (wake phase); return the tokens decoded."""
        backend = self._worker.backend
        wake = self.transcript.wake_tokens(self._system)
        if len(wake) + 1 > backend.n_ctx:
            raise ContextOverflow(len(wake) + 1, backend.n_ctx, "the wake prefix (system prompt)")
        keep = self._worker.residency.borrow(self, wake)  # another session's copy, if any
        self._seq.truncate(keep)
        self._worker.reserve(len(wake))
        self._seq.decode(list(wake[keep:]))
        self.transcript.reset(self._system, wake)
        self._ahead.settled()
        self._predict_glue()
        self.wake_decoded = len(wake) - keep
        return self.wake_decoded

    def rebuild(
        self,
        reason: ResetReason,
        detail: str,
        max_tokens: int,
        snapshot: tuple[bytes, tuple[int, ...]] | None = None,
    ) -> None:
        """Rebuild resident KV from the authoritative history (reopen in a new process). A KV
        snapshot of this session, when given, is restored for the prefix it shares with the
        history's canonical tokens, so only the rest is decoded."""
        note = self.transcript.note
        start = note.window if note is not None and note.window <= len(self._history) else 0
        target = self.transcript.fit(
            self._system, self._history, start, max_tokens, self.high_water, self.low_water
        )
        prompt = target.tokens()
        if snapshot is not None:
            payload, snap_tokens = snapshot
            shared = common_prefix(list(snap_tokens), prompt)
            try:
                self._worker.reserve(len(snap_tokens))
                self._seq.load_state(payload, list(snap_tokens))
                self._seq.truncate(shared)
                detail = f"{detail}; restored {shared} tokens from a KV snapshot"
            except BackendError as e:
                self._seq.clear()
                reason, detail = ResetReason.RESTORE_FAILED, f"KV snapshot rejected: {e}"
        decoded = self.wake_up() if not self._seq.tokens else 0
        keep = common_prefix(self._seq.tokens, prompt)
        if self._worker.config.exact:
            keep = exact_reuse(min(keep, self._seq.exact), len(prompt))
        self._seq.truncate(keep)
        self._worker.reserve(len(prompt) + max_tokens)
        self._seq.decode(prompt[keep:])
        self.transcript.remember(self._system, target, None)
        self._ahead.settled()
        self._predict_glue()
        self.pending_resets.append(Reset(reason, detail, 0, decoded + len(prompt) - keep))
