"""Real agent frameworks against the Responses API of a real ``continuum serve`` (in-process,
127.0.0.1, the default model Qwen2.5-Coder-0.5B-Instruct, no mocks): the OpenAI Agents SDK's
``OpenAIResponsesModel`` runs a two-tool agent stateless (every item re-sent each turn), chained
with ``previous_response_id`` (only the new items sent), streamed, and as a full-resend client
with a ``prompt_cache_key`` (a resident session); LangChain's ``ChatOpenAI`` with
``use_responses_api`` runs a tool loop chained by ``use_previous_response_id``, and streams text.

What each framework sent is recorded from its own HTTP client (an ``httpx`` request hook given
through the documented ``http_client`` options), and what the server did is read from the usage
the framework reports and from ``GET /v1/responses/{id}``.

The 0.5B model, given a tool result, tends to call the same tool again, so each loop is capped
and made to finish by what the framework offers: ``required`` / named ``tool_choice`` (which the
server enforces with a grammar, so a call always comes back), a tool-use behaviour that ends
the run once both tools ran, and ``tool_choice="none"`` for the last step of a loop. The tool
list stays the same on every turn (the chat template renders it at the top of the prompt: a
list that changed would leave only the instructions to reuse).

Nothing may leave the machine: the Agents SDK's tracing is disabled globally and per run, and
every connection or name lookup outside loopback is refused and recorded while this module
runs, and fails the test that made it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    AgentHooks,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    RunContextWrapper,
    Runner,
    Tool,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from tests.server.frameworks import (
    BOTH,
    INSTRUCTIONS,
    LC,
    LC_TOOLS,
    MAX_STEPS,
    MAX_TURNS,
    MODEL,
    TIME,
    WEATHER,
    Calls,
    when_both_ran,
)
from tests.server.test_app import Running, _serve

pytestmark = [
    pytest.mark.usefixtures("stays_offline"),
    pytest.mark.slow,
]  # tests/server/conftest.py


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, blocked: list[str]) -> Iterator[Running]:
    set_tracing_disabled(True)  # the SDK's default trace exporter posts to api.openai.com
    yield from _serve(tmp_path_factory.mktemp("rframeworks"), model=MODEL, default_max_tokens=32)


# --- what the frameworks send, what the server stored ----------------------------------------


@dataclass
class Wire:
    """The bodies of the ``POST /v1/responses`` a framework's HTTP client sent, in order."""

    bodies: list[dict[str, Any]] = field(default_factory=list)

    def _record(self, request: httpx.Request) -> None:
        if request.method == "POST" and request.url.path.endswith("/responses"):
            self.bodies.append(json.loads(request.content))

    def sync_client(self) -> httpx.Client:
        return httpx.Client(timeout=120, event_hooks={"request": [self._record]})

    def async_client(self) -> httpx.AsyncClient:
        async def record(request: httpx.Request) -> None:
            self._record(request)

        return httpx.AsyncClient(timeout=120, event_hooks={"request": [record]})


def stored(srv: Running, response_id: str) -> Any:
    """The response as the server stored it (``GET /v1/responses/{id}``, official SDK)."""
    return srv.client().responses.retrieve(response_id)


def extra(response: Any) -> dict[str, Any]:
    return response.usage.model_extra["continuum"]  # type: ignore[no-any-return]


def kinds(items: list[dict[str, Any]]) -> list[str]:
    return [item.get("type", "message") for item in items]


# --- OpenAI Agents SDK -----------------------------------------------------------------------


@function_tool
def get_weather(ctx: RunContextWrapper[Calls], city: str) -> str:
    """Current weather in a city."""
    ctx.context.ran.append(("get_weather", city, WEATHER))
    return WEATHER


@function_tool
def get_time(ctx: RunContextWrapper[Calls], city: str) -> str:
    """Current local time in a city."""
    ctx.context.ran.append(("get_time", city, TIME))
    return TIME


class NameTheOtherTool(AgentHooks[Calls]):
    """After a tool ran, the next turn's ``tool_choice`` names the tool that has not: the model
    writes its arguments, the grammar fixes which tool it calls, and the tool list (at the top
    of the prompt) stays the same, so every turn's prompt extends the one before."""

    async def on_tool_end(
        self, context: RunContextWrapper[Calls], agent: Agent[Calls], tool: Tool, result: object
    ) -> None:
        left = sorted({"get_weather", "get_time"} - context.context.names())
        if left:
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice=left[0])


