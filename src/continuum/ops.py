"""The two kinds of call an agent makes: a model call (:class:`TokenOp`) and a side-effecting
tool call (:class:`ToolOp`).

A ``TokenOp`` is pure given its key (DESIGN.md §3.6), so its result may be reused. A ``ToolOp``
has side effects and always runs, unless the tool is declared read-only (idempotent), which opts
it into memoisation (§3.7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from continuum.errors import InvalidRequest
from continuum.messages import Message, normalize_messages
from continuum.params import GenerationParams
from continuum.toolcalls import normalize_tools


@dataclass(frozen=True)
class TokenOp:
    """A model call: an op name, either chat ``messages`` or a raw ``prompt``, and decode
    parameters (``params`` as :class:`GenerationParams` or a dict of its fields). ``tools``
    (OpenAI function tools, chat only) are rendered into the prompt by the model's template, in
    a canonical order, so they are part of the prompt's tokens and of every key.

    ``affinity`` names the conversation the call belongs to (a client's session hint): a remote
    backend sends it to the router in front of its servers, which keeps the conversation where
    its KV is. It is in no key and never changes the answer."""

    op_name: str
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    params: GenerationParams = field(default_factory=GenerationParams)
    tools: tuple[dict[str, Any], ...] | None = None
    affinity: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op_name, str) or not self.op_name:
            raise InvalidRequest(f"op_name must be a non-empty string, got {self.op_name!r}")
        if self.affinity is not None and not (isinstance(self.affinity, str) and self.affinity):
            raise InvalidRequest(
                f"affinity must be a non-empty string (the conversation's name) or None, "
                f"got {self.affinity!r}"
            )
        if (self.messages is None) == (self.prompt is None):
            raise InvalidRequest("a TokenOp takes exactly one of messages= or prompt=")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(normalize_messages(list(self.messages))))
        if self.tools is not None:
            if self.messages is None:
                raise InvalidRequest("tools need chat messages, not a prompt")
            object.__setattr__(self, "tools", normalize_tools(self.tools) or None)
        if self.prompt is not None and not isinstance(self.prompt, str):
            raise InvalidRequest(f"prompt must be a string, got {type(self.prompt).__name__}")
        if isinstance(self.params, Mapping):
            object.__setattr__(self, "params", GenerationParams.from_dict(dict(self.params)))
        if not isinstance(self.params, GenerationParams):
            raise InvalidRequest("params must be GenerationParams or a dict of its fields")
        self.params.validate()


@dataclass(frozen=True)
class ToolOp:
    """A tool call. ``fn(**args)`` runs every time unless ``read_only`` is declared, in which case
    its result may be memoised under the tool name and canonical arguments."""

    name: str
    fn: Callable[..., Any]
    args: Mapping[str, Any] = field(default_factory=dict)
    read_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidRequest(f"tool name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise InvalidRequest(f"tool {self.name!r}: fn must be callable")
        if not isinstance(self.args, Mapping):
            raise InvalidRequest(f"tool {self.name!r}: args must be a mapping")
