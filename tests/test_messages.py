"""Message validation at the edge: normalised shapes, and a typed error for every bad input."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.errors import InvalidMessage, InvalidRequest
from continuum.messages import ROLES, normalize_messages

LONE_SURROGATE = b"ok \xff".decode("utf-8", errors="surrogateescape")  # 'ok \udcff'


# -- normalisation ---------------------------------------------------------------------------
def test_plain_messages_pass_through() -> None:
    raw = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "ana"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    assert normalize_messages(raw) == raw


def test_text_parts_are_joined() -> None:
    raw = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}],
        }
    ]
    assert normalize_messages(raw) == [{"role": "user", "content": "Hello, world"}]


def test_unknown_keys_are_dropped() -> None:
    raw = [{"role": "user", "content": "x", "temperature": 0.2}]
    assert normalize_messages(raw) == [{"role": "user", "content": "x"}]


def test_assistant_tool_calls_with_content_none() -> None:
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    raw = [{"role": "assistant", "content": None, "tool_calls": calls}]
    before = copy.deepcopy(raw)
    (msg,) = normalize_messages(raw)
    assert msg == {"role": "assistant", "content": "", "tool_calls": calls}
    msg["tool_calls"].append({"id": "call_2"})  # the output does not alias the caller's list
    assert raw == before


def test_empty_list_allowed_on_request() -> None:
    assert normalize_messages([], allow_empty=True) == []


def test_tuple_of_messages_is_accepted() -> None:
    assert normalize_messages(({"role": "user", "content": "x"},)) == [
        {"role": "user", "content": "x"}
    ]


# -- requests that are not a message list ----------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("hello", id="str"),
        pytest.param(b"hello", id="bytes"),
        pytest.param({"role": "user", "content": "x"}, id="dict"),
        pytest.param(None, id="none"),
        pytest.param(7, id="int"),
    ],
)
def test_not_a_list_is_invalid_request(raw: object) -> None:
    with pytest.raises(InvalidRequest, match="messages must be a list") as info:
        normalize_messages(raw)
    assert not isinstance(info.value, InvalidMessage)
    assert isinstance(info.value, ValueError)


def test_empty_list_is_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="messages is empty"):
        normalize_messages([])


# -- one bad message: index and field are reported ------------------------------------------
GOOD = {"role": "user", "content": "fine"}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        pytest.param("just text", "message", id="message-is-str"),
        pytest.param(["user", "x"], "message", id="message-is-list"),
        pytest.param({"role": "robot", "content": "x"}, "role", id="unknown-role"),
        pytest.param({"content": "x"}, "role", id="missing-role"),
        pytest.param({"role": "user"}, "content", id="missing-content"),
        pytest.param({"role": "user", "content": None}, "content", id="content-none"),
        pytest.param(
            {"role": "assistant", "content": None, "tool_calls": []},
            "content",
            id="assistant-none-without-calls",
        ),
        pytest.param({"role": "user", "content": 5}, "content", id="content-int"),
        pytest.param({"role": "user", "content": b"x"}, "content", id="content-bytes"),
        pytest.param({"role": "user", "content": {"text": "x"}}, "content", id="content-dict"),
        pytest.param({"role": "user", "content": LONE_SURROGATE}, "content", id="bad-utf8"),
        pytest.param(
            {"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
            "content[0]",
            id="non-text-part",
        ),
        pytest.param({"role": "user", "content": ["x"]}, "content[0]", id="part-is-str"),
        pytest.param(
            {"role": "user", "content": [{"type": "text", "text": 3}]},
            "content[0].text",
            id="part-text-int",
        ),
        pytest.param(
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]},
            "content[1].text",
            id="part-text-missing",
        ),
        pytest.param(
            {"role": "user", "content": [{"type": "text", "text": LONE_SURROGATE}]},
            "content[0].text",
            id="part-bad-utf8",
        ),
        pytest.param({"role": "user", "content": "x", "name": 5}, "name", id="name-int"),
        pytest.param(
            {"role": "user", "content": "x", "name": LONE_SURROGATE}, "name", id="name-bad-utf8"
        ),
        pytest.param(
            {"role": "tool", "content": "x", "tool_call_id": ["c"]},
            "tool_call_id",
            id="tool-call-id-list",
        ),
        pytest.param(
            {"role": "assistant", "content": "", "tool_calls": "call_1"},
            "tool_calls",
            id="tool-calls-str",
        ),
        pytest.param(
            {"role": "assistant", "content": "", "tool_calls": {"id": "c"}},
            "tool_calls",
            id="tool-calls-dict",
        ),
        pytest.param(
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}, "c2"]},
            "tool_calls",
            id="tool-calls-item-str",
        ),
    ],
)
def test_bad_message_names_index_and_field(bad: object, field: str) -> None:
    raw = [GOOD, GOOD, bad]
    before = copy.deepcopy(raw)
    with pytest.raises(InvalidMessage) as info:
        normalize_messages(raw)
    err = info.value
    assert isinstance(err, InvalidRequest)
    assert (err.index, err.field) == (2, field)
    assert str(err).startswith(f"message 2: {field} ")
    assert "Send OpenAI-shaped messages" in str(err)  # says what to do
    assert raw == before  # nothing was changed


def test_bad_utf8_error_says_utf8_and_where() -> None:
    with pytest.raises(InvalidMessage, match=r"not valid UTF-8 .*offset 3"):
        normalize_messages([{"role": "user", "content": LONE_SURROGATE}])


def test_first_bad_message_is_reported() -> None:
    with pytest.raises(InvalidMessage) as info:
        normalize_messages([GOOD, {"role": "user"}, {"role": "robot", "content": "x"}])
    assert (info.value.index, info.value.field) == (1, "content")


# -- property: normalisation is idempotent and keeps the text ------------------------------
text = st.text(max_size=20)  # hypothesis text never contains lone surrogates
parts = st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), max_size=3)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": text,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": text, "arguments": text}),
        }
    ),
    min_size=1,
    max_size=2,
)


@st.composite
def valid_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(ROLES))
    msg: dict[str, Any] = {"role": role}
    if role == "assistant" and draw(st.booleans()):
        msg["content"] = draw(st.none() | text)
        msg["tool_calls"] = draw(tool_calls)
    else:
        msg["content"] = draw(text | parts)
    if draw(st.booleans()):
        msg["name"] = draw(text)
    if role == "tool" and draw(st.booleans()):
        msg["tool_call_id"] = draw(text)
    return msg


def expected_content(msg: dict[str, Any]) -> str:
    content = msg["content"]
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p["text"] for p in content)
    return str(content)


@given(st.lists(valid_message(), min_size=1, max_size=6))
def test_normalize_is_idempotent(raw: list[dict[str, Any]]) -> None:
    once = normalize_messages(raw)
    assert normalize_messages(once) == once
    assert [m["role"] for m in once] == [m["role"] for m in raw]
    assert [m["content"] for m in once] == [expected_content(m) for m in raw]
    assert all(isinstance(m["content"], str) for m in once)
