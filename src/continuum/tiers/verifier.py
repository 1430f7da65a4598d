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

Two prompts (``kind``). ``intent`` (the default) shows the two requests; ``answer`` shows both
requests and both answers (the stored one and the new request's own cold answer) and asks
whether the stored answer is a correct answer to the new request. The answer judge is the
semantic tier's verified mode's (:mod:`continuum.tiers.semantic_promotion`): it runs off the
request path, so its deadline is longer (:data:`ANSWER_TIMEOUT_S`). A judge must be an instruct
model: :meth:`JudgeVerifier.open` refuses a GGUF without a chat template.

Invariant: the judge's sequence holds exactly the instruction prefix between judgments.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import DEFAULT_ALIAS, ModelFile, resolve_model
from continuum.errors import BackendError, DecodeAborted, InvalidRequest

DEFAULT_MARGIN = 0.2
DEFAULT_TIMEOUT_S = 2.0
ANSWER_TIMEOUT_S = 30.0  # off the request path: a busy machine must not reject every judgment
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


ANSWER_INSTRUCTION = (
    "You check a cache of answers. Request A was answered with Answer A; request B was answered "
    "on its own with Answer B. Say yes only if Answer A is a correct and complete answer to "
    "request B: the two requests ask for the same thing, and the answers agree on every number, "
    "name, unit, command, direction and conclusion (wording and length may differ). Say no if "
    "the requests differ in anything that changes the answer, or if the answers disagree."
)
ANSWER_EXAMPLES = (
    ("Convert 5 miles to km", "5 miles is about 8.05 km.",
     "Convert 5 km to miles", "5 km is about 3.11 miles.", "no"),
    ("Why is the sky blue?", "Sunlight scatters off air molecules; blue light scatters most "
     "(Rayleigh scattering), so the sky looks blue.",
     "What makes the sky appear blue?", "Rayleigh scattering: air scatters short blue "
     "wavelengths of sunlight more than red ones.", "yes"),
    ("How do I undo the last git commit but keep my changes?", "Run `git reset --soft HEAD~1`.",
     "How do I undo the last git commit and discard my changes?", "Run `git reset --hard "
     "HEAD~1`.", "no"),
    ("how to list files in a directory in python", "Use `os.listdir(path)` or "
     "`pathlib.Path(path).iterdir()`.",
     "In Python, how can I get the names of the files in a folder?", "`os.listdir('folder')` "
     "returns the names of the entries in the folder.", "yes"),
    ("When did the Berlin Wall fall?", "On 9 November 1989.",
     "Where did the Berlin Wall stand?", "It divided Berlin, Germany.", "no"),
    ("Sort a list in Python", "Use `sorted(xs)` or `xs.sort()`.",
     "Sort a list in Python in descending order", "Use `sorted(xs, reverse=True)`.", "no"),
)  # fmt: skip
ANSWER_CHARS = 400  # of each answer shown to the judge


def question(a: str, b: str) -> str:
    return f"Request A: {a}\nRequest B: {b}\nAre A and B the same request? Answer yes or no."


def answer_question(a: str, answer_a: str, b: str, answer_b: str) -> str:
    return (
        f"Request A: {a}\nAnswer A: {answer_a[:ANSWER_CHARS]}\nRequest B: {b}\n"
        f"Answer B: {answer_b[:ANSWER_CHARS]}\nIs Answer A a correct and complete answer to "
        "request B? Answer yes or no."
    )


Kind = Literal["intent", "answer"]  # what the judge is shown: the two requests, or with answers


def _prompt(kind: Kind) -> list[dict[str, Any]]:
    instruction, turns = (
        (INSTRUCTION, [(question(a, b), v) for a, b, v in EXAMPLES])
        if kind == "intent"
        else (ANSWER_INSTRUCTION, [(answer_question(*e[:4]), e[4]) for e in ANSWER_EXAMPLES])
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": instruction}]
    for user, answer in turns:
        messages += [
            {"role": "user", "content": user},
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
        timeout_s: float | None = None,
        max_tokens: int | None = None,
        kind: Kind = "intent",
    ) -> None:
        if kind not in ("intent", "answer"):
            raise InvalidRequest(f"a judge judges 'intent' or 'answer', got {kind!r}")
        if not isinstance(threshold, (int, float)) or not np.isfinite(threshold):
            raise InvalidRequest(f"the judge's threshold is a finite logit margin, got {threshold}")
        if timeout_s is None:  # off the request path, an answer judgment has time
            timeout_s = DEFAULT_TIMEOUT_S if kind == "intent" else ANSWER_TIMEOUT_S
        if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise InvalidRequest(f"the judge's timeout is seconds > 0, got {timeout_s!r}")
        self.backend = backend
        self.threshold = float(threshold)
        self.timeout_s = float(timeout_s)
        self.kind = kind
        self.max_tokens = max_tokens or (256 if kind == "intent" else 512)
        tag = "" if kind == "intent" else ":answer"
        self.identity = f"judge:{backend.model.digest[7:23]}:{self.threshold:g}{tag}"
        self._lock = threading.Lock()
        self._prompt = _prompt(kind)
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
        if not model.info.chat_template:  # a base model continues text; it does not answer
            raise InvalidRequest(
                f"the judge must be an instruct (chat) model, and {model.name} has no chat "
                "template in its GGUF; give qwen2.5-coder-0.5b (the default) or "
                "qwen2.5-coder-1.5b"
            )
        n = threads or (share.n_threads if share is not None else None)
        n_ctx = JUDGE_CTX if options.get("kind", "intent") == "intent" else 2 * JUDGE_CTX
        config = LlamaConfig(n_ctx=n_ctx, n_threads=n, n_threads_batch=n)
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
        """Whether ``stored``'s result may answer ``query``, judged on the two requests."""
        if self.kind != "intent":
            raise InvalidRequest("this judge compares answers: call verify_answers")
        return self._verdict((query, stored), question(stored, query))

    def verify_answers(self, query: str, stored: str, answer: str, stored_answer: str) -> Verdict:
        """Whether ``stored_answer`` (the answer to ``stored``) is a correct answer to ``query``,
        judged on both requests and both answers (``answer``: ``query``'s own, cold)."""
        if self.kind != "answer":
            raise InvalidRequest("this judge compares requests only: call verify")
        turn = answer_question(stored, stored_answer, query, answer)
        return self._verdict((query, stored, answer, stored_answer), turn)

    def _verdict(self, texts: tuple[str, ...], turn: str) -> Verdict:
        t0 = time.perf_counter()
        if not all(t.strip() for t in texts):
            margin, reason = None, "empty"
        elif not all(_encodes(t) for t in texts):
            margin, reason = None, "invalid_text"
        else:
            with self._lock:
                margin, reason = self._judge(turn, time.monotonic() + self.timeout_s)
        ms = (time.perf_counter() - t0) * 1000
        if margin is None:
            return Verdict(False, reason, None, ms)
        ok = margin >= self.threshold
        return Verdict(ok, "" if ok else "judge", margin, ms)

    def _judge(self, turn: str, deadline: float) -> tuple[float | None, str]:
        b = self.backend
        fmt = b.chat_format
        full = fmt.render([*self._prompt, {"role": "user", "content": turn}], True)
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
