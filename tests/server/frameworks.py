"""What the framework tests share: the two tools' results, the Agents SDK run's context and its
stop rule, and LangChain's two tools. Each framework test module builds its own agent and loop
around these (the chat and Responses loops differ in what the server must prove)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents import FunctionToolResult, RunContextWrapper, ToolsToFinalOutputResult
from langchain_core.tools import BaseTool, tool

MODEL = "qwen2.5-coder-0.5b"
INSTRUCTIONS = "Use the tools, then answer in one short sentence."
WEATHER, TIME = "sunny, 21 C", "14:05"
BOTH = f"get_time={TIME}; get_weather={WEATHER}"
MAX_TURNS = 4  # the Agents SDK raises MaxTurnsExceeded past this
MAX_STEPS = 3  # model calls in the LangChain loop


@dataclass
class Calls:
    """The run's context: which tools ran, with what city, and what they returned."""

    ran: list[tuple[str, Any, str]] = field(default_factory=list)

    def names(self) -> set[str]:
        return {name for name, _, _ in self.ran}


def when_both_ran(
    ctx: RunContextWrapper[Calls], results: list[FunctionToolResult]
) -> ToolsToFinalOutputResult:
    """The Agents SDK's ``tool_use_behavior``: the run ends once both tools ran, its final
    output made from their results."""
    calls = ctx.context
    if calls.names() >= {"get_weather", "get_time"}:
        summary = "; ".join(f"{name}={out}" for name, _, out in sorted(calls.ran))
        return ToolsToFinalOutputResult(is_final_output=True, final_output=summary)
    return ToolsToFinalOutputResult(is_final_output=False)


@dataclass
class LcRan:
    ran: list[tuple[str, str]] = field(default_factory=list)


LC = LcRan()


@tool("get_weather")
def lc_weather(city: str) -> str:
    """Current weather in a city."""
    LC.ran.append(("get_weather", city))
    return WEATHER


@tool("get_time")
def lc_time(city: str) -> str:
    """Current local time in a city."""
    LC.ran.append(("get_time", city))
    return TIME


LC_TOOLS: dict[str, BaseTool] = {"get_weather": lc_weather, "get_time": lc_time}
