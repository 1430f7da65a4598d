"""Real agent frameworks against a real ``continuum serve`` (in-process, 127.0.0.1, the default
model Qwen2.5-Coder-0.5B-Instruct, no mocks): the OpenAI Agents SDK and LangChain drive tool
calling on /v1/chat/completions, plain and streamed, and see the server's prefix reuse in the
usage they report.

The 0.5B model, given a tool result under ``tool_choice="auto"``, tends to call the same tool
again (or to write the call out as text) instead of answering, so every loop here is capped and
made to finish by what the framework itself offers: ``required`` / named ``tool_choice`` (which
the server enforces with a grammar, so a call always comes back), tools enabled per turn, a
tool-use behaviour that ends the run, and ``tool_choice="none"`` for the last step of a loop.

Nothing may leave the machine: the Agents SDK's tracing (which would export to api.openai.com)
is disabled globally and per run, and every connection or name lookup outside loopback is
refused and recorded while this module runs, and fails the test that made it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    AgentBase,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunContextWrapper,
    Runner,
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
    yield from _serve(tmp_path_factory.mktemp("frameworks"), model=MODEL, default_max_tokens=48)


# --- OpenAI Agents SDK -----------------------------------------------------------------------


def _until_it_ran(name: str) -> Any:
    def enabled(ctx: RunContextWrapper[Calls], agent: AgentBase) -> bool:
        return name not in ctx.context.names()

    return enabled


@function_tool(is_enabled=_until_it_ran("get_weather"))
def get_weather(ctx: RunContextWrapper[Calls], city: str) -> str:
    """Current weather in a city."""
    ctx.context.ran.append(("get_weather", city, WEATHER))
    return WEATHER


@function_tool(is_enabled=_until_it_ran("get_time"))
def get_time(ctx: RunContextWrapper[Calls], city: str) -> str:
    """Current local time in a city."""
    ctx.context.ran.append(("get_time", city, TIME))
    return TIME


def _agent(client: AsyncOpenAI, model_id: str) -> Agent[Calls]:
    """An agent whose run always calls both tools, once each, in two model turns, and ends.

    - ``tool_choice="required"`` with ``parallel_tool_calls=False``: every model turn is exactly
      one call (the server's grammar enforces it), never free text the loop would mis-handle;
    - ``reset_tool_choice=False`` keeps ``required`` after the first call (the SDK's default
      would drop to ``auto``, where this model re-calls the tool or writes the call as text);
    - each tool is enabled (``is_enabled``) only until it has run, so the second turn can only
      call the other one: the model picks the order, not whether both run;
    - ``tool_use_behavior``: once both have run the run ends, its final output made from the
      tools' results (a third turn would have no tool left to call under ``required``)."""
    model = OpenAIChatCompletionsModel(model=model_id, openai_client=client)
    return Agent[Calls](
        name="weather-and-time",
        instructions=INSTRUCTIONS,
        tools=[get_weather, get_time],
        model=model,
        model_settings=ModelSettings(
            temperature=0, max_tokens=40, tool_choice="required", parallel_tool_calls=False
        ),
        reset_tool_choice=False,
        tool_use_behavior=when_both_ran,
    )


def _client(srv: Running) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)


NO_TRACING = RunConfig(tracing_disabled=True)


def _assert_both_ran_once(calls: Calls) -> None:
    assert sorted(name for name, _, _ in calls.ran) == ["get_time", "get_weather"], calls.ran
    assert all(isinstance(city, str) and city for _, city, _ in calls.ran), calls.ran


def test_agents_sdk_runs_both_tools_and_finishes(srv: Running) -> None:
    async def run() -> Any:
        async with _client(srv) as client:
            agent = _agent(client, srv.state.model_id)
            return await Runner.run(
                agent,
                "What is the weather and the local time in Lisbon?",
                context=calls,
                max_turns=MAX_TURNS,
                run_config=NO_TRACING,
            )

    calls = Calls()
    result = asyncio.run(run())
    _assert_both_ran_once(calls)
    assert isinstance(result.final_output, str) and result.final_output == BOTH
    assert len(result.raw_responses) == 2  # one call per model turn, then the run ended
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == 2 and kinds.count("tool_call_output_item") == 2
    # the second turn repeats the first's prompt up to the tool list, which shrank
    second = result.raw_responses[1].usage
    assert second.requests == 1 and second.input_tokens_details.cached_tokens > 0
    assert result.context_wrapper.usage.requests == 2


