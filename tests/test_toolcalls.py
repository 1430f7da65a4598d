"""Tool calls found in model output (no model needed: the parser is pure)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from continuum.toolcalls import ToolParsing, parse_tool_calls, repeated_call_at, unsent

NAMES = {"get_weather", "search"}


def args_of(text: str) -> list[tuple[str, dict[str, object]]]:
    _, calls = parse_tool_calls(text, NAMES)
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_qwen_tags_one_and_several() -> None:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    assert args_of(one) == [("get_weather", {"city": "Lisbon"})]
    two = one + '\n<tool_call>{"name": "search", "arguments": {"q": "rain"}}</tool_call>'
    assert args_of(two) == [("get_weather", {"city": "Lisbon"}), ("search", {"q": "rain"})]
    content, calls = parse_tool_calls("Let me check.\n" + one, NAMES)
    assert content == "Let me check." and len(calls) == 1


def test_an_unclosed_tag_at_the_end_still_counts() -> None:  # max_tokens cut the closing tag
    assert args_of('<tool_call>{"name": "search", "arguments": {"q": "x"}}') == [
        ("search", {"q": "x"})
    ]


def test_a_json_fence_and_a_bare_object_as_small_models_write_them() -> None:
    fenced = 'Sure:\n```json\n{"name": "search", "arguments": {"q": "vim"}}\n```'
    content, calls = parse_tool_calls(fenced, NAMES)
    assert content == "Sure:" and [c.name for c in calls] == ["search"]
    assert args_of('  {"name": "get_weather", "arguments": {"city": "Oslo"}}\n') == [
        ("get_weather", {"city": "Oslo"})
    ]
    listed = '[{"name": "search", "arguments": {"q": "a"}}, {"name": "search", "arguments": {}}]'
    assert [n for n, _ in args_of(listed)] == ["search", "search"]


def test_arguments_as_a_json_string_or_openai_function_shape() -> None:
    s = '{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}'
    assert args_of(s) == [("search", {"q": "x"})]
    nested = '{"type": "function", "function": {"name": "search", "arguments": {"q": "y"}}}'
    assert args_of(nested) == [("search", {"q": "y"})]


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Lisbon is sunny.",
        '{"name": "delete_everything", "arguments": {}}',  # not a declared tool
        '<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>',  # not an object
        "<tool_call>not json</tool_call>",
        '```json\n{"city": "Lisbon"}\n```',  # JSON, but not a call
        '{"name": "search", "arguments": "not json"}',
        "",
    ],
)
def test_text_that_is_not_a_call_stays_text(text: str) -> None:
    assert parse_tool_calls(text, NAMES) == (text, [])


def test_no_declared_tools_means_no_calls() -> None:
    assert parse_tool_calls('{"name": "search", "arguments": {}}', set()) == (
        '{"name": "search", "arguments": {}}',
        [],
    )


def test_ids_are_openai_shaped_and_distinct() -> None:
    _, calls = parse_tool_calls(
        '[{"name": "search", "arguments": {}}, {"name": "search", "arguments": {"q": 1}}]', NAMES
    )
    ids = [c.to_openai()["id"] for c in calls]
    assert all(i.startswith("call_") and len(i) == 29 for i in ids) and len(set(ids)) == 2
    assert calls[0].to_openai()["function"] == {"name": "search", "arguments": "{}"}


@pytest.mark.parametrize(
    "text",
    [
        '[{"name": "search", "arguments": {"q": 1}}, {"name": "search", "arguments": {"q": 1}}]',
        '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {"q": 1}, "name": "search"}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>',
    ],
)
def test_a_repeated_call_counts_once(text: str) -> None:
    _, calls = parse_tool_calls(text, NAMES)
    assert [(c.name, c.arguments) for c in calls] == [("search", '{"q": 1}')]


def test_calls_that_differ_in_arguments_are_both_kept() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": {"q": 1}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": 2}}</tool_call>'
    )
    _, calls = parse_tool_calls(text, NAMES)
    assert [c.arguments for c in calls] == ['{"q": 1}', '{"q": 2}']


def test_repeated_call_at_finds_the_first_closed_repetition() -> None:
    one = '<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>'
    two = '<tool_call>\n{"name": "search", "arguments": {"q": 2}}\n</tool_call>'
    assert repeated_call_at(one) == -1
    assert repeated_call_at(one + "\n" + two) == -1
    text = one + "\n" + two + "\n" + one
    assert repeated_call_at(text) == len(one + "\n" + two + "\n")
    assert repeated_call_at(one + "\n" + one[:-5]) == -1  # still being written: not yet
    assert repeated_call_at("<tool_call>not json</tool_call><tool_call>not json</tool_call>") == -1


@given(st.text(max_size=200))
def test_any_text_parses_without_raising(text: str) -> None:
    content, calls = parse_tool_calls(text, NAMES)
    assert isinstance(content, str)
    for c in calls:
        assert c.name in NAMES and isinstance(json.loads(c.arguments), dict)


def test_tools_are_validated_and_put_in_a_canonical_order() -> None:
    from continuum.errors import InvalidRequest
    from continuum.ops import TokenOp
    from continuum.toolcalls import normalize_tools

    def fn(name: str) -> dict[str, object]:
        return {"type": "function", "function": {"name": name, "description": "d"}}

    tools = normalize_tools([fn("zeta"), fn("alpha")])
    assert [t["function"]["name"] for t in tools] == ["alpha", "zeta"]
    assert tools[0]["function"] == {
        "name": "alpha",
        "description": "d",
        "parameters": {"type": "object", "properties": {}},
    }
    for bad, message in [
        ("search", "tools must be a list"),
        ([{"type": "retrieval"}], "tools[0]"),
        ([fn("a"), fn("a")], "declared twice"),
        ([{"type": "function", "function": {"name": "a", "parameters": []}}], "JSON schema"),
        ([{"type": "function", "function": {"name": "a", "description": 3}}], "description"),
    ]:
        with pytest.raises(InvalidRequest, match=message.replace("[", r"\[")):
            normalize_tools(bad)
    with pytest.raises(InvalidRequest, match="need chat messages"):
        TokenOp("x", prompt="hi", tools=(fn("a"),))
    op = TokenOp("x", messages=({"role": "user", "content": "hi"},), tools=[fn("b"), fn("a")])  # type: ignore[arg-type]
    assert op.tools is not None and op.tools[0]["function"]["name"] == "a"


def test_a_reply_cut_in_its_last_tagged_call_keeps_the_calls_before_it() -> None:
    names = {"get_weather"}
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
    content, calls = parse_tool_calls(one + '\n<tool_call>\n{"name": "get_wea', names)
    assert [c.name for c in calls] == ["get_weather"] and content == ""
    # a finished block that is not a call is text: nothing is guessed
    assert parse_tool_calls('<tool_call>\n{"name": \n</tool_call>' + one, names)[1] == []


def test_a_call_in_a_tag_of_the_models_own_is_a_call() -> None:
    text = '<response>\n{"name": "search", "arguments": {"q": 1}}\n</response>'
    content, calls = parse_tool_calls(text, NAMES)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("search", '{"q": 1}')]
    prose = "<b>bold</b>"
    assert parse_tool_calls(prose, NAMES) == (prose, [])


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lisbon"}}\n</tool_call>'
WORDS = ' |\n|Let| me| check.|<|tool|_call>|```|json\n|bash\n|ls -la\n|{|"name"|}|[|`x`|a < b|done'
FENCED_CALL = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'
PIECES = st.sampled_from([*WORDS.split("|"), CALL, FENCED_CALL, '```\n{"name": "x"}\n```'])


@given(st.lists(PIECES, max_size=12))
def test_streamed_text_is_always_the_beginning_of_the_content(pieces: list[str]) -> None:
    """Sent as streamable allows, piece by piece, the text that went out is never taken back:
    it only grows, and whatever the reply turns out to be (calls or text), its content starts
    with it, and unsent gives the rest."""
    tools = ToolParsing(frozenset({"get_weather"}))
    text, sent = "", 0
    for piece in pieces:
        text += piece
        n = tools.streamable(text)
        assert n >= sent
        sent = n
    streamed = text.lstrip()[:sent]
    content, calls, _ = tools.split(text, "stop")
    rest = unsent(content, streamed)
    whole = (content or "").lstrip() if streamed else content or ""
    assert streamed + (rest or "") == whole
    if calls:
        assert CALL not in streamed


def test_text_before_a_call_streams_and_the_call_is_held() -> None:
    tools = ToolParsing(frozenset({"get_weather"}))
    assert tools.streamable("Let me check the weather. ") == len("Let me check the weather.")
    assert tools.streamable("Let me check. <tool_") == len("Let me check.")
    assert tools.streamable('{"name": "get_weather"') == 0  # a bare call may be coming
    assert tools.streamable("  <response>") == 0
    assert tools.streamable("Use ```json") == len("Use")
    assert tools.streamable("Use ``") == len("Use")  # a fence may be opening
    assert tools.streamable("if a < b and `x`:") == len("if a < b and `x`:")


def test_a_fence_that_cannot_be_a_call_streams() -> None:
    """A code block named for a language streams as it is written; a bare or json fence is
    held until it closes, and streams then if it holds no call."""
    tools = ToolParsing(frozenset({"get_weather"}))
    assert tools.streamable("Run:\n```bash\nls -la") == len("Run:\n```bash\nls -la")
    assert tools.streamable("Run:\n```") == len("Run:")
    assert tools.streamable("Run:\n```\n{") == len("Run:")
    assert tools.streamable("Run:\n```js") == len("Run:")  # json is still possible
    assert tools.streamable("Run:\n```jsx\nf()") == len("Run:\n```jsx\nf()")
    shown = 'See:\n```json\n{"a": 1}\n```\nthen'
    assert tools.streamable(shown) == len(shown)
    assert tools.streamable("Run:\n```bash\necho <tool_call>") == len("Run:\n```bash\necho")
    assert tools.streamable("Run:\n" + FENCED_CALL + " ok") == len("Run:")
    content, _, _ = tools.split("Let me check. " + CALL, "stop")
    assert unsent(content, "Let me check.") == ""
