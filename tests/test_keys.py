"""Canonical form and cache keys: every rule, and every field that must change a key."""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import pytest
from hypothesis import given

from continuum import GenerationParams, InvalidRequest, ReusePolicy
from continuum.keys import canonical_messages, canonical_text, op_key, tool_key
from continuum.tiers.state import BackendState, StateKind, prefix_hash

BASE = {
    "namespace": "tenant",
    "backend": "llamacpp",
    "model": "sha256:abc",
    "op_name": "answer",
    "params": GenerationParams(),
    "tokens": [2, 10, 11, 12],
}


def test_line_endings_are_normalised() -> None:
    assert canonical_text("a\r\nb\rc\n") == "a\nb\nc\n"


def test_trailing_whitespace_is_removed_per_line_but_indentation_is_kept() -> None:
    assert canonical_text("def f():  \n    return 1\t\n\n  x") == "def f():\n    return 1\n\n  x"


def test_tool_call_arguments_are_compared_by_json_value() -> None:
    def call(args: str) -> dict:  # type: ignore[type-arg]
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
            ],
        }

    a = canonical_messages([call('{"b": 1, "a": [1, 2]}')])
    b = canonical_messages([call('{ "a":[1,2],\n "b":1 }')])
    assert a == b
    assert (
        canonical_messages([call("not json  ")])[0]["tool_calls"][0]["function"]["arguments"]
        == "not json"
    )


def test_message_key_order_does_not_matter() -> None:
    assert canonical_messages([{"content": "x", "role": "user"}]) == canonical_messages(
        [{"role": "user", "content": "x"}]
    )


@given(st.text())
def test_canonical_text_is_idempotent(text: str) -> None:
    once = canonical_text(text)
    assert canonical_text(once) == once
    assert "\r" not in once


@pytest.mark.parametrize(
    "change",
    [
        {"namespace": "other-tenant"},
        {"backend": "openai_http"},
        {"model": "sha256:def"},
        {"op_name": "summarise"},
        {"tokens": [2, 10, 11, 13]},
        {"tokens": [2, 10, 11]},
        {"params": GenerationParams(max_tokens=255)},
        {"params": GenerationParams(temperature=0.5)},
        {"params": GenerationParams(top_p=0.9)},
        {"params": GenerationParams(top_k=40)},
        {"params": GenerationParams(seed=1)},
        {"params": GenerationParams(stop=("\n",))},
    ],
)
def test_every_field_changes_the_key(change: dict) -> None:  # type: ignore[type-arg]
    assert op_key(**BASE) != op_key(**{**BASE, **change})  # type: ignore[arg-type]


def test_omitted_parameters_are_keyed_by_their_defaults() -> None:
    explicit = GenerationParams(max_tokens=256, temperature=0.0, top_p=1.0, top_k=0)
    assert op_key(**BASE) == op_key(**{**BASE, "params": explicit})  # type: ignore[arg-type]
    assert GenerationParams.from_dict({}) == GenerationParams()
    assert GenerationParams.from_dict({"stop": "x"}).stop == ("x",)


def test_keys_are_stable_strings() -> None:
    k = op_key(**BASE)  # type: ignore[arg-type]
    assert k.startswith("b2v1:") and k == op_key(**BASE)  # type: ignore[arg-type]
    assert tool_key("t", "f", {"a": 1, "b": 2}) == tool_key("t", "f", {"b": 2, "a": 1})


def test_unknown_or_bad_parameters_are_rejected() -> None:
    with pytest.raises(InvalidRequest, match="unknown decode parameter"):
        GenerationParams.from_dict({"max_token": 5})
    with pytest.raises(InvalidRequest):
        GenerationParams.from_dict({"temperature": -1})
    with pytest.raises(InvalidRequest):
        GenerationParams.from_dict([1, 2])


def test_a_state_handle_is_only_aligned_with_its_own_prefix() -> None:
    tokens = list(range(100))
    h = BackendState(StateKind.LIVE, "ns", "m", 100, prefix_hash("ns", tokens), seq_id=1)
    assert h.aligned_with("ns", "m", tokens)
    assert not h.aligned_with("ns", "m", tokens[:99])  # a different canonical length
    assert not h.aligned_with("ns", "m", [*tokens[:99], 7])
    assert not h.aligned_with("other", "m", tokens)
    assert not h.aligned_with("ns", "other-model", tokens)
    assert prefix_hash("a", tokens) != prefix_hash("b", tokens)
    assert dataclasses.is_dataclass(h)


def test_policies() -> None:
    assert not ReusePolicy.never().allows_prefix(1000)
    assert not ReusePolicy.never().allows_result(1000, True)
    t = ReusePolicy.threshold(min_len=64)
    assert not t.allows_prefix(63) and t.allows_prefix(64)
    assert not ReusePolicy.always().allows_result(10, deterministic=False)
    assert ReusePolicy.always(nondeterministic=True).allows_result(10, deterministic=False)
    with pytest.raises(InvalidRequest):
        ReusePolicy.threshold(min_len=-1)
