"""Prefill on arrival and eager glue: what a session decodes ahead of its next turn.

Tokenization moves as text arrives, so the tail is held back: the last word (and the whitespace
before it) and one more token stay undecoded, and nothing is decoded until at least 8 tokens are
ready — llama.cpp's batches of 8+ tokens give the same KV however a prompt is split, so the model
sees exactly what one whole-message append would show it. ``commit()`` re-checks every resident
token against the whole message's tokenization (:mod:`continuum.stateful.plan`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from continuum.backends.base import MIN_BATCH, SequenceView
from continuum.backends.exactness import exact_reuse
from continuum.messages import Message
from continuum.stateful.plan import Ahead, common_prefix

FEED_ROLES = ("user", "tool")
_LAST_WORD = re.compile(r"\s+\S*$|\S+$")

Tokenize = Callable[[str], list[int]]
Render = Callable[[list[Message], bool], str]  # messages, add_generation_prompt -> text


@dataclass
class Arriving:
    """A message still arriving: its text so far and where its segment starts."""

    message: Message  # role, name, tool_call_id; "content" is the text so far
    base: tuple[int, ...]  # the committed conversation's tokens: the segment starts after them
    header: str  # the template text that opens the segment
    resident0: int  # resident length when the message started arriving (abandon goes back)
    chunks: int = 0
    t_first: float = field(default_factory=time.perf_counter)
    t_last: float = field(default_factory=time.perf_counter)  # when it last grew

    def grow(self, chunk: str) -> None:
        self.message["content"] += chunk
        self.chunks += 1
        self.t_last = time.perf_counter()


@dataclass(frozen=True, slots=True)
class Speculation:
    """A speculative finish: the prompt commit() would decode now, and the logits after it."""

    prompt: tuple[int, ...]
    logits: np.ndarray


def new_message(role: str, name: str | None, tool_call_id: str | None) -> Message:
    message: Message = {"role": role, "content": ""}
    if name is not None:
        message["name"] = name
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    return message


def settled_tokens(tokenize: Tokenize, arriving: Arriving) -> list[int]:
    """The conversation's tokens up to the end of what of the message can no longer change."""
    text = arriving.message["content"]
    cand = tokenize(arriving.header + text)
    m = _LAST_WORD.search(text)
    held = tokenize(arriving.header + text[: m.start() if m else len(text)])
    return [*arriving.base, *cand[: max(0, common_prefix(cand, held) - 1)]]


def finished_prompt(
    render: Render, tokenize: Tokenize, window: list[Message], arriving: Arriving
) -> list[int] | None:
    """The whole prompt commit() would decode if the message ended now (``window`` is the
    committed conversation as rendered, ``render`` the session's template with its tools);
    None if the template does not extend it cleanly."""
    prev = render(window, False)
    msgs = [*window, dict(arriving.message)]
    cur = render(msgs, False)
    with_gen = render(msgs, True)
    if not cur.startswith(prev) or not with_gen.startswith(cur):
        return None
    return [*arriving.base, *tokenize(cur[len(prev) :]), *tokenize(with_gen[len(cur) :])]


NO_SPECULATION = 1 << 62


