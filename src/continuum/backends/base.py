"""The backend contract: what the engine and stateful sessions may ask of a backend.

Two protocols, one per kind of caller, and the capability flags that say which a backend offers:

- :class:`OpBackend` — the reuse stack's view: ops in (token ids, or the messages/prompt they
  were made from), a :class:`Generation` out. Every backend implements it, local or remote.
- :class:`KVBackend` — an ``OpBackend`` whose KV state the prefix and layer tiers may pin into
  slots, copy and snapshot (``Capabilities.kv_snapshots``).
- :class:`RoutedBackend` — an ``OpBackend`` that forwards to a server behind a router, and so
  takes each op's :class:`RequestRoute` (its tenant and conversation) (``Capabilities.routed``).
- :class:`SequenceBackend` — stateful sessions' view: a tokenizer and chat format, and resident
  sequences addressed by id that can be extended, truncated, sampled from, saved and restored
  (``Capabilities.resident_sequences``). :class:`SequenceView` binds one sequence id so a
  session never names the id it runs on.

A backend knows nothing of tiers, sessions or messages beyond rendering them (DESIGN.md §2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from continuum.messages import Message
from continuum.params import GenerationParams

if TYPE_CHECKING:
    from continuum.backends.chat_format import ChatFormat
    from continuum.backends.models import ModelFile

Logits = npt.NDArray[np.float32]

# llama.cpp's 1-7-token kernels differ numerically from its batched ones: a batch of >= 8
# tokens gives bit-identical KV however a prompt is chunked, so reuse keeps at least this many
# tokens in the last batch of any prompt it completes (DESIGN.md §3.4)
MIN_BATCH = 8


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can do beyond generating; the engine wires tiers by these, not by type."""

    resident_sequences: bool = False  # stateful sessions can live in it (SequenceBackend)
    kv_snapshots: bool = False  # its KV can be pinned, copied and serialised (KVBackend)
    server_prefix_cache: bool = False  # a remote server reuses prefixes itself (cached_tokens)
    tokenizer: bool = False  # token ids are the model's own (else a stand-in for keys)
    renders_tools: bool = False  # OpenAI tools go into the prompt through its chat template
    constrained: bool = False  # honours GenerationParams.constraint (a grammar, in llama.cpp)
    routed: bool = False  # generate takes route= (a remote server's router and cache salt)


