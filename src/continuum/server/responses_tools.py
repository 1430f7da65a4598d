"""The Responses API's ``tools``: what the model is offered, and what its calls come back as.

A Responses request names tools of several types; the model is offered function tools only
(its chat template renders them), and every call it makes comes back as the item the client
expects:

- ``function``: offered as it is; a call is a ``function_call`` item.
- ``namespace``: its function and custom tools are offered by their own names (the namespace's
  description leads each one's); a call is the item of the inner tool's type carrying
  ``namespace``, as OpenAI's API returns it. The names the model sees must be unique, so a
  namespace whose tool shares a name with another tool, or a namespace named like a tool, is a
  400 that names both.
- ``custom`` (freeform: Codex's ``apply_patch`` on some models): offered as a function taking
  one string, ``input``; a call is a ``custom_tool_call`` item with that input.
- hosted tools the server cannot run (``web_search``, ``file_search``, ...): agent clients send
  them on every request (Codex sends ``web_search``), so by default they are left out of the
  prompt — named in the response's ``continuum.left_out`` and logged —, and with
  ``--hosted-tools refuse`` they are a 400, as is any type nobody knows.

Everything here is decided from the request alone, before any work.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from continuum.errors import InvalidRequest
from continuum.toolcalls import ToolCall

log = logging.getLogger(__name__)

HostedTools = Literal["leave-out", "refuse"]
HOSTED_MODES: tuple[HostedTools, ...] = ("leave-out", "refuse")

# tool types OpenAI's servers run (or whose calls only they can express): this server cannot
HOSTED = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "image_generation",
        "computer_use",
        "computer_use_preview",
        "code_interpreter",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "tool_search",
    }
)
MAX_TOOLS = 512  # callable tools in one request, namespaces' tools included
CUSTOM_INPUT = "input"  # the one argument a custom tool is offered with


@dataclass(frozen=True, slots=True)
class Offered:
    """A tool the model is offered: its type, and the namespace it came in (if any)."""

    kind: Literal["function", "custom"]
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class ResponsesTools:
    """A request's tools, read: ``chat`` the function tools the model is offered (None: no
    tools), ``offered`` each one's origin by the name the model calls it by, ``left_out`` the
    hosted tools left out of the prompt."""

    chat: list[dict[str, Any]] | None = None
    offered: dict[str, Offered] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()

    def item(self, call: ToolCall) -> dict[str, Any]:
        """The output item of a call the model made."""
        origin = self.offered.get(call.name, Offered("function"))
        if origin.kind == "custom":
            item: dict[str, Any] = {
                "type": "custom_tool_call",
                "id": f"ctc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.name,
                "input": custom_input(call.arguments),
                "status": "completed",
            }
        else:
            item = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        if origin.namespace is not None:
            item["namespace"] = origin.namespace
        return item


def custom_input(arguments: str) -> str:
    """A custom tool call's input: the ``input`` string the model wrote as its argument (its
    arguments as written when it wrote something else)."""
    try:
        data = json.loads(arguments)
    except ValueError:
        return arguments
    value = data.get(CUSTOM_INPUT) if isinstance(data, dict) else None
    return value if isinstance(value, str) else arguments


def custom_arguments(text: str) -> str:
    """A custom tool call's input as the function arguments the model was offered."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def read_tools(raw: object, hosted: HostedTools = "leave-out") -> ResponsesTools:
    """The request's ``tools`` read (see the module docstring); a 400 naming the first tool
    that cannot be offered."""
    if raw is None:
        return ResponsesTools()
    if not isinstance(raw, list):
        raise InvalidRequest("tools must be a list of tools (function, namespace, custom)")
    reader = _Reader(hosted)
    for i, tool in enumerate(raw):
        reader.tool(tool, f"tools[{i}]", None)
    if reader.left_out:
        log.info("hosted tools left out of the prompt: %s", ", ".join(reader.left_out))
    return ResponsesTools(reader.chat or None, reader.offered, tuple(reader.left_out))