def _agent(client: AsyncOpenAI, model_id: str, **settings: Any) -> Agent[Calls]:
    """An agent whose run calls both tools, once each, in two model turns, and ends:
    ``tool_choice="required"`` with ``parallel_tool_calls=False`` makes the first turn exactly one
    call, :class:`NameTheOtherTool` makes the second the other tool, ``reset_tool_choice=False``
    keeps the SDK from dropping to ``auto`` in between, and ``tool_use_behavior`` ends the run
    once both ran, its final output made from the tools' results."""
    model = OpenAIResponsesModel(model=model_id, openai_client=client)
    return Agent[Calls](
        name="weather-and-time",
        instructions=INSTRUCTIONS,
        tools=[get_weather, get_time],
        model=model,
        model_settings=ModelSettings(
            temperature=0,
            max_tokens=40,
            tool_choice="required",
            parallel_tool_calls=False,
            **settings,
        ),
        reset_tool_choice=False,
        tool_use_behavior=when_both_ran,
        hooks=NameTheOtherTool(),
    )


def _client(srv: Running, wire: Wire) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=srv.url + "/v1", api_key="x", max_retries=0, http_client=wire.async_client()
    )


NO_TRACING = RunConfig(tracing_disabled=True)


def _run(srv: Running, wire: Wire, question: str, calls: Calls, **kw: Any) -> Any:
    settings = kw.pop("settings", {})

    async def run() -> Any:
        async with _client(srv, wire) as client:
            return await Runner.run(
                _agent(client, srv.state.model_id, **settings),
                question,
                context=calls,
                max_turns=MAX_TURNS,
                run_config=NO_TRACING,
                **kw,
            )

    return asyncio.run(run())


def _assert_both_ran_once(calls: Calls, result: Any) -> None:
    assert sorted(name for name, _, _ in calls.ran) == ["get_time", "get_weather"], calls.ran
    assert all(isinstance(city, str) and city for _, city, _ in calls.ran), calls.ran
    assert result.final_output == BOTH
    assert len(result.raw_responses) == 2  # one call per model turn, then the run ended
    new = [item.type for item in result.new_items]
    assert new.count("tool_call_item") == 2 and new.count("tool_call_output_item") == 2, new
    assert result.context_wrapper.usage.requests == 2


def test_agents_sdk_stateless_run_resends_every_item_and_finishes(srv: Running) -> None:
    wire, calls = Wire(), Calls()
    result = _run(srv, wire, "What is the weather and the local time in Lisbon?", calls)
    _assert_both_ran_once(calls, result)

    first, second = wire.bodies
    assert "previous_response_id" not in first and "previous_response_id" not in second
    assert first["instructions"] == INSTRUCTIONS and first["tool_choice"] == "required"
    # the second request re-sends the first's input, then the call and its output
    sent, added = second["input"][: len(first["input"])], second["input"][len(first["input"]) :]
    assert sent == first["input"] and kinds(added) == ["function_call", "function_call_output"]
    call, output = added
    assert call["call_id"] == output["call_id"] and call["name"] == calls.ran[0][0]
    assert second["tool_choice"] == {"type": "function", "name": calls.ran[1][0]}

    u1, u2 = (r.usage for r in result.raw_responses)
    # the same tools and instructions: the whole first prompt is a prefix of the second
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens > 0
    assert result.context_wrapper.usage.input_tokens == u1.input_tokens + u2.input_tokens


def test_agents_sdk_chained_run_sends_only_the_new_items(srv: Running) -> None:
    wire, calls = Wire(), Calls()
    question = "What is the weather and the local time in Oslo?"
    result = _run(srv, wire, question, calls, auto_previous_response_id=True)
    _assert_both_ran_once(calls, result)

    r1, r2 = result.raw_responses
    first, second = wire.bodies
    assert "previous_response_id" not in first and first["input"][0]["content"] == question
    # the second turn names the first response and sends only the tool's output
    assert second["previous_response_id"] == r1.response_id
    assert kinds(second["input"]) == ["function_call_output"]
    assert stored(srv, r2.response_id).previous_response_id == r1.response_id

    u1, u2 = r1.usage, r2.usage
    # the server put the stored conversation in front: the question, the call, then the output
    assert u2.input_tokens > u1.input_tokens + u1.output_tokens
    # ... and reused it: the first prompt is not decoded again
    assert u2.input_tokens_details.cached_tokens >= u1.input_tokens
    m2 = extra(stored(srv, r2.response_id))
    assert m2["prompt_tokens_evaluated"] == u2.input_tokens - u2.input_tokens_details.cached_tokens
    assert m2["prompt_tokens_evaluated"] < u1.input_tokens

    # a follow-up run continues the finished one with Runner.run(previous_response_id=...)
    follow = Wire()

    async def follow_up() -> Any:
        async with _client(srv, follow) as client:
            agent = _agent(client, srv.state.model_id).clone(
                model_settings=ModelSettings(temperature=0, max_tokens=8, tool_choice="none"),
                hooks=None,
            )
            return await Runner.run(
                agent,
                "Which city was that? One word.",
                context=Calls(),
                max_turns=1,
                previous_response_id=result.last_response_id,
                run_config=NO_TRACING,
            )

    after = asyncio.run(follow_up())
    (body,) = follow.bodies
    assert body["previous_response_id"] == r2.response_id
    assert kinds(body["input"]) == ["message"] and body["input"][0]["role"] == "user"
    assert isinstance(after.final_output, str)
    (r3,) = after.raw_responses
    assert r3.usage.input_tokens > u2.input_tokens  # the whole run's conversation, then this
    assert r3.usage.input_tokens_details.cached_tokens >= u2.input_tokens
    assert stored(srv, r3.response_id).previous_response_id == r2.response_id


