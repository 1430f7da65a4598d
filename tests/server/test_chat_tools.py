"""Tool calling on /v1/chat/completions, on the real default model (Qwen2.5-Coder-0.5B-Instruct)
through the official openai SDK: calls parsed from the model's own output, streamed the way the
SDK accumulates them, tools rendered by the model's template and part of every key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from continuum.backends.chat_format import ChatFormat
from continuum.backends.models import resolve_model
from continuum.toolcalls import normalize_tools, template_messages
from tests.server.test_app import Running, _serve

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Lisbon right now?"}]
JSON_OBJECT = {"type": "json_object"}


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("tools"), model=MODEL, default_max_tokens=48)


def ask(srv: Running, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 48)
    return srv.client().chat.completions.create(model=srv.state.model_id, temperature=0, **kw)


def test_a_tool_call_is_parsed_into_openais_shape(qwen: Running) -> None:
    r = ask(qwen, messages=ASK, tools=[WEATHER, TIME])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)  # a JSON *string*


def test_streamed_calls_accumulate_to_the_same_call(qwen: Running) -> None:
    plain = ask(qwen, messages=ASK, tools=[WEATHER, TIME]).choices[0].message.tool_calls[0]
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for event in ask(qwen, messages=ASK, tools=[WEATHER, TIME], stream=True):
        if not event.choices:
            continue
        delta = event.choices[0].delta
        for tc in delta.tool_calls or ():
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.id or ""
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
        finish = event.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == plain.function.name and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == json.loads(plain.function.arguments)


def test_text_with_tools_offered_streams_as_it_is_written(qwen: Running) -> None:
    """A reply that turns out to be text goes out piece by piece while it is written, not held
    to its end because it might have been a call; it is the reply a non-streamed request gets."""
    poem = [{"role": "user", "content": "Write two sentences about the sea. Use no tools."}]
    pieces = []  # first: a cold decode (the same request again is a memo hit, sent whole)
    for event in ask(qwen, messages=poem, tools=[WEATHER, TIME], seed=7, stream=True):
        if event.choices and event.choices[0].delta.content:
            pieces.append(event.choices[0].delta.content)
    assert len(pieces) > 3, pieces  # streamed, not one held chunk at the end
    plain = ask(qwen, messages=poem, tools=[WEATHER, TIME], seed=7)
    assert plain.choices[0].message.tool_calls is None
    assert "".join(pieces) == (plain.choices[0].message.content or "").lstrip()


def test_tools_are_part_of_the_key_in_a_canonical_order(qwen: Running) -> None:
    first = ask(qwen, messages=ASK, tools=[TIME, WEATHER])
    swapped = ask(qwen, messages=ASK, tools=[WEATHER, TIME])  # same tools, other order
    assert swapped.usage.model_extra["continuum"]["hit_tier"] == "memo"  # type: ignore[union-attr]
    assert swapped.choices[0].message.tool_calls[0].function.name == (
        first.choices[0].message.tool_calls[0].function.name
    )
    other = ask(qwen, messages=ASK, tools=[WEATHER])  # other tools: another prompt
    assert other.usage.model_extra["continuum"]["hit_tier"] != "memo"  # type: ignore[union-attr]
    bare = ask(qwen, messages=ASK)
    assert bare.usage.model_extra["continuum"]["hit_tier"] != "memo"  # type: ignore[union-attr]
    assert bare.choices[0].message.tool_calls is None


def test_tool_choice_none_keeps_the_tools_but_never_returns_a_call(qwen: Running) -> None:
    r = ask(qwen, messages=ASK, tools=[WEATHER, TIME], tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")
    assert isinstance(r.choices[0].message.content, str)


def _hit(r: Any) -> str:
    return str(r.usage.model_extra["continuum"]["hit_tier"])


def test_required_is_enforced_with_a_grammar_in_the_templates_own_format(qwen: Running) -> None:
    chat = [{"role": "user", "content": "Reply with the word OK."}]  # nothing asks for a tool
    free = ask(qwen, messages=chat, tools=[WEATHER, TIME])
    assert free.choices[0].finish_reason != "tool_calls", free.choices[0].message
    r = ask(qwen, messages=chat, tools=[WEATHER, TIME], tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls
    assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls)
    for c in calls:
        args = json.loads(c.function.arguments)
        assert isinstance(args, dict) and set(args) <= {"city"}
        assert all(isinstance(v, str) for v in args.values())
    assert _hit(r) != "memo"  # tool_choice is part of the key: not auto's stored reply


def test_a_named_function_is_the_one_called(qwen: Running) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = ask(qwen, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice)  # asks for weather
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and r.choices[0].finish_reason == "tool_calls"
    assert set(json.loads(call.function.arguments)) <= {"city"}
    again = ask(qwen, messages=ASK, tools=[TIME, WEATHER], tool_choice=choice)
    assert _hit(again) == "memo"  # the same forced choice: the same key


def test_required_without_parallel_calls_makes_exactly_one_streamed(qwen: Running) -> None:
    names, finish = [], None
    for event in ask(
        qwen,
        messages=[{"role": "user", "content": "Weather and time in Lisbon and in Oslo?"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        stream=True,
    ):
        if event.choices:
            for tc in event.choices[0].delta.tool_calls or ():
                if tc.function is not None and tc.function.name:
                    names.append(tc.function.name)
            finish = event.choices[0].finish_reason or finish
    assert len(names) == 1 and finish == "tool_calls"


def test_response_format_json_object_and_json_schema_are_enforced(qwen: Running) -> None:
    chat = [{"role": "user", "content": "How many legs does a spider have?"}]
    r = ask(qwen, messages=chat, response_format=JSON_OBJECT)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {
        "type": "object",
        "properties": {"legs": {"type": "integer"}, "animal": {"enum": ["spider", "insect"]}},
        "required": ["legs", "animal"],
    }
    r = ask(qwen, messages=chat, response_format=_schema_format(schema))
    reply = json.loads(r.choices[0].message.content)
    assert isinstance(reply["legs"], int) and reply["animal"] in ("spider", "insect")
    assert r.choices[0].finish_reason == "stop"
    plain = ask(qwen, messages=chat, response_format={"type": "text"})
    assert _hit(plain) != "memo"  # the schema was part of the key


def test_no_op_values_of_unimplemented_fields_are_accepted(qwen: Running) -> None:
    r = ask(
        qwen,
        messages=[{"role": "user", "content": "Hi"}],
        presence_penalty=0,
        frequency_penalty=0.0,
        logprobs=False,
        logit_bias={},
        max_tokens=2,
    )
    assert r.choices[0].message.content is not None


def test_a_tool_result_goes_back_in_and_the_model_answers(qwen: Running) -> None:
    call = ask(qwen, messages=ASK, tools=[WEATHER]).choices[0].message.tool_calls[0]
    loop = [
        {"role": "system", "content": "Answer from the tool results in one sentence."},
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'},
    ]
    r = ask(qwen, messages=loop, tools=[WEATHER])
    u = r.usage
    assert u is not None and u.prompt_tokens > 0  # the whole loop was rendered and answered
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_the_template_sees_arguments_as_objects_not_double_encoded() -> None:
    template = resolve_model(MODEL).info.chat_template
    assert template is not None
    fmt = ChatFormat("gguf", template)
    msgs = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
                }
            ],
        },
    ]
    text = fmt.render(template_messages(msgs), True, tools=normalize_tools([WEATHER]))
    assert '{"name": "get_weather", "arguments": {"city": "Lisbon"}}' in text
    assert '\\"city\\"' not in text
    schema = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]  # the tools as rendered
    assert json.loads(schema) == normalize_tools([WEATHER])[0]  # as transformers renders them
    assert schema.startswith('{"type": "function", "function": {"name": "get_weather", "desc')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "declared twice"),
        ({"tools": "get_weather"}, "tools: Input should be a valid list"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "'x', which is not among the request's tools (get_weather)",
        ),
        ({"tools": [WEATHER], "tool_choice": {"name": "get_weather"}}, "tool_choice must be"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice must be"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": JSON_OBJECT},
            "cannot both shape one reply",
        ),
        ({"response_format": {"type": "xml"}}, "response_format type must be"),
        ({"response_format": {"type": "json_schema"}}, "json_schema needs"),
        (
            {"response_format": _schema_format({"$ref": "https://example.com/s.json"})},
            "cannot be enforced",
        ),
        ({"logit_bias": {"1": 5}}, "logit_bias={'1': 5} is not implemented"),
        ({"logprobs": True}, "logprobs=True is not implemented"),
        ({"top_logprobs": 2}, "top_logprobs=2 is not implemented"),
        ({"presence_penalty": 0.5}, "presence_penalty=0.5 is not implemented"),
        ({"frequency_penalty": 1}, "frequency_penalty=1"),
        ({"extra_body": {"min_p": 0.05}}, "min_p=0.05 is not implemented"),
        ({"extra_body": {"repeat_penalty": 1.1}}, "remove repeat_penalty"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            "must match",
        ),
    ],
)
def test_bad_tools_are_a_400_that_names_the_problem(
    qwen: Running, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        qwen.client().chat.completions.create(
            model=qwen.state.model_id, messages=ASK, max_tokens=4, **body
        )
    assert message in str(e.value)


def _session(srv: Running, system: str) -> str:
    return str(srv.client().post("/sessions", body={"system": system}, cast_to=object)["id"])  # type: ignore[index]


def _turn(srv: Running, sid: str, messages: list[Any], **kw: Any) -> Any:
    return ask(srv, messages=messages, extra_headers={"X-Continuum-Session": sid}, **kw)


@pytest.mark.slow
def test_a_session_keeps_the_call_as_generated_and_the_tool_loop_appends(qwen: Running) -> None:
    sid = _session(qwen, "Answer from the tool results in one sentence.")
    first = _turn(
        qwen, sid, ASK, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False
    )
    (call,) = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    u1 = first.usage
    # the client re-serialises the arguments (other spacing): the same call by identity
    resent = call.model_dump()
    resent["function"]["arguments"] = json.dumps(json.loads(call.function.arguments), indent=2)
    loop = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [resent]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'},
    ]
    second = _turn(qwen, sid, loop, tools=[TIME, WEATHER], max_tokens=24)  # other order
    m = second.usage.model_extra["continuum"]
    assert m["resets"] == [] and m["tokens_truncated"] == 0
    # everything resident is kept: the prompt and the call's tokens as generated (all but the
    # last, which was sampled, not decoded: it is decoded with the glue the session decodes
    # eagerly after a turn); only the tool result and the headers are new
    assert m["tokens_reused"] >= u1.prompt_tokens + u1.completion_tokens - 1
    assert m["prompt_tokens_evaluated"] < 40
    third = _turn(qwen, sid, loop, tools=[WEATHER], max_tokens=4)  # the tools changed
    (reset,) = third.usage.model_extra["continuum"]["resets"]
    assert reset["reason"] == "divergence" and "tools changed" in reset["detail"]


def test_a_session_turn_without_tools_after_one_with_tools_rebuilds(qwen: Running) -> None:
    sid = _session(qwen, "Be brief.")
    _turn(qwen, sid, ASK, tools=[WEATHER], max_tokens=8)
    r = _turn(qwen, sid, [{"role": "user", "content": "Hi"}], max_tokens=4)
    (reset,) = r.usage.model_extra["continuum"]["resets"]
    assert "tools changed" in reset["detail"] and r.choices[0].message.tool_calls is None