@dataclass
class _Reader:
    hosted: HostedTools
    chat: list[dict[str, Any]] = field(default_factory=list)
    offered: dict[str, Offered] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # a name -> where it was declared
    left_out: list[str] = field(default_factory=list)

    def tool(self, tool: object, where: str, namespace: dict[str, Any] | None) -> None:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or not isinstance(kind, str):
            raise InvalidRequest(f"{where} must be an object with a 'type'")
        if kind == "function":
            self._offer(tool, where, "function", namespace, tool.get("parameters"))
        elif kind == "custom":
            self._offer(tool, where, "custom", namespace, _custom_schema(tool, where))
        elif kind == "namespace" and namespace is None:
            self._namespace(tool, where)
        elif kind in HOSTED and namespace is None:
            if self.hosted == "refuse":
                raise InvalidRequest(
                    f"{where}: tools of type {kind!r} run on OpenAI's servers and this server "
                    "cannot run them (it was started with --hosted-tools refuse); remove the "
                    "tool, or restart without that flag to leave such tools out"
                )
            self.left_out.append(kind)
        else:
            inside = " inside a namespace" if namespace is not None else ""
            raise InvalidRequest(
                f"{where}: tools of type {kind!r} are not supported{inside} (function, "
                f"namespace and custom tools are; hosted tools such as web_search are left out)"
            )

    def _namespace(self, tool: dict[str, Any], where: str) -> None:
        name, inner = tool.get("name"), tool.get("tools")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{where}: a namespace tool needs a name")
        if not isinstance(inner, list) or not inner:
            raise InvalidRequest(
                f"{where}: namespace {name!r} has no tools; send its function tools in "
                "'tools', or drop the namespace"
            )
        self._claim(name, where, "the namespace")
        for j, sub in enumerate(inner):
            self.tool(sub, f"{where}.tools[{j}]", tool)

    def _offer(
        self,
        tool: dict[str, Any],
        where: str,
        kind: Literal["function", "custom"],
        namespace: dict[str, Any] | None,
        parameters: object,
    ) -> None:
        name = tool.get("name")
        if not isinstance(name, str):
            raise InvalidRequest(f"{where}: a {kind} tool needs a name")
        self._claim(name, where, f"the {kind} tool")
        fn: dict[str, Any] = {"name": name}
        desc = tool.get("description")
        if desc is not None and not isinstance(desc, str):
            raise InvalidRequest(f"{where}.description must be a string")
        ns_desc = namespace.get("description") if namespace is not None else None
        if isinstance(ns_desc, str) and ns_desc:
            desc = f"{ns_desc} {desc}" if desc else ns_desc
        if desc:
            fn["description"] = desc
        if parameters is not None:
            fn["parameters"] = parameters
        self.chat.append({"type": "function", "function": fn})
        ns_name = namespace["name"] if namespace is not None else None
        self.offered[name] = Offered(kind, ns_name)
        if len(self.offered) > MAX_TOOLS:
            raise InvalidRequest(
                f"more than {MAX_TOOLS} callable tools in one request: send fewer (each is "
                "rendered into the prompt)"
            )

    def _claim(self, name: str, where: str, what: str) -> None:
        if name in self.where:
            raise InvalidRequest(
                f"{where}: {what} {name!r} has the name of {self.where[name]}; the model calls "
                "tools by name, so every tool and namespace needs a name of its own: rename one"
            )
        self.where[name] = f"{what} at {where}"


def _custom_schema(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """The function parameters a custom tool is offered with: one string, described by the
    tool's input format (a grammar or free text)."""
    fmt = tool.get("format")
    hint = "The tool's input, as free text."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax"), fmt.get("definition")
        if not isinstance(definition, str):
            raise InvalidRequest(f"{where}.format: a grammar format needs a definition string")
        hint = f"The tool's input, following this {syntax or 'grammar'} grammar:\n{definition}"
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise InvalidRequest(f"{where}.format must be {{'type': 'text'}} or a grammar format")
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": hint}},
        "required": [CUSTOM_INPUT],
    }


__all__ = [
    "HOSTED",
    "HOSTED_MODES",
    "HostedTools",
    "Offered",
    "ResponsesTools",
    "custom_arguments",
    "custom_input",
    "read_tools",
]