def test_agents_sdk_streamed_run_over_responses_events(srv: Running) -> None:
    wire, calls = Wire(), Calls()

    async def run() -> tuple[list[str], Any]:
        seen: list[str] = []
        async with _client(srv, wire) as client:
            streamed = Runner.run_streamed(
                _agent(client, srv.state.model_id),
                "What is the weather and the local time in Paris?",
                context=calls,
                max_turns=MAX_TURNS,
                run_config=NO_TRACING,
                auto_previous_response_id=True,
            )
            async for event in streamed.stream_events():
                if event.type == "raw_response_event":
                    seen.append(event.data.type)
                elif event.type == "run_item_stream_event":
                    seen.append(event.item.type)
            return seen, streamed

    seen, streamed = asyncio.run(run())
    assert all(body.get("stream") is True for body in wire.bodies) and len(wire.bodies) == 2
    assert seen.count("response.completed") == 2, seen
    assert seen.count("response.function_call_arguments.done") == 2, seen
    assert seen.count("tool_call_item") == 2 and seen.count("tool_call_output_item") == 2, seen
    assert seen.index("tool_call_item") < seen.index("tool_call_output_item")
    assert streamed.is_complete and streamed.current_turn == 2
    assert streamed.final_output == BOTH
    assert sorted(name for name, _, _ in calls.ran) == ["get_time", "get_weather"], calls.ran
    r1, r2 = streamed.raw_responses
    assert wire.bodies[1]["previous_response_id"] == r1.response_id
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens > 0


def test_agents_sdk_full_resend_with_a_prompt_cache_key_runs_on_a_session(
    srv: Running,
) -> None:
    """``ModelSettings.extra_args`` carries the key (the SDK adds one of its own only for
    OpenAI's servers): every turn re-sends all items, the server appends them to one resident
    session, so the second turn decodes only what is new, the forced call's reply included."""
    wire, calls = Wire(), Calls()
    key = f"agents-{uuid.uuid4().hex}"
    question = "What is the weather and the local time in Rome?"
    result = _run(srv, wire, question, calls, settings={"extra_args": {"prompt_cache_key": key}})
    _assert_both_ran_once(calls, result)
    assert [body.get("prompt_cache_key") for body in wire.bodies] == [key, key]
    assert kinds(wire.bodies[1]["input"]) == ["message", "function_call", "function_call_output"]

    r1, r2 = result.raw_responses
    m1, m2 = (extra(stored(srv, r.response_id)) for r in (r1, r2))
    assert m1["session"] == m2["session"] and m2["turn"] == m1["turn"] + 1
    assert m2["tokens_truncated"] == 0 and m2["resets"] == []
    assert m2["tokens_reused"] >= r1.usage.input_tokens + r1.usage.output_tokens - 1
    assert m2["prompt_tokens_evaluated"] < 40  # the tool's output and its headers
    assert r2.usage.input_tokens_details.cached_tokens == m2["tokens_reused"]


# --- LangChain -------------------------------------------------------------------------------


def _chat(srv: Running, wire: Wire, **kw: Any) -> ChatOpenAI:
    kw.setdefault("max_tokens", 40)
    return ChatOpenAI(
        base_url=srv.url + "/v1",
        api_key="x",  # type: ignore[arg-type]
        model=srv.state.model_id,
        temperature=0,
        max_retries=0,
        timeout=120,
        http_client=wire.sync_client(),
        use_responses_api=True,
        **kw,
    )


def _assert_a_valid_call(call: dict[str, Any]) -> None:
    """A parsed call to a declared tool with its one argument (a call made under ``auto`` is
    not grammar-bound: the small model may add a key copied from the schema)."""
    assert call["name"] in LC_TOOLS, call
    assert isinstance(call["args"], dict) and isinstance(call["args"].get("city"), str), call
    assert isinstance(call["id"], str) and call["id"].startswith("call_"), call


def _lc_loop(steps: list[Any], messages: list[BaseMessage]) -> list[AIMessage]:
    LC.ran.clear()
    replies: list[AIMessage] = []
    for step in steps:
        reply = step.invoke(messages)
        assert isinstance(reply, AIMessage)
        replies.append(reply)
        if not reply.tool_calls:
            break
        messages.append(reply)
        for call in reply.tool_calls:
            _assert_a_valid_call(dict(call))
            out = LC_TOOLS[call["name"]].invoke({"city": call["args"]["city"]})
            messages.append(ToolMessage(content=out, tool_call_id=call["id"]))
    return replies


