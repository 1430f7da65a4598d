"""The semantic tier's verifier: an instruct model asked whether two requests are the same.

Similarity only proposes a candidate (DESIGN.md §3.12). Before the tier serves a stored result
for a new request, :class:`JudgeVerifier` asks a chat model — by default the bundled
Qwen2.5-Coder-0.5B-Instruct — whether one answer would be correct for both requests, and serves
the result only when the model says yes clearly enough.

How it judges. An instruction with a few worked examples stays resident in the judge's own
small llama.cpp context (on the serving backend's weights when it runs the same model file: no
second load). A judgment truncates back to that prefix and decodes only the two requests and
the question, about 50 tokens, then reads the margin ``logit(yes) - logit(no)`` at the first
position of the answer. A candidate is accepted when ``margin >= threshold``; the default,
:data:`DEFAULT_MARGIN`, was chosen on the dev and holdout pair sets (``continuum bench
semantic`` reports what it does on the independent set, which nobody tuned on).

Fail closed. A judgment that is not finished by its deadline (llama.cpp is stopped mid-decode),
requests longer than ``max_tokens`` together, or any backend error is a rejection, counted with
its reason; it is never a hit.

Invariant: the judge's sequence holds exactly the instruction prefix between judgments.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import DEFAULT_ALIAS, ModelFile, resolve_model
from continuum.errors import BackendError, DecodeAborted, InvalidRequest

DEFAULT_MARGIN = 0.2
DEFAULT_TIMEOUT_S = 2.0
JUDGE_CTX = 1024

INSTRUCTION = (
    "You check a cache. Two requests to an assistant are the SAME only if one answer would be "
    "correct and complete for both. They are DIFFERENT if they differ in any number, unit, "
    "date, name, symbol, operator, direction (from/to, who does what to whom), scope (more or "
    "less specific), question word, or any word that changes meaning (good/bad, on/off, "
    "more/fewer). Rewording, synonyms and word order alone do not make them different."
)
EXAMPLES = (
    ("How do I exit vim without saving?", "what's the command to quit vim and discard my changes",
     "yes"),
    ("Convert 5 miles to km", "Convert 5 km to miles", "no"),
    ("How do I sort a list in Python?", "How do I sort a list in Python in descending order?",
     "no"),
    ("What does && mean in bash?", "What does || mean in bash?", "no"),
    ("Why is the sky blue?", "What makes the sky appear blue?", "yes"),
    ("When did the Berlin Wall fall?", "Where did the Berlin Wall fall?", "no"),
    ("Give me a good name for a cat", "Give me a bad name for a cat", "no"),
    ("Explain recursion simply", "Can you explain recursion in simple terms?", "yes"),
)  # fmt: skip


def question(a: str, b: str) -> str:
    return f"Request A: {a}\nRequest B: {b}\nAre A and B the same request? Answer yes or no."


def _prompt() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTION}]
    for a, b, answer in EXAMPLES:
        messages += [
            {"role": "user", "content": question(a, b)},
            {"role": "assistant", "content": answer},
        ]
    return messages


def _encodes(text: str) -> bool:
    """False for text with lone surrogates (bytes that were not UTF-8): nothing to judge."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str  # "" if accepted; else judge | timeout | too_long | empty | invalid_text | error
    margin: float | None  # logit(yes) - logit(no); None when no judgment was made
    ms: float


class Verifier(Protocol):
    """Judges whether a stored request's result may answer a new request."""

    identity: str

    def verify(self, query: str, stored: str) -> Verdict: ...

    def close(self) -> None: ...


class JudgeVerifier:
    """An instruct model as the judge (see the module docstring). Thread-safe: one lock."""

    def __init__(
        self,
        backend: LlamaCppBackend,
        *,
        threshold: float = DEFAULT_MARGIN,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_tokens: int = 256,
    ) -> None:
        if not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
            raise InvalidRequest(f"the judge's threshold is a finite logit margin, got {threshold}")
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise InvalidRequest(f"the judge's timeout is seconds > 0, got {timeout_s!r}")
        self.backend = backend
        self.threshold = float(threshold)
        self.timeout_s = float(timeout_s)
        self.max_tokens = max_tokens
        self.identity = f"judge:{backend.model.digest[7:23]}:{self.threshold:g}"
        self._lock = threading.Lock()
        self._prompt = _prompt()
        self._head = backend.chat_format.render(self._prompt, add_generation_prompt=False)
        self._yes = self._first_tokens("yes", "Yes", " yes")
        self._no = self._first_tokens("no", "No", " no")
        if self._yes & self._no:
            raise InvalidRequest("this model's tokenizer cannot tell 'yes' from 'no' apart")
        head = backend.tokenize(self._head)
        self._n_head = len(head)
        backend.decode(head)

    @classmethod
    def open(
        cls,
        model: ModelFile | None = None,
        *,
        share: LlamaCppBackend | None = None,
        threads: int | None = None,
        **options: Any,
    ) -> JudgeVerifier:
        """A judge on ``model`` (default: the bundled instruct model), in its own small context
        — on ``share``'s weights when ``share`` runs that same file."""
        model = model or resolve_model(DEFAULT_ALIAS)
        n = threads or (share.n_threads if share is not None else None)
        config = LlamaConfig(n_ctx=JUDGE_CTX, n_threads=n, n_threads_batch=n)
        if share is not None and share.model.digest == model.digest:
            backend = share.sibling(config)
        else:
            backend = LlamaCppBackend(model, config)
        try:
            return cls(backend, **options)
        except BaseException:
            backend.close()
            raise

    def _first_tokens(self, *words: str) -> frozenset[int]:
        return frozenset(self.backend.tokenize(w, special=False)[0] for w in words)

    def close(self) -> None:
        self.backend.close()

    def verify(self, query: str, stored: str) -> Verdict:
        t0 = time.perf_counter()
        if not query.strip() or not stored.strip():
            margin, reason = None, "empty"
        elif not (_encodes(query) and _encodes(stored)):
            margin, reason = None, "invalid_text"
        else:
            with self._lock:
                margin, reason = self._judge(query, stored, time.monotonic() + self.timeout_s)
        ms = (time.perf_counter() - t0) * 1000
        if margin is None:
            return Verdict(False, reason, None, ms)
        ok = margin >= self.threshold
        return Verdict(ok, "" if ok else "judge", margin, ms)

    def _judge(self, query: str, stored: str, deadline: float) -> tuple[float | None, str]:
        b = self.backend
        fmt = b.chat_format
        turn = {"role": "user", "content": question(stored, query)}
        full = fmt.render([*self._prompt, turn], add_generation_prompt=True)
        if not full.startswith(self._head):  # a template that rewrites the past: cannot judge
            return None, "error"
        tokens = b.tokenize(full[len(self._head) :])
        if len(tokens) > self.max_tokens or self._n_head + len(tokens) > b.n_ctx:
            return None, "too_long"
        try:
            b.truncate(self._n_head)
            logits, _ = b.decode(tokens, deadline=deadline)
            assert logits is not None
            yes = float(np.logaddexp.reduce(logits[list(self._yes)]))
            no = float(np.logaddexp.reduce(logits[list(self._no)]))
        except DecodeAborted:
            return None, "timeout"
        except BackendError:
            return None, "error"
        finally:
            b.truncate(self._n_head)
        return yes - no, ""