def test_agents_sdk_streamed_run_emits_tool_call_and_output_items(srv: Running) -> None:
    async def run() -> tuple[list[str], Any]:
        seen: list[str] = []
        async with _client(srv) as client:
            agent = _agent(client, srv.state.model_id)
            streamed = Runner.run_streamed(
                agent,
                "What is the weather and the local time in Oslo?",
                context=calls,
                max_turns=MAX_TURNS,
                run_config=NO_TRACING,
            )
            async for event in streamed.stream_events():
                if event.type == "run_item_stream_event":
                    seen.append(event.item.type)
            return seen, streamed

    calls = Calls()
    seen, streamed = asyncio.run(run())
    assert seen.count("tool_call_item") == 2 and seen.count("tool_call_output_item") == 2, seen
    assert seen.index("tool_call_item") < seen.index("tool_call_output_item")
    _assert_both_ran_once(calls)
    assert streamed.is_complete and streamed.current_turn == 2
    assert streamed.final_output == BOTH


# --- LangChain -------------------------------------------------------------------------------


def _chat(srv: Running, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=srv.url + "/v1",
        api_key="x",  # type: ignore[arg-type]
        model=srv.state.model_id,
        temperature=0,
        max_tokens=40,  # type: ignore[call-arg]
        max_retries=0,
        timeout=120,
        **kw,
    )


def _assert_a_valid_call(call: dict[str, Any]) -> None:
    assert call["name"] in LC_TOOLS, call
    assert isinstance(call["args"], dict) and set(call["args"]) <= {"city"}, call
    assert all(isinstance(v, str) for v in call["args"].values()), call
    assert isinstance(call["id"], str) and call["id"].startswith("call_"), call


def test_langchain_tool_loop_reuses_the_conversation_prefix(srv: Running) -> None:
    llm = _chat(srv)
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
        HumanMessage("What is the weather in Lisbon?"),
    ]
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
            out = LC_TOOLS[call["name"]].invoke(call["args"])
            messages.append(ToolMessage(content=out, tool_call_id=call["id"]))
    assert 2 <= len(replies) <= MAX_STEPS
    first, second, last = replies[0], replies[1], replies[-1]
    assert first.tool_calls and first.response_metadata["finish_reason"] == "tool_calls"
    made = [(c["name"], c["args"].get("city")) for r in replies for c in r.tool_calls]
    assert LC.ran == made  # every parsed call ran, once, with its parsed arguments
    assert not last.tool_calls and isinstance(last.content, str)

    usage, before = second.response_metadata["token_usage"], first.response_metadata["token_usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    # the second request starts with the whole first prompt: the prefix KV tier reuses it
    assert cached >= before["prompt_tokens"] > 0, usage
    assert usage["continuum"]["tokens_reused"] == cached
    assert usage["continuum"]["prompt_tokens_evaluated"] == usage["prompt_tokens"] - cached
    assert second.usage_metadata is not None
    assert second.usage_metadata["input_token_details"].get("cache_read") == cached


def test_langchain_stream_accumulates_tool_call_chunks_into_a_call(srv: Running) -> None:
    llm = _chat(srv, stream_usage=True).bind_tools(
        list(LC_TOOLS.values()), tool_choice="get_time"
    )  # a named tool: the grammar makes it the one called, whatever the question
    chunks: list[AIMessageChunk] = []
    for chunk in llm.stream([HumanMessage("What is the weather in Oslo?")]):
        assert isinstance(chunk, AIMessageChunk)
        chunks.append(chunk)
    pieces = [tc for c in chunks for tc in c.tool_call_chunks]
    assert pieces and all(p["index"] == 0 for p in pieces)  # one call, possibly in pieces
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert full.invalid_tool_calls == []
    (call,) = full.tool_calls
    _assert_a_valid_call(dict(call))
    assert call["name"] == "get_time"
    assert full.response_metadata["finish_reason"] == "tool_calls"
    assert full.usage_metadata is not None and full.usage_metadata["output_tokens"] > 0