def test_langchain_tool_loop_chains_with_previous_response_id(srv: Running) -> None:
    wire = Wire()
    llm = _chat(srv, wire, use_previous_response_id=True)
    tools = list(LC_TOOLS.values())
    # a call is guaranteed on the first step, free on the next, and the last step (the cap)
    # may not call: the loop always ends on a text answer within MAX_STEPS model calls
    steps = [
        llm.bind_tools(tools, tool_choice="required"),
        *[llm.bind_tools(tools)] * (MAX_STEPS - 2),
        llm.bind_tools(tools, tool_choice="none"),
    ]
    messages: list[BaseMessage] = [
        SystemMessage(INSTRUCTIONS),
        HumanMessage("What is the weather in Madrid?"),
    ]
    replies = _lc_loop(steps, messages)
    assert 2 <= len(replies) <= MAX_STEPS and len(wire.bodies) == len(replies)
    first, second, last = replies[0], replies[1], replies[-1]
    assert first.tool_calls and first.response_metadata["status"] == "completed"
    made = [(c["name"], c["args"].get("city")) for r in replies for c in r.tool_calls]
    assert LC.ran == made  # every parsed call ran, once, with its parsed arguments
    assert not last.tool_calls and isinstance(last.text, str)

    # the first request carries the whole conversation; each later one names the response
    # before it and carries only the tools' outputs
    assert "previous_response_id" not in wire.bodies[0]
    assert kinds(wire.bodies[0]["input"]) == ["message", "message"]
    for before, reply, body in zip(replies, replies[1:], wire.bodies[1:], strict=False):
        assert body["previous_response_id"] == before.response_metadata["id"]
        assert set(kinds(body["input"])) == {"function_call_output"}, body["input"]
        assert stored(srv, reply.response_metadata["id"]).previous_response_id == before.id

    u1, u2 = first.usage_metadata, second.usage_metadata
    assert u1 is not None and u2 is not None
    cached = u2["input_token_details"].get("cache_read")
    # the server put the stored conversation in front of the output, and reused its prompt
    assert u2["input_tokens"] > u1["input_tokens"] + u1["output_tokens"]
    assert cached is not None and cached >= u1["input_tokens"] > 0, u2
    m2 = extra(stored(srv, second.response_metadata["id"]))
    assert m2["prompt_tokens_evaluated"] == u2["input_tokens"] - cached


def test_langchain_chained_forced_call_reply_is_not_decoded_again(srv: Running) -> None:
    wire = Wire()
    llm = _chat(srv, wire, use_previous_response_id=True)
    tools = list(LC_TOOLS.values())
    messages: list[BaseMessage] = [HumanMessage("What is the local time in Rome?")]
    steps = [
        llm.bind_tools(tools, tool_choice="get_time"),
        llm.bind_tools(tools, tool_choice="none", max_tokens=8),
    ]
    replies = _lc_loop(steps, messages)
    assert len(replies) == 2 and wire.bodies[1]["previous_response_id"] == replies[0].id
    u1, u2 = replies[0].usage_metadata, replies[1].usage_metadata
    assert u1 is not None and u2 is not None
    # the first prompt and the forced call as generated are reused: its <tool_call> tags are
    # sampled as the vocabulary's own tokens, so the stored text re-tokenises to them; only
    # the last characters, which the grammar may split into other tokens than the tokenizer
    # would ("}" "}\n" for "}}\n"), can be decoded again
    cached = u2["input_token_details"]["cache_read"]
    assert cached >= u1["input_tokens"] + u1["output_tokens"] - 4


def test_langchain_stream_accumulates_text(srv: Running) -> None:
    wire = Wire()
    llm = _chat(srv, wire, max_tokens=16)
    chunks: list[AIMessageChunk] = []
    for chunk in llm.stream([HumanMessage("Count to three.")]):
        assert isinstance(chunk, AIMessageChunk)
        chunks.append(chunk)
    (body,) = wire.bodies
    assert body["stream"] is True and "previous_response_id" not in body
    texts = [c.text for c in chunks if c.text]
    assert len(texts) >= 2  # the text came in pieces, as it was generated
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert isinstance(full, AIMessageChunk) and full.text == "".join(texts) != ""
    assert full.tool_calls == [] and full.invalid_tool_calls == []
    assert full.response_metadata["status"] in ("completed", "incomplete")
    assert full.usage_metadata is not None and full.usage_metadata["output_tokens"] > 0
    rid = full.response_metadata["id"]
    assert stored(srv, rid).output_text == full.text
