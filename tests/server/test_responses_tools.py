"""The Responses API's tool set read into what the model is offered (pure logic, no model):
namespaces flattened and their calls named back, custom tools as one-string functions, hosted
tools left out or refused, and every collision or unknown type a 400 naming the tool; the input
items agent clients send back (custom calls, namespaced calls, list outputs, reasoning)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from continuum.errors import InvalidRequest
from continuum.server.responses import input_messages
from continuum.server.responses_tools import read_tools
from continuum.toolcalls import ToolCall

SHELL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for sub-agents.",
    "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "parameters": {}},
        {"type": "function", "name": "close_agent", "parameters": {}},
    ],
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}


def test_namespace_tools_are_offered_by_name_and_their_calls_carry_the_namespace() -> None:
    tools = read_tools([SHELL, AGENTS, {"type": "web_search"}])
    names = [t["function"]["name"] for t in tools.chat or []]
    assert names == ["exec_command", "spawn_agent", "close_agent"]
    spawn = (tools.chat or [])[1]["function"]
    assert spawn["description"] == "Tools for sub-agents. Spawn one."
    item = tools.item(ToolCall("call_1", "spawn_agent", '{"x": 1}'))
    assert item["type"] == "function_call" and item["namespace"] == "multi_agent_v1"
    assert item["name"] == "spawn_agent" and item["call_id"] == "call_1"
    plain = tools.item(ToolCall("call_2", "exec_command", "{}"))
    assert "namespace" not in plain and plain["id"].startswith("fc_")
    assert tools.left_out == ("web_search",)


def test_a_custom_tool_is_a_one_string_function_and_its_call_a_custom_tool_call() -> None:
    tools = read_tools([PATCH])
    fn = (tools.chat or [])[0]["function"]
    assert fn["parameters"]["required"] == ["input"]
    assert "start: /.+/" in fn["parameters"]["properties"]["input"]["description"]
    item = tools.item(ToolCall("call_9", "apply_patch", json.dumps({"input": "*** Begin"})))
    assert item == {
        "type": "custom_tool_call",
        "id": item["id"],
        "call_id": "call_9",
        "name": "apply_patch",
        "input": "*** Begin",
        "status": "completed",
    }


def test_hosted_tools_are_refused_when_the_server_says_so() -> None:
    with pytest.raises(InvalidRequest, match=r"tools\[1\].*web_search.*--hosted-tools refuse"):
        read_tools([SHELL, {"type": "web_search"}], hosted="refuse")
    assert read_tools([SHELL], hosted="refuse").left_out == ()


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ([{"type": "teleport"}], r"tools\[0\]: tools of type 'teleport' are not supported"),
        ([{"name": "x"}], r"tools\[0\] must be an object with a 'type'"),
        ("exec", "tools must be a list"),
        (
            [{"type": "namespace", "name": "empty", "tools": []}],
            r"namespace 'empty' has no tools",
        ),
        ([{"type": "namespace", "tools": [SHELL]}], "a namespace tool needs a name"),
        (
            [SHELL, {**AGENTS, "name": "exec_command"}],
            r"tools\[1\]: the namespace 'exec_command' has the name of the function tool at "
            r"tools\[0\]",
        ),
        (
            [{**AGENTS, "tools": [SHELL]}, SHELL],
            r"tools\[1\]: the function tool 'exec_command' has the name of the function tool "
            r"at tools\[0\]\.tools\[0\]",
        ),
        (
            [{**AGENTS, "tools": [{**AGENTS, "name": "inner"}]}],
            r"tools of type 'namespace' are not supported inside a namespace",
        ),
        (
            [{**AGENTS, "tools": [{"type": "web_search"}]}],
            r"'web_search' are not supported inside a namespace",
        ),
        ([{**PATCH, "format": {"type": "regex"}}], r"tools\[0\]\.format must be"),
        ([{"type": "function", "description": "no name"}], "a function tool needs a name"),
        ([{**SHELL, "description": 3}], r"tools\[0\]\.description must be a string"),
    ],
)
def test_tools_that_cannot_be_offered_are_a_400_naming_them(tools: Any, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        read_tools(tools)


def test_too_many_tools_are_refused() -> None:
    many = [{"type": "function", "name": f"t{i}", "parameters": {}} for i in range(513)]
    with pytest.raises(InvalidRequest, match="more than 512 callable tools"):
        read_tools(many)


def test_input_items_agents_send_back_map_onto_chat_messages() -> None:
    left_out: list[str] = []
    items = [
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "B"}]},
        {"type": "message", "role": "user", "content": "Fix it."},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {
            "type": "function_call",
            "name": "spawn_agent",
            "namespace": "multi_agent_v1",
            "call_id": "c1",
            "arguments": "{}",
        },
        {"type": "custom_tool_call", "name": "apply_patch", "call_id": "c2", "input": "*** P"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "spawned"}],
        },
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
    ]
    msgs = input_messages(items, left_out)
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool"]
    calls = msgs[3]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["spawn_agent", "apply_patch"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"input": "*** P"}
    assert msgs[4] == {"role": "tool", "tool_call_id": "c1", "content": "spawned"}
    assert msgs[5]["content"] == "done"
    assert left_out == ["reasoning"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            {"type": "custom_tool_call", "name": "x", "call_id": "c"},
            "needs name, call_id and input",
        ),
        ({"type": "function_call_output", "output": "x"}, "needs a call_id"),
        (
            {"type": "function_call_output", "call_id": "c", "output": 3},
            r"input\[0\]\.output must be a string or a list",
        ),
        (
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_image", "image_url": "data:"}],
            },
            r"input\[0\]\.output\[0\]: content parts of type 'input_image' are not supported",
        ),
        ({"type": "web_search_call", "action": {}}, "'web_search_call' are not supported"),
    ],
)
def test_input_items_that_cannot_be_read_are_a_400_naming_them(
    item: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        input_messages([item])
