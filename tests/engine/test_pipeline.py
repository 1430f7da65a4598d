"""The tier pipeline's orchestration with a scripted backend (no model: this tests the order of
tiers, their outcomes and the policy switch, not any model behaviour)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from continuum import (
    BackendRegistry,
    Engine,
    GenerationParams,
    InvalidRequest,
    ReusePolicy,
    TokenOp,
)
from continuum.backends.base import Capabilities, Generation
from continuum.messages import Message
from continuum.metrics import TierOutcome
from continuum.tiers.base import Hit, Miss, Tier, TierRequest, TierResult, miss


class Scripted:
    """Answers every prompt with its length; counts calls."""

    name = "scripted"
    model_identity = "scripted:1"
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def prompt_tokens(
        self,
        messages: Sequence[Message] | None,
        prompt: str | None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        text = prompt if prompt is not None else "|".join(m["content"] for m in messages or ())
        return [ord(c) for c in text]

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
        self.calls.append(tuple(tokens))
        text = f"len={len(tokens)}"
        if on_text is not None:
            on_text(text)
        return Generation(text, (1, 2), "stop", len(tokens), len(tokens), 0, 1.0, 2.0)

    def close(self) -> None:
        pass


class Echo:
    """A tier that serves any prompt starting with "echo:" (what a new tier module adds)."""

    name = "echo"

    def lookup(self, request: TierRequest) -> Hit | Miss:
        if request.prompt and request.prompt.startswith("echo:"):
            result = TierResult(request.prompt[5:], (), "stop", len(request.tokens))
            return Hit(TierOutcome(self.name, "hit"), result)
        return miss(self.name)

    def record(self, request: TierRequest, result: TierResult) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def engine() -> Engine:
    reg = BackendRegistry(entry_points_group=None)
    reg.register("scripted", Scripted)
    return Engine.open(reg, backend="scripted")


def op(prompt: str, **params: Any) -> TokenOp:
    return TokenOp("answer", prompt=prompt, params=GenerationParams(max_tokens=4, **params))


def backend(e: Engine) -> Scripted:
    assert isinstance(e.backend, Scripted)
    return e.backend


def test_tiers_in_order_with_one_outcome_each(engine: Engine) -> None:
    first = engine.run(op("hello"), namespace="t")
    assert first.metrics.hit_tier == "cold" and first.metrics.backend_called
    assert [(t.tier, t.outcome) for t in first.metrics.tiers] == [("memo", "miss")]
    again = engine.run(op("hello"), namespace="t")
    assert again.metrics.hit_tier == "memo" and not again.metrics.backend_called
    assert again.text == first.text and len(backend(engine).calls) == 1
    assert engine.run(op("hello"), namespace="u").metrics.hit_tier == "cold"  # other tenant


def test_never_consults_no_tier_and_stores_nothing(engine: Engine) -> None:
    never = ReusePolicy.never()
    r = engine.run(op("x  \r\n"), namespace="t", policy=never)
    assert r.metrics.tiers == () and backend(engine).calls[-1] == tuple(map(ord, "x  \r\n"))
    assert engine.run(op("x  \r\n"), namespace="t").metrics.hit_tier == "cold"


def test_the_backend_gets_the_callers_text_and_the_key_is_canonical(engine: Engine) -> None:
    """Canonical forms are for keys (DESIGN.md §3.13): trailing spaces and CRLF reach the
    model as sent, and a request that differs only by them finds the stored answer."""
    sent = "list the files  \r\nin this folder\t"
    first = engine.run(op(sent), namespace="t")
    assert backend(engine).calls[-1] == tuple(map(ord, sent))
    assert first.metrics.hit_tier == "cold"
    again = engine.run(op("list the files\nin this folder"), namespace="t")
    assert again.metrics.hit_tier == "memo" and len(backend(engine).calls) == 1
    chat = TokenOp(
        "answer",
        messages=[{"role": "user", "content": "hi  "}],
        params=GenerationParams(max_tokens=4),
    )
    engine.run(chat, namespace="t")
    assert backend(engine).calls[-1] == tuple(map(ord, "hi  "))


def test_nondeterministic_requests_are_skipped_with_a_reason(engine: Engine) -> None:
    engine.run(op("hi", temperature=0.7), namespace="t")
    r = engine.run(op("hi", temperature=0.7), namespace="t")
    assert r.metrics.tiers[0] == TierOutcome("memo", "skipped", "nondeterministic")


def test_a_new_tier_is_one_object_in_the_list(engine: Engine) -> None:
    echo = Echo()
    assert isinstance(echo, Tier)
    engine.result_tiers.insert(0, echo)
    r = engine.run(op("echo:hi there"), namespace="t")
    assert r.metrics.hit_tier == "echo" and r.text == "hi there" and not backend(engine).calls
    assert engine.tier_stats()["echo"] == {}


def test_a_backend_without_resident_sequences_has_no_sessions(engine: Engine) -> None:

    assert not engine.has_sessions and engine.prefix is None
    with pytest.raises(InvalidRequest, match="resident sequences"):
        engine.worker()


def test_tools_on_a_backend_that_cannot_render_them_are_refused(engine: Engine) -> None:
    tool = {"type": "function", "function": {"name": "search"}}
    chat = TokenOp("answer", messages=({"role": "user", "content": "hi"},), tools=(tool,))
    with pytest.raises(InvalidRequest, match="cannot render tools"):
        engine.run(chat, namespace="t")
    assert backend(engine).calls == []  # refused before anything ran


def test_a_constraint_on_a_backend_that_cannot_enforce_it_is_refused(engine: Engine) -> None:
    shaped = TokenOp("answer", prompt="hi", params={"constraint": '{"type":"json_object"}'})
    with pytest.raises(InvalidRequest, match="cannot constrain its output"):
        engine.run(shaped, namespace="t")
    assert backend(engine).calls == []
