"""The controlled conversation of seed 000's experiment: 16 user turns, 5 retention checks.

Facts are stated early; five later turns ask for them back. A check passes when the reply
contains the expected answer (case-insensitive). The optional long system prompt is built from
a fixed text so every run, mode and machine sees the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UserTurn:
    content: str
    expect: str | None = None  # a retention check: the reply must contain this


SYSTEM = (
    "You are Eva, a concise personal assistant. Remember everything the user tells you about "
    "themselves and answer questions about it exactly. Keep every answer to one short sentence."
)

TURNS: tuple[UserTurn, ...] = (
    UserTurn("Hi! My name is Priya and I work as a marine biologist."),
    UserTurn("I have a dog named Biscuit."),
    UserTurn("What is a good way to start learning Spanish?"),
    UserTurn("My favourite colour is teal."),
    UserTurn("I live in the city of Lisbon."),
    UserTurn("Can you suggest a quick breakfast idea?"),
    UserTurn("My lucky number is 47."),
    UserTurn("What is my name?", expect="Priya"),
    UserTurn("Tell me one fact about octopuses."),
    UserTurn("What is my dog's name?", expect="Biscuit"),
    UserTurn("Give me one tip for staying focused."),
    UserTurn("Which city do I live in?", expect="Lisbon"),
    UserTurn("What is a haiku?"),
    UserTurn("What is my favourite colour?", expect="teal"),
    UserTurn("Name a famous painting."),
    UserTurn("What is my lucky number?", expect="47"),
)

_POLICY_WORDS = (
    "The assistant follows the operating handbook below. Section {n}: when a request concerns "
    "records, schedules, inventory, shipping, invoices, travel or support tickets, identify the "
    "record by its number, confirm the owner, check the status field, and summarise the change "
    "in one sentence. Never invent a record number; ask for it instead. Escalate item {n} to a "
    "human when the amount exceeds {amount} euros or the customer mentions a deadline. "
)


def long_system_prompt(approx_tokens: int) -> str:
    """SYSTEM followed by a deterministic handbook of roughly ``approx_tokens`` tokens
    (about 4 characters per token; the exact count is measured and printed by the bench)."""
    parts = [SYSTEM, "\n\n"]
    n = 1
    while sum(map(len, parts)) < approx_tokens * 4.6:
        parts.append(_POLICY_WORDS.format(n=n, amount=100 + 37 * n))
        n += 1
    return "".join(parts)


def n_ctx_for(prompt_tokens: int, turns: int, max_tokens: int) -> int:
    """A context that holds the whole conversation under continuum's high-water mark (90% of
    n_ctx), so no mode rebuilds mid-run; rounded up to 256. Every mode gets the same one."""
    need = prompt_tokens + turns * (max_tokens + 48) + 512
    return -(-max(2048, int(need / 0.9) + 1) // 256) * 256


def check(turn: UserTurn, reply: str) -> bool | None:
    if turn.expect is None:
        return None
    return turn.expect.lower() in reply.lower()
