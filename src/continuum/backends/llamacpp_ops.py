"""The in-process llama.cpp backend for the reuse stack: ops in, generations out.

One llama.cpp context with a unified KV cache and several sequences. Sequence 0 is the working
sequence every op decodes into; sequences 1..n_slots are *slots* that pin the KV of earlier
prompts. Pinning copies no data: in a unified cache a cell can belong to several sequences, so
``llama_memory_seq_cp`` only adds a sequence id to the prompt's cells. Loading a slot into
sequence 0 is the same operation the other way round. The engine's prefix KV tier decides what
to pin and when to release; this module only does what it is told.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile, Progress, resolve_model
from continuum.backends.registry import Generation
from continuum.errors import InvalidRequest
from continuum.messages import Message
from continuum.params import GenerationParams

WORK = 0


class LlamaCppOpBackend:
    name = "llamacpp"

    def __init__(
        self,
        model: str | ModelFile | None = None,
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        n_slots: int = 7,
        chat_format: str | None = None,
        progress: Progress | None = None,
    ) -> None:
        if isinstance(n_slots, bool) or not isinstance(n_slots, int) or not 0 <= n_slots <= 63:
            raise InvalidRequest(f"n_slots must be an int in 0..63, got {n_slots!r}")
        mf = model if isinstance(model, ModelFile) else resolve_model(model, progress)
        self.model = mf
        self.model_identity = mf.digest
        self.llama = LlamaCppBackend(
            mf,
            LlamaConfig(
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                chat_format=chat_format,
                n_seq_max=n_slots + 1,
            ),
        )
        self.n_slots = n_slots
        self._free = list(range(n_slots, 0, -1))
        # what the model actually evaluated, newest last: (prompt tokens, tokens reused)
        self.seen: deque[tuple[tuple[int, ...], int]] = deque(maxlen=256)

    def close(self) -> None:
        self.llama.close()

    # -- input -----------------------------------------------------------------------------------
    def prompt_tokens(self, messages: Sequence[Message] | None, prompt: str | None) -> list[int]:
        b = self.llama
        if messages is not None:
            text = b.chat_format.render(list(messages), add_generation_prompt=True)
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
        work = b.seq_tokens(WORK)
        if reuse > 0 and list(work[:reuse]) != list(tokens[:reuse]):
            raise InvalidRequest("the working sequence does not hold the claimed prefix")
        b.truncate(reuse, WORK)
        if len(tokens) + 1 >= b.n_ctx:
            from continuum.errors import ContextOverflow

            raise ContextOverflow(len(tokens) + 1, b.n_ctx)
        logits, _ = b.decode(list(tokens[reuse:]), WORK)
        assert logits is not None
        self.seen.append((tuple(tokens), reuse))
        out = b.generate(logits, params, on_text=on_text, t0=t0, seq=WORK)
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
        self.llama.copy_seq(WORK, slot, n_tokens)
        return slot

    def release(self, slot: int) -> None:
        self.llama.clear_seq(slot)
        self._free.append(slot)

    def load_slot(self, slot: int, n_tokens: int) -> None:
        """Make the working sequence hold the slot's first ``n_tokens`` positions."""
        self.llama.copy_seq(slot, WORK, n_tokens)

    def slot_tokens(self, slot: int) -> list[int]:
        return self.llama.seq_tokens(slot)

    def snapshot(self, slot: int) -> bytes:
        return self.llama.save_state(slot)

    def restore(self, payload: bytes, tokens: Sequence[int], n_tokens: int) -> None:
        """Load a snapshot of ``tokens`` into the working sequence and keep ``n_tokens``."""
        self.llama.load_state(payload, list(tokens), WORK)
        self.llama.truncate(n_tokens, WORK)

    def context_config(self) -> dict[str, Any]:
        return self.llama.context_config()
