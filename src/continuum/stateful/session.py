"""One stateful conversation: verify the resident prefix, decode only the suffix, generate.

A session's *history* (system prompt plus messages) is authoritative and lives in the SQLite
store; its *resident state* is the token sequence whose KV sits in the worker's llama.cpp
context (or in a parked snapshot). Each turn:

1. validates the whole incoming message list (nothing changes on bad input);
2. finds the first message whose identity (role, content, name, tool-call ids; hashed) differs
   from the history — the divergence point (DESIGN.md §3.2);
3. renders the window (system + the messages since the window start) into per-message token
   segments, reusing cached segments before the divergence point;
4. keeps the longest resident prefix that lies inside the verified segments, truncates the KV
   there, and decodes only the rest plus the generation prompt;
5. generates; the generated token ids stay resident exactly as generated, and are stored with
   the reply so a reopened session rebuilds the very same sequence;
6. commits the turn (new messages, reply, metrics, resets) in one transaction.

Rebuilds are visible: a changed system prompt (``divergence``), crossing the high-water mark
(``high_water``), lost KV (``evicted``, ``restore_failed``) or another model file
(``model_changed``) each produce a :class:`~continuum.metrics.Reset` in the next turn's metrics
and in the store.

Window invariant: the rendered conversation is always ``[system] + history[window:]`` where
``history[window]`` is a user message (or ``window == 0``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from continuum.backends.llamacpp import MIN_BATCH
from continuum.errors import (
    BackendError,
    ContextOverflow,
    InvalidMessage,
    InvalidRequest,
    SessionBusy,
    SessionClosed,
)
from continuum.hashing import message_identity
from continuum.messages import Message, normalize_messages
from continuum.metrics import Reset, ResetReason, TurnMetrics
from continuum.stateful.params import GenerationParams, TurnResult
from continuum.store.sqlite import SessionId, StoredMessage

if TYPE_CHECKING:
    from continuum.stateful.worker import Worker

OnText = Callable[[str], None]
_SENTINEL = "\u2063\u2063continuum-next-message\u2063\u2063"
_LAST_WORD = re.compile(r"\s+\S*$|\S+$")
FEED_ROLES = ("user", "tool")
_NO_SPECULATION = 1 << 62


@dataclass
class _Input:
    """A message still arriving (``feed``): its text so far and where its segment starts."""

    message: Message  # role, name, tool_call_id; "content" is the text so far
    base: tuple[int, ...]  # the committed conversation's tokens: the segment starts after them
    header: str  # the template text that opens the segment
    resident0: int  # resident length when the message started arriving (abandon goes back)
    chunks: int = 0
    t_first: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class _Target:
    """The canonical prompt of a window: wake tokens, then one token segment per message."""

    window: int
    wake: tuple[int, ...]
    segments: tuple[tuple[int, ...], ...]
    generation_prompt: tuple[int, ...]
    rendered: str  # the window's text without the generation prompt
    ends: tuple[int, ...]  # end offset of each message's segment in ``rendered``
    generation_text: str

    def tokens(self) -> list[int]:
        out = list(self.wake)
        for seg in self.segments:
            out.extend(seg)
        return out

    def prompt_len(self) -> int:
        return len(self.wake) + sum(map(len, self.segments)) + len(self.generation_prompt)

    def verified_end(self, n_segments: int) -> int:
        return len(self.wake) + sum(len(s) for s in self.segments[:n_segments])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ChatSession:
    """A stateful conversation bound to one :class:`Worker`. Use one thread per turn."""

    def __init__(
        self,
        worker: Worker,
        session_id: SessionId,
        *,
        system: str | None,
        continuity: str | None,
        history: list[StoredMessage],
        high_water: int,
        turns: int = 0,
    ) -> None:
        self._worker = worker
        self.id = session_id
        self.tenant = ""  # the namespace that owns it (set by the worker)
        self._system = system
        self._continuity = continuity
        self._history = history
        self.high_water = high_water
        self.turns = turns
        self._window = 0
        self._wake: tuple[int, ...] | None = None
        # segment cache, aligned with history[window:] and valid for the current system prompt
        self._segments: list[tuple[int, ...]] = []
        self._ends: list[int] = []
        self._rendered = ""
        self.resident: list[int] = []  # tokens of the parked snapshot while another is active
        self.pending_resets: list[Reset] = []
        self._busy = threading.Lock()
        self._closed = False
        self.last: TurnResult | None = None
        # eager glue: template tokens that will open the next message, decoded while idle
        self._glue: tuple[int, ...] = ()  # predicted, not yet decoded
        self._glue_at = -1  # resident length the prediction applies to
        self._glue_span = (0, 0)  # resident positions [start, end) of decoded glue tokens
        self._floor = 0  # tokens below this were decoded in batches that must not be re-split
        self._spec_from = _NO_SPECULATION  # resident tokens from here on were decoded ahead
        self._input: _Input | None = None
        self._input_at = 0.0  # when the arriving message last grew
        # speculative finish: (the prompt commit() would decode now, the logits after it)
        self._spec: tuple[tuple[int, ...], np.ndarray] | None = None

    # -- public API ------------------------------------------------------------------------
    @property
    def system(self) -> str | None:
        return self._system

    @property
    def history(self) -> list[Message]:
        """The authoritative conversation, system message first when there is one."""
        msgs = [dict(m.message) for m in self._history]
        return ([{"role": "system", "content": self._system}] if self._system else []) + msgs

    def turn(
        self,
        messages: list[Message],
        params: GenerationParams | None = None,
        on_text: OnText | None = None,
    ) -> TurnResult:
        """Run a turn from the *full* message list (OpenAI shape). A leading system message
        replaces the session's system prompt; without one, the session keeps its own."""
        wire = len(json.dumps(messages, ensure_ascii=False, default=str))
        msgs = normalize_messages(messages)
        system = self._system
        if msgs[0]["role"] == "system":
            system, msgs = msgs[0]["content"], msgs[1:]
        return self._locked_turn(system, msgs, params, on_text, wire)

    def append(
        self,
        new_messages: list[Message],
        params: GenerationParams | None = None,
        on_text: OnText | None = None,
    ) -> TurnResult:
        """Run a turn from only the messages added since the last turn (seed 000's delta)."""
        wire = len(json.dumps(new_messages, ensure_ascii=False, default=str))
        new = normalize_messages(new_messages)
        msgs = [dict(m.message) for m in self._history] + new
        return self._locked_turn(self._system, msgs, params, on_text, wire)

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
        longer change; return the message's tokens decoded so far. Call ``commit()`` when the
        message ends (or ``abandon()``). The first call fixes the role (``user``, or ``tool``
        for a tool result streamed in); later calls only add text.

        Tokenization moves as text arrives, so the tail is held back: the last word (and the
        whitespace before it) and one more token stay undecoded, and nothing is decoded until at
        least 8 tokens are ready — llama.cpp's batches of 8+ tokens give the same KV however a
        prompt is split, so the model sees exactly what one whole-message append would show it.
        ``commit()`` re-checks every resident token against the whole message's tokenization.
        """
        if not isinstance(chunk, str):
            raise InvalidRequest(f"feed() takes text, got {type(chunk).__name__}")
        with self._turn_lock():
            backend = self._worker.backend
            self._settle_glue()
            inp = self._input
            if inp is None:
                if role not in FEED_ROLES:
                    raise InvalidRequest(f"feed() role must be one of {FEED_ROLES}, got {role!r}")
                message: Message = {"role": role, "content": ""}
                if name is not None:
                    message["name"] = name
                if tool_call_id is not None:
                    message["tool_call_id"] = tool_call_id
                base = self._base_tokens()
                inp = self._input = _Input(
                    message, tuple(base), self._header_for(message), len(backend.tokens)
                )
            elif role != inp.message["role"]:
                raise InvalidRequest(
                    f"a {inp.message['role']} message is already arriving; commit() or "
                    "abandon() it before feeding a message of another role"
                )
            inp.message["content"] += chunk
            inp.chunks += 1
            self._input_at = time.perf_counter()
            self._spec = None
            text = inp.message["content"]
            cand = backend.tokenize(inp.header + text)
            m = _LAST_WORD.search(text)
            held = backend.tokenize(inp.header + text[: m.start() if m else len(text)])
            want = [*inp.base, *cand[: max(0, _common_prefix(cand, held) - 1)]]
            same = _common_prefix(backend.tokens, want)
            if same < len(backend.tokens):  # a boundary moved under resident tokens: drop them
                backend.truncate(same)
                self._floor = min(self._floor, same)
            if len(want) - same >= MIN_BATCH:
                self._spec_from = min(self._spec_from, same)
                backend.decode(want[same:])
            self._worker._schedule_speculation(self)
            return max(0, len(backend.tokens) - len(inp.base))

    def commit(
        self, params: GenerationParams | None = None, on_text: OnText | None = None
    ) -> TurnResult:
        """End the arriving message and generate the reply. The prompt is the one an
        ``append()`` of the whole message would decode; ``ttft_ms`` runs from this call."""
        inp = self._input
        if inp is None:
            raise InvalidRequest("nothing to commit: feed() a message first")
        msgs = [dict(m.message) for m in self._history] + [dict(inp.message)]
        wire = len(json.dumps(inp.message, ensure_ascii=False))
        result = self._locked_turn(self._system, msgs, params, on_text, wire, fed=inp)
        return result

    def abandon(self) -> int:
        """Drop the message that was arriving (e.g. its client disconnected): its tokens are
        truncated away and the history records nothing of it. Returns the tokens dropped."""
        with self._turn_lock():
            return self._drop_input()

    def _speculate(self) -> int:
        """Decode the rest of the prompt as if the arriving message ended now (called by the
        idle runner under the worker lock); return the tokens decoded. The batch split follows
        commit()'s own rule, so the saved logits are exactly those commit() would compute."""
        inp = self._input
        if inp is None or self._spec is not None:
            return 0
        backend = self._worker.backend
        fmt = backend.chat_format
        render = self._render_list(self._system, self._history, self._window)
        prev = fmt.render(render, add_generation_prompt=False)
        msgs = [*render, dict(inp.message)]
        cur = fmt.render(msgs, add_generation_prompt=False)
        with_gen = fmt.render(msgs, add_generation_prompt=True)
        if not cur.startswith(prev) or not with_gen.startswith(cur):
            return 0
        full = [
            *inp.base,
            *backend.tokenize(cur[len(prev) :]),
            *backend.tokenize(with_gen[len(cur) :]),
        ]
        if len(full) + 1 >= min(backend.n_ctx, self.high_water):
            return 0  # commit() will move the window: nothing to prepare here
        keep = min(_common_prefix(backend.tokens, full), len(full) - 1)
        floor = min(self._floor, keep)
        if keep - floor > 0 and len(full) - keep < MIN_BATCH:
            keep = max(floor, len(full) - MIN_BATCH)
        backend.truncate(keep)
        self._floor = min(self._floor, keep)
        self._spec_from = min(self._spec_from, keep)
        logits, _ = backend.decode(full[keep:])
        assert logits is not None
        self._spec = (tuple(full), np.array(logits, copy=True))
        return len(full) - keep

    def _drop_input(self) -> int:
        self._spec = None
        inp, self._input = self._input, None
        if inp is None:
            return 0
        backend = self._worker.backend
        keep = min(len(backend.tokens), inp.resident0)
        dropped = len(backend.tokens) - keep
        backend.truncate(keep)
        self._floor = min(self._floor, keep)
        return dropped

    @property
    def arriving(self) -> str | None:
        """The text of the message still arriving, or None."""
        return self._input.message["content"] if self._input is not None else None

    def close(self) -> None:
        """Release this session's resident state; its history stays in the store."""
        if not self._closed:
            self._closed = True
            self._worker._release(self)

    # -- the turn ----------------------------------------------------------------------------
    @contextmanager
    def _turn_lock(self) -> Iterator[None]:
        """This session's turn lock, then the worker's lock with this session active."""
        if self._closed:
            raise SessionClosed(self.id)
        if not self._busy.acquire(blocking=False):
            raise SessionBusy(self.id)
        try:
            with self._worker._claim():
                self._worker._activate(self)
                yield
        finally:
            self._busy.release()

    def _locked_turn(
        self,
        system: str | None,
        msgs: list[Message],
        params: GenerationParams | None,
        on_text: OnText | None,
        wire_chars: int,
        fed: _Input | None = None,
    ) -> TurnResult:
        params = params or GenerationParams()
        params.validate()
        for i, m in enumerate(msgs):
            if m["role"] == "system":
                raise InvalidMessage(i, "role", "'system' is only allowed as the first message")
        t0 = time.perf_counter()
        with self._turn_lock():
            if fed is None:
                self._input = None  # a whole-message turn replaces anything still arriving
                self._spec = None
            elif self._input is not fed:
                raise InvalidRequest("the arriving message was abandoned or already committed")
            self._settle_glue()
            result = self._run(system, msgs, params, on_text, wire_chars, t0)
            self._input = None
        self._worker._schedule_glue(self)
        return result

    def _run(
        self,
        system: str | None,
        msgs: list[Message],
        params: GenerationParams,
        on_text: OnText | None,
        wire_chars: int,
        t0: float,
    ) -> TurnResult:
        backend = self._worker.backend
        idents = [message_identity(m) for m in msgs]
        d = 0
        while d < min(len(msgs), len(self._history)) and self._history[d].identity == idents[d]:
            d += 1
        new_hist = self._history[:d] + [
            StoredMessage(m, i) for m, i in zip(msgs[d:], idents[d:], strict=True)
        ]
        rebuilds: list[tuple[ResetReason, str]] = []
        wake_same = system == self._system and self._wake is not None
        if not wake_same and self._wake is not None:
            rebuilds.append((ResetReason.DIVERGENCE, "the system prompt changed"))
        window = self._window if wake_same and d >= self._window else 0
        n_cached = max(0, d - window) if wake_same and window == self._window else 0
        target = self._target(system, new_hist, window, n_cached)
        if window != self._window or target.prompt_len() + params.max_tokens > self.high_water:
            target = self._fit(system, new_hist, window, params.max_tokens)
        if target.window != self._window:
            rebuilds.append(
                (
                    ResetReason.HIGH_WATER,
                    f"prompt + max_tokens would cross the high-water mark ({self.high_water}); "
                    f"rebuilt from message {target.window} of {len(new_hist)}",
                )
            )
            verified = len(target.wake) if wake_same else 0
        else:
            verified = target.verified_end(n_cached) if wake_same else 0
        prompt = target.tokens()
        n_prompt = len(prompt) + len(target.generation_prompt)
        if n_prompt >= backend.n_ctx:
            raise ContextOverflow(n_prompt + 1, backend.n_ctx)

        before = len(backend.tokens)
        keep = _common_prefix(backend.tokens, prompt[:verified])
        full = prompt + list(target.generation_prompt)
        glue_start, glue_end = self._glue_span
        fed_tokens = eager_used = eager_discarded = 0
        spec, self._spec = self._spec, None
        ready = spec is not None and spec[0] == tuple(full) and backend.tokens == full
        if ready and keep == verified:  # a speculative finish already decoded this prompt
            keep = len(full)
            eager_used = max(0, glue_end - glue_start)
            fed_tokens = max(0, keep - max(verified, glue_end))
        elif keep == verified and before > verified and self._spec_from <= verified:
            # tokens decoded ahead of this turn (eager glue, a message fed as it arrived) are
            # kept exactly where they equal the prompt's tokens; the rest is truncated
            keep = verified + _common_prefix(backend.tokens[verified:], full[verified:])
            keep = min(keep, len(full) - 1)  # at least one token decoded for fresh logits
            floor = min(self._floor, keep)
            if keep - floor > 0 and len(full) - keep < MIN_BATCH:
                # a short last batch would use llama.cpp's 1-7-token kernels: back off into
                # tokens fed earlier so the batch split matches one whole-message decode
                keep = max(floor, len(full) - MIN_BATCH)
            eager_used = max(0, min(keep, glue_end) - glue_start)
            eager_discarded = max(0, glue_end - glue_start - eager_used)
            fed_tokens = max(0, keep - max(verified, glue_end))
        elif glue_end > glue_start:
            eager_discarded = glue_end - glue_start
        resets = [
            Reset(
                r.reason,
                r.detail,
                r.tokens_dropped,
                r.tokens_rebuilt if r.tokens_rebuilt >= 0 else max(0, verified - keep),
            )
            for r in self.pending_resets
        ] + [Reset(why, detail, before - keep, len(prompt) - keep) for why, detail in rebuilds]
        try:
            if ready and keep == len(full):
                assert spec is not None
                logits, prefill_ms, delta = spec[1], 0.0, []
            else:
                backend.truncate(keep)
                delta = full[keep:]
                if not delta:  # nothing new to decode: re-decode the last token for logits
                    keep -= 1
                    backend.truncate(keep)
                    delta = full[keep:]
                decoded, prefill_ms = backend.decode(delta)
                assert decoded is not None
                logits = decoded
            out = backend.generate(logits, params, on_text=on_text, t0=t0)
            text, gen, finish, ttft = out.text, list(out.tokens), out.finish_reason, out.ttft_ms
            reply: Message = {"role": "assistant", "content": text}
            stored = StoredMessage(reply, message_identity(reply), tuple(gen), backend.model.digest)
            reply_seg = self._reply_segment(system, new_hist, target, stored)  # after TTFT
            metrics = TurnMetrics(
                prompt_tokens_evaluated=len(delta),
                tokens_reused=keep,
                tokens_truncated=before - keep,
                completion_tokens=len(gen),
                ttft_ms=ttft,
                prefill_ms=prefill_ms,
                total_ms=(time.perf_counter() - t0) * 1000.0,
                context_used=len(backend.tokens),
                context_limit=backend.n_ctx,
                high_water=self.high_water,
                wire_chars=wire_chars,
                resets=tuple(resets),
                fed_tokens=fed_tokens,
                eager_tokens_used=eager_used,
                eager_tokens_discarded=eager_discarded,
            )
            turn_no = self._worker.store.commit_turn(
                self.id,
                keep=d,
                new=[*new_hist[d:], stored],
                finish_reason=finish,
                metrics=metrics.to_dict(),
                system=system,
            )
        except BaseException:
            # Nothing was committed. The KV may hold the new messages (and part of a reply);
            # that is fine — the next turn verifies it — but the segment cache must only
            # describe history that is still authoritative.
            if target.window == self._window and wake_same:
                del self._segments[n_cached:], self._ends[n_cached:]
            else:
                self._segments, self._ends = [], []
            self._glue, self._glue_span = (), (0, 0)
            self._floor = min(self._floor, len(backend.tokens))
            self._spec_from = min(self._spec_from, len(backend.tokens))
            raise
        self._system = system
        self._remember(target, reply_seg)
        self._history = [*new_hist, stored]
        self._glue_span, self._spec_from = (0, 0), _NO_SPECULATION
        self._floor = len(backend.tokens)
        self._predict_glue()
        self.pending_resets = []
        self.turns = turn_no
        self.last = TurnResult(turn_no, text, tuple(gen), finish, metrics)
        return self.last

    # -- eager glue --------------------------------------------------------------------------
    def _base_tokens(self) -> list[int]:
        """Tokens of the committed conversation: the next message's segment starts after them."""
        n = len(self._segments)
        return self._target(self._system, self._history, self._window, n).tokens()

    def _header_for(self, message: Message) -> str:
        """The template text that opens ``message``'s segment after the committed history."""
        fmt = self._worker.backend.chat_format
        render = self._render_list(self._system, self._history, self._window)
        prev = fmt.render(render, add_generation_prompt=False)
        cur = fmt.render([*render, {**message, "content": _SENTINEL}], add_generation_prompt=False)
        if not cur.startswith(prev) or _SENTINEL not in cur:
            return ""
        return cur[len(prev) : cur.index(_SENTINEL)]

    def _predict_glue(self) -> None:
        """After a reply (or the wake phase): the tokens that must open the next user message —
        the rest of the reply's closing template and the next turn's header — to be decoded
        while the session is idle."""
        self._glue, self._glue_at = (), -1
        if not self._worker.config.eager_glue:
            return
        backend = self._worker.backend
        base = self._base_tokens()
        resident = backend.tokens
        if len(resident) > len(base) or _common_prefix(resident, base) != len(resident):
            return
        header = self._header_for({"role": "user", "content": ""})
        glue = base[len(resident) :] + (backend.tokenize(header) if header else [])
        if glue and len(base) + len(backend.tokenize(header)) < backend.n_ctx:
            self._glue, self._glue_at = tuple(glue), len(resident)

    def _settle_glue(self) -> int:
        """Decode the predicted glue now if it is still pending (called under the worker lock,
        by the idle runner or at the start of the next turn or feed). It is always its own
        batch, whether decoded early or late, so the next turn's numerics do not depend on
        timing. Returns the tokens decoded."""
        glue, self._glue = self._glue, ()
        backend = self._worker.backend
        if not glue or len(backend.tokens) != self._glue_at:
            return 0
        start = len(backend.tokens)
        self._spec_from = min(self._spec_from, start)
        backend.decode(list(glue))
        self._glue_span = (start, len(backend.tokens))
        self._floor = len(backend.tokens)
        return len(glue)

    # -- rendering -----------------------------------------------------------------------------
    def _render_list(
        self, system: str | None, hist: list[StoredMessage], window: int
    ) -> list[Message]:
        out: list[Message] = []
        if system is not None:
            content = system + (f"\n\n{self._continuity}" if self._continuity else "")
            out.append({"role": "system", "content": content})
        return out + [m.message for m in hist[window:]]

    def wake_tokens(self, system: str | None) -> tuple[int, ...]:
        """Tokens of the stable identity: BOS, template preamble, system prompt, continuity."""
        backend = self._worker.backend
        text = backend.chat_format.render(self._render_list(system, [], 0), False)
        toks = backend.tokenize(text)
        if backend.add_bos and (not toks or toks[0] != backend.bos_id):
            toks.insert(0, backend.bos_id)
        return tuple(toks)

    def _target(
        self, system: str | None, hist: list[StoredMessage], window: int, n_cached: int
    ) -> _Target:
        """Render the window into token segments, reusing the first ``n_cached`` cached ones."""
        backend = self._worker.backend
        fmt = backend.chat_format
        same_wake = system == self._system and self._wake is not None
        wake = self._wake if same_wake and self._wake is not None else self.wake_tokens(system)
        render = self._render_list(system, hist, window)
        offset = 1 if system is not None else 0
        if not (same_wake and window == self._window):
            n_cached = 0
        n_cached = min(n_cached, len(self._segments))
        segs, ends = self._segments[:n_cached], self._ends[:n_cached]
        if n_cached:
            prev = self._rendered[: ends[-1]]
        else:
            prev = fmt.render(render[:offset], add_generation_prompt=False)
        for j in range(offset + n_cached, len(render)):
            cur = fmt.render(render[: j + 1], add_generation_prompt=False)
            if not cur.startswith(prev):
                fmt.segments(render[: j + 1])  # raises ChatTemplateError with the details
            segs.append(self._segment_tokens(render, j, prev, cur, hist[window + j - offset]))
            ends.append(len(cur))
            prev = cur
        with_gen = fmt.render(render, add_generation_prompt=True)
        if not with_gen.startswith(prev):
            fmt.generation_prompt(render)  # raises ChatTemplateError with the details
        gen_text = with_gen[len(prev) :]
        return _Target(
            window,
            wake,
            tuple(segs),
            tuple(backend.tokenize(gen_text)),
            prev,
            tuple(ends),
            gen_text,
        )

    def _segment_tokens(
        self, render: list[Message], j: int, prev: str, cur: str, stored: StoredMessage
    ) -> tuple[int, ...]:
        backend = self._worker.backend
        text = cur[len(prev) :]
        if stored.gen_tokens is not None and stored.gen_model == backend.model.digest:
            header = backend.chat_format.render(render[:j], add_generation_prompt=True)[len(prev) :]
            split = backend.chat_format.split_assistant(text, header, stored.message["content"])
            if split is not None:
                return (
                    *backend.tokenize(split.header),
                    *stored.gen_tokens,
                    *backend.tokenize(split.close),
                )
        return tuple(backend.tokenize(text))

    def _reply_segment(
        self, system: str | None, hist: list[StoredMessage], target: _Target, reply: StoredMessage
    ) -> tuple[tuple[int, ...], str] | None:
        """The reply's segment tokens and the rendered text that ends with it, so the next turn
        renders only what is new; None if the template rewrote the reply (rendered next turn).
        The header is the generation prompt just decoded; the content tokens are as generated."""
        fmt = self._worker.backend.chat_format
        render = [*self._render_list(system, hist, target.window), reply.message]
        cur = fmt.render(render, add_generation_prompt=False)
        if not cur.startswith(target.rendered):
            return None
        text = cur[len(target.rendered) :]
        split = fmt.split_assistant(text, target.generation_text, reply.message["content"])
        if split is None or reply.gen_tokens is None:
            return None
        close = self._worker.backend.tokenize(split.close)
        return (*target.generation_prompt, *reply.gen_tokens, *close), cur

    def _remember(self, target: _Target, reply: tuple[tuple[int, ...], str] | None) -> None:
        self._wake = target.wake
        self._window = target.window
        self._segments = list(target.segments)
        self._ends = list(target.ends)
        self._rendered = target.rendered
        if reply is not None:
            self._segments.append(reply[0])
            self._ends.append(len(reply[1]))
            self._rendered = reply[1]

    def _fit(
        self, system: str | None, hist: list[StoredMessage], window: int, max_tokens: int
    ) -> _Target:
        """The earliest window start (a user message) whose prompt + max_tokens fits under the
        high-water mark; else the latest one if it fits the context; else ContextOverflow."""
        starts = [window] + [
            i for i, m in enumerate(hist) if i > window and m.message["role"] == "user"
        ]
        n_ctx = self._worker.backend.n_ctx
        lo, hi = 0, len(starts) - 1
        best: _Target | None = None
        while lo <= hi:  # prompt length shrinks as the window start moves later
            mid = (lo + hi) // 2
            t = self._target(system, hist, starts[mid], 0)
            if t.prompt_len() + max_tokens <= self.high_water:
                best, hi = t, mid - 1
            else:
                lo = mid + 1
        if best is not None:
            return best
        last = self._target(system, hist, starts[-1], 0)
        if last.prompt_len() + 1 > n_ctx:
            raise ContextOverflow(last.prompt_len() + 1, n_ctx, "the last message with its context")
        return last

    # -- called by the worker, under its lock ----------------------------------------------------
    def _wake_up(self) -> int:
        """Prefill the stable identity (wake phase); return the tokens decoded."""
        backend = self._worker.backend
        wake = self.wake_tokens(self._system)
        if len(wake) + 1 > backend.n_ctx:
            raise ContextOverflow(len(wake) + 1, backend.n_ctx, "the wake prefix (system prompt)")
        keep = _common_prefix(backend.tokens, list(wake))
        backend.truncate(keep)
        backend.decode(list(wake[keep:]))
        self._wake = wake
        self._window = 0
        self._segments, self._ends, self._rendered = [], [], ""
        self._glue_span, self._floor = (0, 0), len(backend.tokens)
        self._spec_from = _NO_SPECULATION
        self._predict_glue()
        return len(wake) - keep

    def _rebuild(
        self,
        reason: ResetReason,
        detail: str,
        max_tokens: int,
        snapshot: tuple[bytes, tuple[int, ...]] | None = None,
    ) -> None:
        """Rebuild resident KV from the authoritative history (reopen in a new process). A KV
        snapshot of this session, when given, is restored for the prefix it shares with the
        history's canonical tokens, so only the rest is decoded."""
        backend = self._worker.backend
        target = self._fit(self._system, self._history, 0, max_tokens)
        prompt = target.tokens()
        if snapshot is not None:
            payload, snap_tokens = snapshot
            shared = _common_prefix(list(snap_tokens), prompt)
            try:
                backend.load_state(payload, list(snap_tokens))
                backend.truncate(shared)
                detail = f"{detail}; restored {shared} tokens from a KV snapshot"
            except BackendError as e:
                backend.clear()
                reason, detail = ResetReason.RESTORE_FAILED, f"KV snapshot rejected: {e}"
        decoded = self._wake_up() if not backend.tokens else 0
        self._wake = self.wake_tokens(self._system)
        keep = _common_prefix(backend.tokens, prompt)
        backend.truncate(keep)
        backend.decode(prompt[keep:])
        self._remember(target, None)
        self._glue_span, self._floor = (0, 0), len(backend.tokens)
        self._spec_from = _NO_SPECULATION
        self._predict_glue()
        self.pending_resets.append(Reset(reason, detail, 0, decoded + len(prompt) - keep))
