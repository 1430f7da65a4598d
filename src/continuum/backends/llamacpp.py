"""The in-process llama.cpp backend: one model, one context, several resident sequences.

The backend owns a ``llama_context`` and mirrors what its KV cache holds for each sequence as a
token list (:meth:`LlamaCppBackend.seq_tokens`). It offers exactly the primitives of the
:class:`~continuum.backends.base.SequenceBackend` contract — tokenize, decode a suffix,
truncate, sample, save and restore a sequence's state, share cells between sequences — and
knows nothing of messages, sessions or tiers. With more than one sequence the KV cache is
unified: sequences share its ``n_ctx`` cells, and a cell can belong to several of them.

Invariant: ``seq_tokens(s)`` is always exactly the token sequence whose KV is in sequence ``s``,
positions ``0..len-1``. Every method that changes the KV changes the list in the same step; if
llama.cpp fails mid-way, the sequence is cleared rather than left in an unknown state.

Not thread-safe: one owner (the engine's lock) serialises every call.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, TypeVar

import llama_cpp
import numpy as np

from continuum.backends.base import MIN_BATCH, GenOut, Logits
from continuum.backends.chat_format import ChatFormat
from continuum.backends.context_guard import ContextGuard
from continuum.backends.decoding import Decoding
from continuum.backends.drafting import (
    DraftLength,
    DraftSources,
    DraftStats,
    VerifyCost,
    check_draft,
    drafted_reply,
)
from continuum.backends.exactness import ExactLedger
from continuum.backends.llama_process import (
    Weights,
    build_id,
    ggml_type_name,
    install_log_route,
    on_compute_thread,
)
from continuum.backends.models import ModelFile
from continuum.backends.sampling import GrammarSampler, grammar_sampler
from continuum.errors import (
    BackendError,
    ContextOverflow,
    DecodeAborted,
    InvalidRequest,
    KVCacheFull,
    SessionClosed,
    ShuttingDown,
)
from continuum.params import GenerationParams

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _chunks(n: int, n_batch: int) -> list[tuple[int, int]]:
    """Split n tokens into batches of at most n_batch, never leaving a final batch of 1-7
    tokens when it can be avoided: every batch of >= 8 tokens gives bit-identical results to
    one full batch, so a prompt decodes to the same KV however it is chunked."""
    bounds = [(s, min(s + n_batch, n)) for s in range(0, n, n_batch)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < MIN_BATCH:
        cut = bounds[-1][1] - MIN_BATCH
        bounds[-2] = (bounds[-2][0], cut)
        bounds[-1] = (cut, bounds[-1][1])
    return bounds


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """Context settings. ``n_threads``/``n_threads_batch`` are always set explicitly: left to
    llama-cpp-python, prompt processing uses every core and collapses under any other load."""

    n_ctx: int = 8192
    n_batch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None
    chat_format: str | None = None  # None: the GGUF's template, else the built-in for its arch
    n_seq_max: int = 1  # > 1: several sequences sharing one unified KV cache (prefix KV tier)
    # None: unified when n_seq_max > 1. False: each sequence its own stream of n_ctx cells
    # (n_ctx * n_seq_max in all), so a decode attends over its own sequence's cells only —
    # the lanes of a worker whose sessions are decoded together; no cells are shared
    kv_unified: bool | None = None
    # > 0: replies of generate(), and of a batch scheduler on this context, draft up to this
    # many tokens from the sequence's own (prompt lookup) and verify them in one call
    # (continuum.backends.drafting); 0: off
    draft: int = 0

    @property
    def unified(self) -> bool:
        return self.n_seq_max > 1 if self.kv_unified is None else self.kv_unified

    def threads(self) -> tuple[int, int]:
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidRequest(
                    f"{name} must be an int >= 1 (or None for all cores), got {value!r}"
                )
        n = self.n_threads or default_threads()
        return n, self.n_threads_batch or n


class _State(enum.Enum):
    OPEN = 1
    CLOSED = 2


_ARCH_FORMATS = {
    "gemma3": "gemma",
    "gemma2": "gemma",
    "gemma": "gemma",
    "llama": "llama3",
    "qwen2": "chatml",
    "qwen3": "chatml",
}


def choose_chat_format(model: ModelFile, requested: str | None, bos: str, eos: str) -> ChatFormat:
    """The GGUF's own template when present (unless a built-in is asked for by name)."""
    if requested is None and model.info.chat_template:
        return ChatFormat("gguf", model.info.chat_template, bos_token=bos, eos_token=eos)
    name = requested or _ARCH_FORMATS.get(model.info.architecture, "chatml")
    return ChatFormat.builtin(name, bos_token=bos, eos_token=eos)


