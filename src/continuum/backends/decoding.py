"""One sequence's reply, one token at a time: sampling, grammar, stop strings and streamed text.

:class:`Decoding` is the state of a reply between two decode steps. It never decodes: whoever
drives it decodes the token it returns into the sequence, alone
(:meth:`LlamaCppBackend.generate`) or in one batch with other sequences' tokens
(:mod:`continuum.backends.batching`), and hands it the logits that came back::

    tok = d.start(logits)
    while tok is not None:
        logits = <decode tok into d.seq>
        tok = d.step(logits)
    out = d.result()

Invariants, as in ``generate``: every generated token but the last is decoded (it stays
resident); the end-of-generation token is not. When the reply ends, ``resident`` is the
sequence's length that leaves (a driver that decoded further ahead — a verified draft — cuts
back to it); until then the sequence holds ``base`` plus every returned token but the last.
A reply cut at a stop string keeps the text before it: the generated tokens inside that text
stay resident, the text's tail in a token that crossed the cut is tokenized anew (not
resident), and the stop string's tokens are dropped from the KV; so is a reply cut where it
repeats a tool call it made (``end_repeated_call``). ``on_text`` receives text once it is final
(held back while it could start a stop string); if it raises, the exception propagates from
``start``/``step``.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable

import numpy as np

from continuum.backends.base import GenOut, Logits, SequenceBackend
from continuum.backends.sampling import (
    GrammarSampler,
    cut_at,
    distribution,
    sample,
    speculative_choice,
)
from continuum.params import GenerationParams
from continuum.toolcalls import CALL_END, repeated_call_at


class Decoding:
    """The reply being generated into sequence ``seq`` of ``backend``."""

    def __init__(
        self,
        backend: SequenceBackend,
        params: GenerationParams,
        *,
        grammar: GrammarSampler | None = None,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        seq: int = 0,
    ) -> None:
        self.backend = backend
        self.params = params
        self.grammar = grammar
        self.on_text = on_text
        self.t0 = time.perf_counter() if t0 is None else t0
        self.seq = seq
        self.rng = np.random.default_rng(params.seed) if params.temperature > 0 else None
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.ttft_ms: float | None = None
        self.gen: list[int] = []
        self.text = ""
        self.emitted = 0
        self.hold = max((len(s) for s in params.stop), default=1) - 1
        self.finish = "length"
        self.done = False
        self.base = 0  # the sequence's length when the reply started (the prompt's end)
        self.resident: int | None = None  # the sequence's length the reply leaves, once over

    def start(self, logits: Logits) -> int | None:
        """Choose the first token from the prompt's logits: the token to decode next, or None
        when the reply is already over."""
        tok = self._choose(logits)
        self.ttft_ms = (time.perf_counter() - self.t0) * 1000.0
        self.base = len(self.backend.seq_tokens(self.seq))
        return self._accept(tok)

    def step(self, logits: Logits) -> int | None:
        """The logits after the last returned token was decoded: the next token, or None."""
        return self._accept(self._choose(logits))

    def verify(self, logits: Logits, draft: int) -> int:
        """The token at a row of a sampled reply whose drafted token is ``draft``: ``draft``
        kept by :func:`speculative_choice`, or the token drawn in its place; distributed as
        :meth:`step`'s draw from the same logits. Hand it to :meth:`take`."""
        assert self.rng is not None and self.grammar is None, "verify() is for sampled replies"
        return speculative_choice(distribution(logits, self.params), draft, self.rng)

    def take(self, tok: int) -> int | None:
        """Accept ``tok`` as the reply's next token (chosen by :meth:`verify`): as
        :meth:`step` does after its own choice."""
        return self._accept(tok)

    def result(self) -> GenOut:
        assert self.done and self.ttft_ms is not None, "result() before the reply ended"
        return GenOut(self.text, tuple(self.gen), self.finish, self.ttft_ms)

    def _choose(self, logits: Logits) -> int:
        tok = sample(logits, self.params, self.rng)
        g = self.grammar
        if g is None:
            return tok
        if not g.allows(tok):
            tok = sample(g.mask(logits), self.params, self.rng)
        if not self.backend.is_eog(tok):
            g.accept(tok)
        return tok

    def _accept(self, tok: int) -> int | None:
        b, params = self.backend, self.params
        if b.is_eog(tok):
            self.finish = "stop"
            self._end(self.base + len(self.gen))  # every generated token is decoded
            return None
        gen = self.gen
        gen.append(tok)
        piece = self.utf8.decode(b.piece(tok))
        self.text += piece
        text = self.text
        cut = min((i for i in (text.find(s) for s in params.stop) if i >= 0), default=-1)
        if cut < 0 and params.end_repeated_call and CALL_END in text[-len(piece) - len(CALL_END) :]:
            cut = repeated_call_at(text)  # a call just closed: a repetition ends the reply
        if cut >= 0:  # nothing of the stop string stays resident, nor is it returned
            self.text, self.finish = text[:cut], "stop"
            kept, rest = cut_at(gen, self.text, b.detokenize, b.tokenize)
            b.truncate(self.base + len(kept), self.seq)
            self.gen = [*kept, *rest]
            self._end(self.base + len(kept))
            return None
        safe = len(text) - self.hold if params.stop else len(text)
        if self.on_text is not None and safe > self.emitted:
            self.on_text(text[self.emitted : safe])
            self.emitted = safe
        if len(gen) >= params.max_tokens or self.base + len(gen) >= b.n_ctx:
            self._end(self.base + len(gen) - 1)  # the last token is not decoded
            return None
        return tok

    def _end(self, resident: int) -> None:
        self.resident = resident
        if self.finish == "length":
            self.text += self.utf8.decode(b"", final=True)
        if self.on_text is not None and len(self.text) > self.emitted:
            self.on_text(self.text[self.emitted :])
            self.emitted = len(self.text)
        self.done = True