class Lookahead:
    """What a session decodes ahead of its next turn — eager glue, a message fed as it
    arrives, a speculative finish — and the batch floor a decode plan must respect.

    Invariants: resident tokens at and after ``spec_from`` were decoded ahead of the turn that
    will use them (the plan keeps them only where they equal its prompt); tokens below
    ``floor`` were decoded in batches that must not be re-split; ``glue_span`` is the resident
    range of decoded eager glue.

    With ``exact``, whatever it decodes ahead starts where the sequence stops being exact (the
    reply, decoded a token at a time) and is one batch of 8 or more, so the work ahead also
    re-decodes the reply in whole batches, off the next turn's path."""

    def __init__(self, seq: SequenceView, *, glue_rides: bool = False, exact: bool = False) -> None:
        self.seq = seq
        self.glue_rides = glue_rides
        self.exact = exact
        self.glue: tuple[int, ...] = ()  # predicted, not yet decoded
        self.glue_at = -1  # resident length the prediction applies to
        self.glue_span = (0, 0)
        self.floor = 0
        self.spec_from = NO_SPECULATION
        self.input: Arriving | None = None
        self.spec: Speculation | None = None

    def ahead(self, full: list[int]) -> Ahead:
        spec = self.spec
        ready = spec is not None and spec.prompt == tuple(full)
        exact = self.seq.exact if self.exact else None
        return Ahead(self.glue_span, self.spec_from, self.floor, ready, exact)

    def _start(self, want: Sequence[int], same: int) -> int:
        """Where decoding ``want`` ahead starts, given that ``same`` resident tokens equal it:
        there, or (exact) no later than the exact tokens end, with at least 8 to decode."""
        if not self.exact:
            return same
        return min(same, self.seq.exact) if len(want) - same >= MIN_BATCH else same

    def settled(self) -> None:
        """Nothing resident was decoded ahead any more (a turn committed, a wake, a rebuild)."""
        self.glue_span, self.spec_from = (0, 0), NO_SPECULATION
        self.floor = len(self.seq.tokens)

    def failed(self) -> None:
        """A turn failed: what is resident stays, verified by the next turn."""
        n = len(self.seq.tokens)
        self.glue, self.glue_span = (), (0, 0)
        self.floor, self.spec_from = min(self.floor, n), min(self.spec_from, n)

    def truncate(self, n: int) -> None:
        self.seq.truncate(n)
        self.floor = min(self.floor, n)

    # -- eager glue ----------------------------------------------------------------------
    def predict_glue(self, base: list[int], header: list[int], n_ctx: int) -> None:
        """The tokens that must open the next user message — the rest of the reply's closing
        template (``base`` past what is resident) and the next turn's ``header``."""
        self.glue, self.glue_at = (), -1
        resident = self.seq.tokens
        if len(resident) > len(base) or common_prefix(resident, base) != len(resident):
            return
        start = len(resident)
        if self.exact:  # from the exact end on (the reply again, in one batch), 8 at least
            start = min(start, exact_reuse(self.seq.exact, len(base) + len(header)))
        glue = base[start:] + header
        if glue and len(base) + len(header) < n_ctx:
            self.glue, self.glue_at = tuple(glue), start

    def settle_glue(self) -> int:
        """Decode the predicted glue now if it is still pending. It is always its own batch,
        whether decoded early or late, so the next turn's numerics do not depend on timing."""
        glue, self.glue = self.glue, ()
        if not glue or self.glue_at > len(self.seq.tokens):
            return 0
        if self.glue_at < len(self.seq.tokens):  # exact: re-decode the reply from here
            if not self.exact or self.seq.exact < self.glue_at:
                return 0
            self.truncate(self.glue_at)
        start = len(self.seq.tokens)
        self.spec_from = min(self.spec_from, start)
        self.seq.decode(list(glue))
        self.glue_span = (start, len(self.seq.tokens))
        self.floor = len(self.seq.tokens)
        return len(glue)

    def glue_for_turn(self) -> None:
        """A turn (or a feed) starts: glue still pending is decoded now, as its own batch — or,
        with ``glue_rides`` (lanes decoded together, where batch composition varies with load
        anyway), as the start of the turn's own prefill, in the same step."""
        if self.glue_rides:
            self.glue = ()
        else:
            self.settle_glue()

    # -- a message arriving ----------------------------------------------------------------
    def feed(self, want: list[int]) -> None:
        """Hold ``want`` (the conversation up to what of the message has settled) resident:
        drop resident tokens a moved boundary invalidated, decode once 8+ tokens are ready."""
        same = self._start(want, common_prefix(self.seq.tokens, want))
        if same < len(self.seq.tokens):
            self.truncate(same)
        if len(want) - same >= MIN_BATCH:
            self.spec_from = min(self.spec_from, same)
            self.seq.decode(want[same:])

    def drop_input(self) -> int:
        """Forget the arriving message and truncate its tokens; return how many."""
        self.spec = None
        inp, self.input = self.input, None
        if inp is None:
            return 0
        keep = min(len(self.seq.tokens), inp.resident0)
        dropped = len(self.seq.tokens) - keep
        self.truncate(keep)
        return dropped

    def speculate(self, full: list[int]) -> int:
        """Decode the rest of ``full`` as if the message ended now; keep the logits. The batch
        split follows the decode plan's rule, so they are exactly those commit() computes."""
        keep = min(common_prefix(self.seq.tokens, full), len(full) - 1)
        floor = min(self.floor, keep)
        if keep - floor > 0 and len(full) - keep < MIN_BATCH:
            keep = max(floor, len(full) - MIN_BATCH)
        if self.exact:
            keep = exact_reuse(min(keep, self.seq.exact), len(full))
        self.truncate(keep)
        self.spec_from = min(self.spec_from, keep)
        logits, _ = self.seq.decode(full[keep:])
        assert logits is not None
        self.spec = Speculation(tuple(full), logits.copy())
        return len(full) - keep