@runtime_checkable
class Interruptible(Protocol):
    """A backend whose running work can be stopped from another thread (a server closing):
    after :meth:`interrupt` its decodes raise :class:`~continuum.errors.ShuttingDown` until
    :meth:`resume`."""

    def interrupt(self) -> None: ...
    def resume(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RequestRoute:
    """Whose op this is and which conversation it belongs to, for a remote server's router and
    prefix-cache partition. Routing only: no key holds it and it never changes the answer.

    ``namespace`` is the tenant the credentials name (DESIGN.md §3.8), ``""`` when none is;
    ``session`` is the conversation's own name (a session hint), or None."""

    namespace: str = ""
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Generation:
    """What a backend produced for one op, and what it cost."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    evaluated: int  # prompt tokens the backend decoded (prompt_tokens_evaluated)
    reused: int  # prompt tokens served from reused state (tokens_reused)
    ttft_ms: float
    total_ms: float
    reused_known: bool = True  # False: the server did not say what it reused


@dataclass(frozen=True, slots=True)
class GenOut:
    """What sampling into a resident sequence produced."""

    text: str
    tokens: tuple[int, ...]
    finish_reason: str  # "stop" | "length"
    ttft_ms: float


@runtime_checkable
class OpBackend(Protocol):
    """What the reuse stack needs from a backend."""

    name: str
    model_identity: str  # the model file's digest (or the remote model's stated identity)
    capabilities: Capabilities

    def prompt_tokens(
        self,
        messages: Sequence[Message] | None,
        prompt: str | None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The prompt's tokens; ``tools`` are rendered by the chat template (a backend that
        declares ``renders_tools``), else refused by the engine before this is called."""
        ...

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
        """Generate for ``tokens`` (an in-process backend) or for the ``messages``/``prompt``
        they were made from (a remote backend, which always receives the whole request)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class KVBackend(OpBackend, Protocol):
    """An op backend whose KV state the prefix and layer tiers can pin, copy and snapshot."""

    n_slots: int

    def free_slots(self) -> int: ...
    def pin(self, n_tokens: int) -> int | None: ...
    def release(self, slot: int) -> None: ...
    def load_slot(self, slot: int, n_tokens: int) -> None: ...
    def slot_tokens(self, slot: int) -> list[int]: ...
    def snapshot(self, slot: int) -> bytes: ...
    def restore(self, payload: bytes, tokens: Sequence[int], n_tokens: int) -> None: ...
    def context_config(self) -> dict[str, Any]: ...
    def resident_tokens(self) -> int: ...
    def drop_working(self) -> None: ...
    def working_tokens(self) -> list[int]: ...


@runtime_checkable
class RoutedBackend(OpBackend, Protocol):
    """An op backend in front of a router: ``generate`` also takes the op's route."""

    def generate(
        self,
        tokens: Sequence[int],
        params: GenerationParams,
        *,
        reuse: int = 0,
        on_text: Callable[[str], None] | None = None,
        messages: Sequence[Message] | None = None,
        prompt: str | None = None,
        route: RequestRoute | None = None,
    ) -> Generation: ...


@runtime_checkable
class SequenceBackend(Protocol):
    """Resident sequences in one context, plus the vocabulary and template to fill them."""

    model: ModelFile
    n_ctx: int
    add_bos: bool
    bos_id: int
    chat_format: ChatFormat

    def tokenize(self, text: str, *, special: bool = True) -> list[int]: ...
    def detokenize(self, tokens: list[int] | tuple[int, ...]) -> str: ...
    def piece(self, token: int, *, special: bool = False) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...
    def seq_tokens(self, seq: int) -> list[int]: ...
    def exact_tokens(self, seq: int) -> int: ...
    def truncate(self, n: int, seq: int = 0) -> None: ...
    def clear_seq(self, seq: int) -> None: ...
    def copy_seq(self, src: int, dst: int, n: int) -> None: ...
    def decode(
        self, tokens: list[int] | tuple[int, ...], seq: int = 0
    ) -> tuple[Logits | None, float]: ...
    def generate(
        self,
        logits: Logits,
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        seq: int = 0,
        tenant: str = "",
    ) -> GenOut: ...
    def save_state(self, seq: int = 0) -> bytes: ...
    def load_state(
        self, data: bytes, tokens: list[int] | tuple[int, ...], seq: int = 0, exact: int = 0
    ) -> None: ...
    def context_config(self) -> dict[str, object]: ...
    def close(self) -> None: ...


class SequenceView:
    """One resident sequence of a :class:`SequenceBackend`, by id.

    Invariant (inherited from the backend): ``tokens`` is exactly the token sequence whose KV
    is in this sequence, positions ``0..len(tokens)-1``."""

    __slots__ = ("backend", "seq", "started", "tenant")

    def __init__(self, backend: SequenceBackend, seq: int) -> None:
        self.backend = backend
        self.seq = seq
        self.tenant = ""  # whose prompts these are (a batch scheduler shares steps by it)
        self.started = 0.0  # when their program began (time.monotonic(): prefill_share "age")

    @property
    def tokens(self) -> list[int]:
        return self.backend.seq_tokens(self.seq)

    @property
    def exact(self) -> int:
        """How many of its first tokens a cold decode would have given the same KV
        (:mod:`continuum.backends.exactness`)."""
        return self.backend.exact_tokens(self.seq)

    def decode(self, tokens: list[int] | tuple[int, ...]) -> tuple[Logits | None, float]:
        return self.backend.decode(tokens, self.seq)

    def truncate(self, n: int) -> None:
        self.backend.truncate(n, self.seq)

    def clear(self) -> None:
        self.backend.clear_seq(self.seq)

    def copy_from(self, other: SequenceView, n: int) -> None:
        """Hold the first ``n`` tokens of ``other`` (a sequence of the same context)."""
        self.backend.copy_seq(other.seq, self.seq, n)

    def generate(
        self,
        logits: Logits,
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
    ) -> GenOut:
        b = self.backend
        return b.generate(logits, params, on_text=on_text, t0=t0, seq=self.seq, tenant=self.tenant)

    def reply(
        self,
        tokens: list[int] | tuple[int, ...],
        params: GenerationParams,
        *,
        on_text: Callable[[str], None] | None = None,
        t0: float | None = None,
        yields: bool = False,
    ) -> tuple[GenOut, float]:
        """Decode ``tokens`` (at least one), then generate from their logits; the reply and
        the prefill's milliseconds. ``yields``: where decodes are batched with other
        sequences' replies, the prompt keeps to their inter-token budget (a stateless
        request's; see :mod:`continuum.backends.step_plan`)."""
        logits, prefill_ms = self.decode(tokens)
        assert logits is not None
        return self.generate(logits, params, on_text=on_text, t0=t0), prefill_ms

    def withdraw(self) -> bool:
        """Take back a decode that is waiting for a batch step; a direct view never waits."""
        return False

    def save_state(self) -> bytes:
        return self.backend.save_state(self.seq)

    def load_state(self, data: bytes, tokens: list[int] | tuple[int, ...], exact: int = 0) -> None:
        self.backend.load_state(data, tokens, self.seq, exact)
