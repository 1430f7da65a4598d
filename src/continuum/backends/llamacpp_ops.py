"""The in-process llama.cpp backend for the reuse stack: ops in, generations out.

It runs on a :class:`LlamaCppBackend` context that it may share with stateful sessions (the
engine loads one model and creates one context). Of that context's sequences it owns a *working*
sequence every op decodes into and a set of *slots* that pin the KV of earlier prompts. Pinning
copies no data: in a unified cache a cell can belong to several sequences, so
``llama_memory_seq_cp`` only adds a sequence id to the prompt's cells. Loading a slot into the
working sequence is the same operation the other way round. The engine's prefix KV tier decides
what to pin and when to release; this module only does what it is told.

Built with ``lanes`` > 1 it owns the one context of a server whose sessions run in lanes: one
KV stream of ``n_ctx`` cells per lane, no slots (a pin would copy a whole stream). An op then
runs in a lane the engine lends it (:meth:`LlamaCppOpBackend.on`): its prompt and reply ride in
the batch steps every session's decodes ride in, so a long stateless prefill shares the steps
instead of stopping the sessions, and nothing else holds KV (one context, one model load).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from continuum.backends.base import Capabilities, Generation, SequenceView
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.progress import Progress
from continuum.errors import ContextOverflow, InvalidRequest
from continuum.messages import Message
from continuum.params import GenerationParams
from continuum.toolcalls import template_messages

CAPABILITIES = Capabilities(
    resident_sequences=True,
    kv_snapshots=True,
    tokenizer=True,
    renders_tools=True,
    constrained=True,
)


def check_lanes(lanes: object) -> int:
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 32:
        raise InvalidRequest(f"lanes must be an int in 1..32, got {lanes!r}")
    return lanes


def check_slots(n_slots: object) -> int:
    if isinstance(n_slots, bool) or not isinstance(n_slots, int) or not 0 <= n_slots <= 62:
        raise InvalidRequest(f"n_slots must be an int in 0..62, got {n_slots!r}")
    return n_slots


@dataclass(frozen=True, slots=True)
class BorrowedContext:
    """A llama.cpp context someone else owns, and the sequences of it an op backend may use:
    ``work_seq`` every op decodes into, ``slot_seqs`` the slots that pin earlier prompts' KV.
    The owner keeps the context open while the backend runs, and closes it."""

    llama: LlamaCppBackend
    work_seq: int = 0
    slot_seqs: Sequence[int] = ()


class LlamaCppOpBackend:
    """Ops on sequences ``work`` and ``slots`` of a llama.cpp context.

    Built from a model, it owns a context of its own: sequence 0 is kept for a resident
    conversation (:meth:`resident_sequence`, the engine's stateful worker), 1 is the working
    sequence and 2..n+1 the slots. Built with ``lanes`` > 1, its context has that many
    sequences, a KV stream each, and no slots; ops run in whichever lane :meth:`on` gives them.
    Built on a context someone else owns (a :class:`BorrowedContext`), it uses the sequence ids
    it is given."""

    name = "llamacpp"
    capabilities = CAPABILITIES

    def __init__(
        self,
        model: str | ModelFile | None = None,
        *,
        config: LlamaConfig | None = None,
        n_slots: int = 7,
        lanes: int = 1,
        unified: bool = True,
        progress: Progress | None = None,
        shared: BorrowedContext | None = None,
    ) -> None:
        """``config``: the settings of the context it makes (a stateful worker's
        ``WorkerConfig.llama``; default ``LlamaConfig()``), its sequence count set here.
        ``unified``: the working sequence and the slots share one unified cache's cells (a pin
        copies nothing); False gives each a KV stream of ``n_ctx`` cells (a pin copies the
        stream), where a prefix hit gives exactly the cold logits — in a unified cache the
        sums depend on which cells a sequence got.
        ``shared``: run on that context instead (``model``, ``config`` and ``progress`` unused)."""
        check_slots(n_slots)
        self.lanes = check_lanes(lanes)
        if lanes > 1 and shared is not None:
            raise InvalidRequest("lanes= makes a context of its own: give it no shared context")
        self._owns_llama = shared is None
        slot_seqs: Sequence[int]
        if shared is None:
            mf = model if isinstance(model, ModelFile) else resolve_model(model, progress)
            config = config if config is not None else LlamaConfig()
            if lanes > 1:
                config = dataclasses.replace(config, n_seq_max=lanes, kv_unified=False)
                work_seq, slot_seqs = 0, ()
            else:
                shares = config.kv_unified if unified else False
                config = dataclasses.replace(config, n_seq_max=n_slots + 2, kv_unified=shares)
                work_seq, slot_seqs = 1, range(2, n_slots + 2)
            llama = LlamaCppBackend(mf, config)
        else:
            llama, work_seq, slot_seqs = shared.llama, shared.work_seq, shared.slot_seqs
        self.llama = llama
        # the lane an op decodes in (lanes > 1), per thread: ops run at once, each in its lane
        self._on = threading.local()
        self.model = llama.model
        self.model_identity = llama.model.digest
        self._work = work_seq
        self._slots = tuple(slot_seqs or ())
        self.n_slots = len(self._slots)
        self._free = list(self._slots[::-1])

    def interrupt(self) -> None:
        """Stop the running work at its next decode (:meth:`LlamaCppBackend.interrupt`)."""
        self.llama.interrupt()

    def resume(self) -> None:
        self.llama.resume()

    @classmethod
    def from_options(cls, **options: Any) -> LlamaCppOpBackend:
        """The backend from the registry's flat keyword options (``Engine.open(n_ctx=4096,
        n_slots=0)``): without a ``config``, ``n_ctx``, ``n_threads`` (prompt processing too)
        and ``chat_format`` make one; ``llama``, ``work_seq`` and ``slot_seqs`` make the
        :class:`BorrowedContext` (none without ``llama``)."""
        context = {k: options.pop(k) for k in ("n_ctx", "chat_format") if k in options}
        threads = options.pop("n_threads", None)
        if options.get("config") is None and (context or threads is not None):
            options["config"] = LlamaConfig(**context, n_threads=threads, n_threads_batch=threads)
        seqs = {k: options.pop(k) for k in ("llama", "work_seq", "slot_seqs") if k in options}
        if seqs.get("llama") is None:
            return cls(**options)
        return cls(shared=BorrowedContext(**seqs), **options)

    def close(self) -> None:
        if self._owns_llama:
            self.llama.close()

    def resident_sequence(self) -> tuple[LlamaCppBackend, int]:
        """The context and the sequence a resident conversation may live in (one model load,
        one context for stateful sessions and ops alike)."""
        if not self._owns_llama:
            raise InvalidRequest("this backend runs on a shared context: ask its owner")
        return self.llama, 0

    @property
    def view(self) -> SequenceView | None:
        """The lane this thread's op decodes in (:meth:`on`), None outside one."""
        return getattr(self._on, "view", None)

    @property
    def work(self) -> int:
        """The working sequence of this thread's op: its lane's, else the backend's own."""
        view = self.view
        return view.seq if view is not None else self._work

    @contextmanager
    def on(self, view: SequenceView) -> Iterator[None]:
        """Run this thread's ops of the block in ``view`` (a lane of this backend's context):
        its sequence is the working sequence, and its decodes go where the view sends them (a
        batch scheduler's steps). Ops on other threads run in lanes of their own meanwhile."""
        if view.backend is not self.llama:
            raise InvalidRequest("a lane of another context cannot run this backend's ops")
        prev = self.view
        self._on.view = view
        try:
            yield
        finally:
            self._on.view = prev

    # -- input -----------------------------------------------------------------------------------
    def prompt_tokens(
        self,
        messages: Sequence[Message] | None,
        prompt: str | None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        b = self.llama
        if messages is not None:
            fitted = b.chat_format.fit_systems(list(messages))
            text = b.chat_format.render(
                template_messages(fitted), add_generation_prompt=True, tools=tools
            )
        else:
            assert prompt is not None
            text = prompt
        tokens = b.tokenize(text)
        if b.add_bos and tokens[:1] != [b.bos_id]:
            tokens.insert(0, b.bos_id)
        return tokens

    # -- generation --------------------------------------------------------------------------------
    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        reuse: int = 0,
        on_text: Callable[[str], None] | None = None,
        messages: Sequence[Message] | None = None,
        prompt: str | None = None,
    ) -> Generation:
        """Decode ``tokens[reuse:]`` after the ``reuse`` tokens already in the working sequence,
        then generate. ``reuse == 0`` is a cold call."""
        t0 = time.perf_counter()
        b = self.llama
        work = b.seq_tokens(self.work)
        if reuse > 0 and list(work[:reuse]) != list(tokens[:reuse]):
            raise InvalidRequest("the working sequence does not hold the claimed prefix")
        if len(tokens) + 1 >= b.n_ctx:
            raise ContextOverflow(len(tokens) + 1, b.n_ctx)
        b.truncate(reuse, self.work)
        view = self.view or SequenceView(b, self.work)
        out, _ = view.reply(list(tokens[reuse:]), params, on_text=on_text, t0=t0, yields=True)
        return Generation(
            text=out.text,
            tokens=out.tokens,
            finish_reason=out.finish_reason,
            prompt_tokens=len(tokens),
            evaluated=len(tokens) - reuse,
            reused=reuse,
            ttft_ms=out.ttft_ms,
            total_ms=(time.perf_counter() - t0) * 1000.0,
        )

    # -- KV slots (used by the engine's prefix KV and layer KV tiers) -----------------------------
    def free_slots(self) -> int:
        return len(self._free)

    def pin(self, n_tokens: int) -> int | None:
        """Pin the working sequence's first ``n_tokens`` positions in a free slot."""
        if not self._free:
            return None
        slot = self._free.pop()
        self.llama.copy_seq(self.work, slot, n_tokens)
        return slot

    def release(self, slot: int) -> None:
        self.llama.clear_seq(slot)
        self._free.append(slot)

    def load_slot(self, slot: int, n_tokens: int) -> None:
        """Make the working sequence hold the slot's first ``n_tokens`` positions (a slot that
        is the working sequence itself — an op's lane holding what the last op left — is cut
        there)."""
        if slot == self.work:
            self.llama.truncate(n_tokens, self.work)
        else:
            self.llama.copy_seq(slot, self.work, n_tokens)

    def slot_tokens(self, slot: int) -> list[int]:
        return self.llama.seq_tokens(slot)

    def snapshot(self, slot: int) -> bytes:
        return self.llama.save_state(slot)

    def restore(self, payload: bytes, tokens: Sequence[int], n_tokens: int) -> None:
        """Load a snapshot of ``tokens`` into the working sequence and keep ``n_tokens`` (a
        prefix the snapshot's writer kept exact, where that matters: an exact engine stores
        no other)."""
        self.llama.load_state(payload, list(tokens), self.work, exact=n_tokens)
        self.llama.truncate(n_tokens, self.work)

    def context_config(self) -> dict[str, Any]:
        return self.llama.context_config()

    def resident_tokens(self) -> int:
        """An upper bound on the context cells the working sequence and the slots hold (cells
        shared between them are counted once per sequence)."""
        seqs = [self.work, *(s for s in self._slots if s not in self._free)]
        return sum(len(self.llama.seq_tokens(s)) for s in seqs)

    def working_tokens(self) -> list[int]:
        """The tokens whose KV the working sequence holds (the last op's prompt and reply)."""
        return self.llama.seq_tokens(self.work)

    def drop_working(self) -> None:
        """Free the working sequence's cells (the engine needs the room for a session)."""
        self.llama.clear_seq(self.work)