_NO_ABORT = llama_cpp.ggml_abort_callback(0)  # NULL: llama.cpp checks for no callback


def _owned(
    action: Callable[Concatenate[LlamaCppBackend, _P], _T],
) -> Callable[Concatenate[LlamaCppBackend, _P], _T]:
    """An action on the context: applied by the loop that owns it, if one does
    (:meth:`LlamaCppBackend.owned_by`); from another thread, as a command of that loop."""

    @functools.wraps(action)
    def act(self: LlamaCppBackend, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        owner = self._owner
        if owner is not None and owner[0] != threading.get_ident():
            return owner[1].apply(functools.partial(action, self, *args, **kwargs))
        return action(self, *args, **kwargs)

    return act


class LlamaCppBackend:
    """One llama.cpp context with one resident sequence (seq 0)."""

    def __init__(
        self, model: ModelFile, config: LlamaConfig | None = None, *, weights: Weights | None = None
    ) -> None:
        self.model = model
        self.config = config or LlamaConfig()
        n_threads, n_threads_batch = self.config.threads()
        if self.config.n_ctx < 16:
            raise InvalidRequest(f"n_ctx must be at least 16, got {self.config.n_ctx}")
        check_draft("draft", self.config.draft)
        install_log_route()
        self._weights = weights.acquire() if weights is not None else Weights.open(model.path)
        self._model = self._weights.ptr
        cparams = llama_cpp.llama_context_default_params()
        streams = 1 if self.config.unified else self.config.n_seq_max
        cparams.n_ctx = self.config.n_ctx * streams
        cparams.n_batch = cparams.n_ubatch = self.config.n_batch
        cparams.n_seq_max = self.config.n_seq_max
        cparams.kv_unified = self.config.unified  # sequences share cells: prefix sharing
        cparams.n_threads, cparams.n_threads_batch = n_threads, n_threads_batch
        cparams.flash_attn_type = 0  # off: faster for Gemma 3 on CPU (DESIGN.md §7)
        cparams.swa_full = True  # a full-size SWA cache can be truncated at any position
        self._kv_types = (ggml_type_name(cparams.type_k), ggml_type_name(cparams.type_v))
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self._weights.release()
            raise BackendError(
                f"llama.cpp could not create a context of {self.config.n_ctx} tokens; "
                "lower n_ctx or free memory"
            )
        self.n_threads, self.n_threads_batch = n_threads, n_threads_batch
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_ctx = llama_cpp.llama_n_ctx_seq(self._ctx)  # one sequence's room
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        # llama.cpp clamps n_batch to the requested n_ctx (before padding n_ctx): read it back
        self.n_batch = min(llama_cpp.llama_n_batch(self._ctx), llama_cpp.llama_n_ubatch(self._ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._seqs: dict[int, list[int]] = {s: [] for s in range(self.config.n_seq_max)}
        self.exactness = ExactLedger(streams=not self.config.unified)
        self.draft_stats = DraftStats()  # what drafting did, over every reply
        self.draft_sources = DraftSources()  # what generate()'s replies draft from
        self.verify_cost = VerifyCost()  # what a call of k rows costs here, timed as drafts run
        self._copies_pending = False  # stream copies llama.cpp applies at the next decode
        self._state = _State.OPEN
        self._deadline = 0.0
        self._interrupted = False  # interrupt(): decodes refuse to start (the server closes)
        # (the one thread acting on the context, the guard its loop steps under) while owned
        self._owner: tuple[int, ContextGuard] | None = None
        self._abort = llama_cpp.ggml_abort_callback(lambda _: time.monotonic() > self._deadline)
        self.bos_id = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos_id = llama_cpp.llama_vocab_eos(self._vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        bos = self.piece(self.bos_id, special=True).decode("utf-8", "replace")
        eos = self.piece(self.eos_id, special=True).decode("utf-8", "replace")
        self.chat_format = choose_chat_format(model, self.config.chat_format, bos, eos)
        self.bos_text = bos

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        self._weights.release()

    def sibling(self, config: LlamaConfig) -> LlamaCppBackend:
        """Another context on this backend's weights (no second load); either may close first."""
        self._check_open()
        return LlamaCppBackend(self.model, config, weights=self._weights)

    def __enter__(self) -> LlamaCppBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise SessionClosed("backend")

    def owned_by(self, guard: ContextGuard | None) -> None:
        """From a step loop's thread as it starts (``guard``: the guard it steps under) or
        ends (None): while it runs, only its thread acts on the context (decodes, truncates,
        copies, saves or restores a sequence); another thread's action is a command the loop
        applies between its steps (:meth:`ContextGuard.apply`)."""
        self._owner = (threading.get_ident(), guard) if guard is not None else None

    # -- vocabulary ------------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Tokens of ``text`` with no BOS added; special-token text is parsed when ``special``."""
        self._check_open()
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, False, special)
            if n < 0:
                raise BackendError(f"llama.cpp could not tokenize {len(data)} bytes of text")
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int] | tuple[int, ...]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # -- sequences ------------------------------------------------------------------------------
    @property
    def tokens(self) -> list[int]:
        """The tokens whose KV is in sequence 0 (the stateful worker's sequence)."""
        return self._seqs[0]

    def seq_tokens(self, seq: int) -> list[int]:
        return self._seqs[seq]

    def exact_tokens(self, seq: int) -> int:
        """How many of ``seq``'s first tokens a cold decode would have given the same KV."""
        return self.exactness.exact(seq)

    def _seq_rm(self, seq: int, p0: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, -1):
            # some caches (recurrent, non-full SWA) cannot truncate: the caller rebuilds
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._seqs[seq] = []
            self.exactness.cut(seq, 0)
            raise BackendError("this model's cache cannot be truncated; the sequence was cleared")

    @_owned
    def truncate(self, n: int, seq: int = 0) -> None:
        """Drop KV for positions >= n of ``seq`` (never inserts into the causal past)."""
        self._check_open()
        if n >= len(self._seqs[seq]):
            return
        self._seq_rm(seq, max(n, 0))
        del self._seqs[seq][max(n, 0) :]
        self.exactness.cut(seq, n)

    @_owned
    def clear(self) -> None:
        """Drop every sequence."""
        self._check_open()
        llama_cpp.llama_memory_clear(self._mem, True)
        for seq, toks in self._seqs.items():
            toks.clear()
            self.exactness.cut(seq, 0)

    def clear_seq(self, seq: int) -> None:
        self.truncate(0, seq)

    @_owned
    def copy_seq(self, src: int, dst: int, n: int) -> None:
        """Make ``dst`` hold the first ``n`` positions of ``src``. In a unified KV cache the cells
        are shared, not copied: no decode, no extra memory. With a KV stream per sequence,
        llama.cpp copies ``src``'s whole stream into ``dst``'s at the next ``llama_decode`` (a
        tensor copy: milliseconds, where a state save and load of 8k tokens takes hundreds),
        then ``dst`` drops what is past ``n``; a state save or load before that decode first
        makes the copy happen (:meth:`_settle_copies`)."""
        self._check_open()
        if src == dst or not 0 < n <= len(self._seqs[src]):
            raise BackendError(
                f"cannot copy {n} positions of a {len(self._seqs[src])}-token seq {src} to {dst}"
            )
        self.clear_seq(dst)
        if self.config.unified:
            llama_cpp.llama_memory_seq_cp(self._mem, src, dst, 0, n)
        else:  # llama.cpp copies streams whole (a partial range would abort the process)
            llama_cpp.llama_memory_seq_cp(self._mem, src, dst, -1, -1)
            self._copies_pending = True
            self._seq_rm(dst, n)
        self._seqs[dst] = self._seqs[src][:n]
        self.exactness.copied(src, dst, n)

    def _settle_copies(self) -> None:
        """Make the stream copies llama.cpp holds for the next decode happen now: decode one
        token after the shortest sequence (the cheapest call) and drop it again. Nothing
        resident changes; only the logits of the last decode are overwritten."""
        if not self._copies_pending:
            return
        seq = min(self._seqs, key=lambda s: len(self._seqs[s]))
        n = len(self._seqs[seq])
        self.decode(self._seqs[seq][-1:] or [0], seq)
        self.truncate(n, seq)

    @_owned
    def decode(
        self, tokens: list[int] | tuple[int, ...], seq: int = 0, *, deadline: float | None = None
    ) -> tuple[Logits | None, float]:
        """Append ``tokens`` to ``seq``; return the logits after the last one and the
        milliseconds spent inside ``llama_decode``. The logits are a view of llama.cpp's
        buffer, valid until the next decode on this context: ``.copy()`` them to keep them
        (:meth:`decode_many` returns copies). Past ``deadline`` (a ``time.monotonic()``
        value) llama.cpp stops mid-graph and :class:`DecodeAborted` is raised, with ``seq``
        as it was before the chunk that was stopped."""
        self._check_open()
        if not tokens:
            return None, 0.0
        mine = self._seqs[seq]
        if len(mine) + len(tokens) > self.n_ctx:
            raise ContextOverflow(len(mine) + len(tokens), self.n_ctx, "the sequence")
        b = self._batch
        spent = 0.0
        for start, stop in _chunks(len(tokens), self.n_batch):
            chunk = tokens[start:stop]
            n_past = len(mine)
            for i, tok in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = False
            b.logits[len(chunk) - 1] = True
            b.n_tokens = len(chunk)
            rc, ms = self._llama_decode(b, deadline)
            spent += ms
            if rc != 0:
                # a stopped or failed chunk may leave cells behind: drop whatever is past n_past
                llama_cpp.llama_memory_seq_rm(self._mem, seq, n_past, -1)
                if rc == 2:
                    raise DecodeAborted(len(chunk), n_past)
                if rc == 1:
                    raise KVCacheFull(
                        f"no free KV cells for {len(chunk)} tokens at position {n_past}"
                    )
                raise BackendError(f"llama_decode returned {rc} at position {n_past}")
            mine.extend(chunk)
            self.exactness.decoded(seq, n_past, len(chunk), len(chunk))
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        return logits, spent

    def decode_rows(self, tokens: Sequence[int], seq: int = 0) -> np.ndarray:
        """Append ``tokens`` to ``seq`` in ONE ``llama_decode`` and return the logits after
        each of them, a ``(len(tokens), n_vocab)`` copy: what verifying a draft needs (row
        ``i`` scores the token after ``tokens[i]``). At most ``n_batch`` tokens. If the decode
        fails, ``seq`` is as it was and the error is raised."""
        if not 0 < len(tokens) <= self.n_batch:
            raise InvalidRequest(f"decode_rows takes 1..{self.n_batch} tokens, got {len(tokens)}")
        return self.decode_rows_many([(seq, tokens)])[0]

    def decode_many(self, items: Sequence[tuple[int, Sequence[int], bool]]) -> list[Logits | None]:
        """Append each item's tokens to its sequence, all in ONE ``llama_decode`` (continuous
        batching): ``(seq, tokens, want_logits)``, each sequence at most once, n_batch tokens
        in all. Returns, per item, a copy of the logits after its last token (or None). If the
        decode fails, every sequence is as it was and the error is raised."""
        rows = self._decode_items([(seq, tokens, 1 if want else 0) for seq, tokens, want in items])
        return [r[0] if r is not None else None for r in rows]

    def decode_rows_many(self, items: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        """:meth:`decode_rows` for several sequences in ONE ``llama_decode``: per item
        ``(seq, tokens)``, the logits after each of its tokens (drafts of several replies
        verified together). Items of one length make equal ubatches on a context with a KV
        stream per sequence (one pass over the weights)."""
        rows = self._decode_items([(seq, tokens, len(tokens)) for seq, tokens in items])
        return [r for r in rows if r is not None]

    @_owned
    def _decode_items(
        self, items: Sequence[tuple[int, Sequence[int], int]]
    ) -> list[np.ndarray | None]:
        """One ``llama_decode`` of ``(seq, tokens, rows wanted at the end)`` items; per item, a
        copy of those rows' logits (None for none)."""
        self._check_open()
        seqs = [seq for seq, _, _ in items]
        total = sum(len(t) for _, t, _ in items)
        if len(set(seqs)) != len(seqs) or not 0 < total <= self.n_batch:
            raise BackendError(
                f"decode_many: {total} tokens in {len(items)} items, sequences {seqs}: one "
                f"item per sequence, 1..{self.n_batch} tokens in all"
            )
        b, i, firsts = self._batch, 0, []
        for seq, tokens, want in items:
            n_past = len(self._seqs[seq])
            if not tokens or n_past + len(tokens) > self.n_ctx:
                raise ContextOverflow(n_past + len(tokens), self.n_ctx, f"sequence {seq}")
            for j, tok in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i] = tok, n_past + j, 1
                b.logits[i] = j >= len(tokens) - want
                b.seq_id[i][0] = seq
                i += 1
            firsts.append(i - want)
        b.n_tokens = total
        rc, _ = self._llama_decode(b)
        if rc != 0:
            for seq in seqs:
                llama_cpp.llama_memory_seq_rm(self._mem, seq, len(self._seqs[seq]), -1)
            if rc == 1:
                raise KVCacheFull(f"no free KV cells for a batch of {total} tokens")
            raise BackendError(f"llama_decode returned {rc} for a batch of {total} tokens")
        out: list[np.ndarray | None] = []
        for (seq, tokens, want), k in zip(items, firsts, strict=True):
            rows = total if want <= 1 else len(tokens)  # a draft's rows: its own ubatch share
            self.exactness.decoded(seq, len(self._seqs[seq]), len(tokens), rows)
            self._seqs[seq].extend(tokens)
            out.append(self._rows(k, want) if want else None)
        return out

    def _rows(self, first: int, n: int) -> np.ndarray:
        """A copy of ``n`` output rows' logits from batch index ``first`` on (rows kept in
        batch order: the i-th wanted row is output row i)."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, first)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).copy()

    def interrupt(self) -> None:
        """From now on every decode raises :class:`ShuttingDown` before it starts, until
        :meth:`resume`: a job still running stops at its next ``llama_decode`` call (a generated
        token, a prompt chunk or a batch step), and nothing of that call stays resident."""
        self._interrupted = True

    def resume(self) -> None:
        self._interrupted = False

    def _llama_decode(
        self, batch: llama_cpp.llama_batch, deadline: float | None = None
    ) -> tuple[int, float]:
        """``llama_decode`` on the process's compute thread: (return code, ms inside it). The
        abort callback is installed only for a call with a deadline: ggml calls it between
        graph nodes, and a Python callback there would slow every other decode."""
        if self._interrupted:
            raise ShuttingDown()

        def run() -> tuple[int, float]:
            t0 = time.perf_counter()
            if deadline is not None:
                self._deadline = deadline
                llama_cpp.llama_set_abort_callback(self._ctx, self._abort, None)
            try:
                rc = llama_cpp.llama_decode(self._ctx, batch)
                if rc >= 0:  # past llama.cpp's batch checks: pending stream copies applied
                    self._copies_pending = False
            finally:
                if deadline is not None:
                    llama_cpp.llama_set_abort_callback(self._ctx, _NO_ABORT, None)
            return int(rc), (time.perf_counter() - t0) * 1000.0

        return on_compute_thread(run)

    # -- sampling ----------------------------------------------------------------------------
    def generate(
        self,
        logits: Logits,
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        seq: int = 0,
        tenant: str = "",
    ) -> GenOut:
        """Sample from ``logits`` and keep decoding into ``seq`` (for ``tenant``: with
        drafting on, its earlier replies are drafted from; ``""``, none) until an end-of-generation
        token, a stop string, ``max_tokens`` or the end of the context. Every generated token
        but the last is decoded (it stays resident); the end-of-generation token is not. A
        reply cut at a stop string keeps the text before it: the generated tokens inside that
        text stay resident, the text's tail in a token that crossed the cut is tokenized anew
        (not resident), and the stop string's tokens are dropped from the KV.
        ``on_text`` receives text as it becomes final (held back while it could start a stop
        string); if it raises, generation stops and the exception propagates."""
        grammar = self.grammar_for(params)
        try:
            d = Decoding(self, params, grammar=grammar, on_text=on_text, t0=t0, seq=seq)
            tok = d.start(logits)
            if self.config.draft and grammar is None:
                length = DraftLength(self.config.draft, cost=self.verify_cost)
                sources = self.draft_sources
                self.draft_stats.add(drafted_reply(self, d, tok, seq, length, sources, tenant))
                return d.result()
            while tok is not None:
                step, _ = self.decode([tok], seq)
                assert step is not None
                tok = d.step(step)
            return d.result()
        finally:
            if grammar is not None:
                grammar.close()

    def grammar_for(self, params: GenerationParams) -> GrammarSampler | None:
        """The grammar sampler a reply with these parameters needs (the caller closes it)."""
        if params.constraint is None:
            return None
        tagged = self.chat_format.tool_call_tags
        return grammar_sampler(params.constraint, self._vocab, self.n_vocab, tagged, self.tokenize)

    # -- state snapshots ---------------------------------------------------------------------
    @_owned
    def save_state(self, seq: int = 0) -> bytes:
        """The KV state of ``seq`` as bytes (``llama_state_seq_get_data``)."""
        self._check_open()
        self._settle_copies()
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, seq)
        if n != size:
            raise BackendError(f"llama_state_seq_get_data wrote {n} of {size} bytes")
        return bytes(buf)

    @_owned
    def load_state(
        self, data: bytes, tokens: list[int] | tuple[int, ...], seq: int = 0, exact: int = 0
    ) -> None:
        """Replace ``seq`` with a saved state holding exactly ``tokens``, of which the first
        ``exact`` are known exact (:mod:`continuum.backends.exactness`)."""
        self._check_open()
        self._settle_copies()
        self.clear_seq(seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        n = llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), seq)
        if n == 0:
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            raise BackendError("llama_state_seq_set_data rejected the snapshot")
        pos_max = llama_cpp.llama_memory_seq_pos_max(self._mem, seq)
        if pos_max != len(tokens) - 1:
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            raise BackendError(
                f"restored snapshot holds {pos_max + 1} positions, expected {len(tokens)}"
            )
        self._seqs[seq] = list(tokens)
        self.exactness.restored(seq, min(exact, len(tokens)))

    def context_config(self) -> dict[str, object]:
        """What a KV snapshot depends on besides the model: checked before a restore. A
        snapshot records it in its header; one written under any other value (another
        llama.cpp build, other cache types) is refused and the session rebuilt."""
        return {
            "llama_build": build_id(),
            "type_k": self._kv_types[0],
            "type_v": self._kv_types[1],
            "swa_full": True,
            "flash_attn": False,
            # a sequence's state carries its cache's stream count: llama.cpp refuses another
            "kv_streams": 1 if self.config.unified else self.config.n_seq_max,
        }
