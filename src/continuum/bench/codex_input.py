"""The requests of ``continuum bench codex``: a synthetic stand-in for what the Codex CLI sends.

Codex 0.169's requests were captured from ``codex exec`` against a capture server; their text is
Codex's and is not copied here. What is kept is their shape and size, built deterministically
from a fixed seed so every run, server and machine sees the same bytes:

- ``POST /v1/responses`` with ``stream: true``, ``store: false``, ``instructions: ""``,
  ``prompt_cache_key`` and a ``session-id`` header (one uuid per session), ``tool_choice:
  "auto"``, ``parallel_tool_calls: true``, ``reasoning: {"summary": "auto"}``, ``include:
  ["reasoning.encrypted_content"]`` and ``client_metadata``;
- ``tools``: 8 function tools with Codex's names (``exec_command``, whose schema is about 1.5k
  characters as Codex's is, ``write_stdin``, ``request_user_input``, ``view_image``,
  ``update_plan``, ``get_goal``, ``create_goal``, ``update_goal``), the ``multi_agent_v1``
  namespace of 5 function tools, and the hosted ``web_search`` tool: about 16k characters of
  JSON, which with the messages below makes a first prompt of about 8.4k tokens on
  Qwen2.5-Coder, as Codex's does;
- ``input``: a developer message of about 17.7k characters (agent instructions: numbered rules
  about coding, drawn from word lists by the seed), a developer message of about 2.6k characters
  (a skills list), a user message with the ``<environment_context>`` (cwd, shell, date), and the
  task. Sessions share everything but the task (agents started in one repository).
- each later step of the tool loop re-sends the whole input plus the model's previous reply as
  an ``exec_command`` ``function_call`` and its ``function_call_output`` of 200-2,000
  characters: both constructed here from the seed, never taken from what a model replied, so
  every server is sent identical input.

Two request fields Codex does not send are added for a benchmark: ``temperature: 0`` (greedy)
and a small ``max_output_tokens``; the model field is ``continuum`` (llama-server ignores it).
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

Item = dict[str, Any]

SECTIONS = (
    "Reading the repository",
    "Editing files",
    "Running commands",
    "Tests",
    "Version control",
    "Planning",
    "Talking to the user",
    "Sandbox and approvals",
    "Code style",
    "Reviewing your changes",
    "Dependencies",
    "Final answers",
)
VERBS = (
    "Read",
    "Check",
    "Prefer",
    "Keep",
    "Run",
    "Leave alone",
    "Quote",
    "Summarise",
    "Verify",
    "Record",
    "Compare",
    "Search for",
    "Format",
    "Explain",
    "Group",
)
OBJECTS = (
    "the smallest relevant file",
    "the failing test's output",
    "existing helper functions",
    "the project's formatter",
    "unrelated files",
    "the exact error message",
    "each changed function",
    "the public interface",
    "the history of the file",
    "configuration files",
    "the lock file",
    "the test that covers the change",
    "long command output",
    "paths relative to the working directory",
    "the user's stated constraints",
)
WHEN = (
    "before you edit anything",
    "after every change",
    "when a command fails",
    "when the task is ambiguous",
    "unless the user asks otherwise",
    "when more than one file is involved",
    "before you answer",
    "while a long command runs",
    "when the sandbox refuses a write",
    "as soon as the plan changes",
    "when tests are slow",
    "if the repository has its own conventions",
)
WHY = (
    "so the next step starts from facts",
    "because a guess costs more than a read",
    "so that the diff stays small",
    "which keeps the review short",
    "since the user may be reading along",
    "so failures are caught early",
    "because the sandbox may hide side effects",
    "so the result can be repeated",
    "which avoids surprising the user",
    "since other agents may share the workspace",
)
COMMANDS = (
    "rg -n 'def parse' src",
    "sed -n 1,80p src/ledger/io.py",
    "pytest -q tests/test_io.py",
    "git status --short",
    "git diff --stat",
    "ls -la src/ledger",
    "python -m mypy src",
    "ruff check src tests",
    "cat pyproject.toml",
    "rg --files | head -50",
)
SKILLS = (
    ("changelog", "writes release notes from the commits since the last tag"),
    ("pdf-reader", "extracts text and tables from PDF files in the workspace"),
    ("sql-migrations", "drafts and checks schema migrations for SQLite and Postgres"),
    ("flaky-tests", "reruns a failing test in isolation and reports whether it is flaky"),
    ("dependency-audit", "lists outdated and vulnerable packages of a lock file"),
    ("docstrings", "adds or repairs docstrings in the style the module already uses"),
    ("benchmarks", "runs a benchmark twice and compares the medians"),
    ("bisect", "finds the commit that broke a test with git bisect"),
    ("profiling", "profiles a slow command and names its hottest functions"),
    ("api-docs", "regenerates reference pages from the public API"),
)
TASKS = (
    "The tests in tests/test_io.py fail since yesterday. Find out why and fix the bug.",
    "Add a --dry-run flag to the `ledger import` command and a test for it.",
    "Explain what src/ledger/rates.py does and list the functions nobody calls.",
    "Rename the helper `to_cents` to `as_cents` everywhere and keep the tests green.",
    "The CSV export drops the last row. Reproduce it with a test, then fix it.",
    "Make `ledger report` print totals aligned to the right. Change nothing else.",
    "Find where the currency is hard-coded and read it from the config file instead.",
    "Write a short README section on how to run the tests.",
)
STATUSES = ("pending", "in_progress", "completed")
CWD = "/home/agent/projects/ledger"
ENVIRONMENT = (
    "<environment_context>\n"
    f"  <cwd>{CWD}</cwd>\n"
    "  <shell>bash</shell>\n"
    "  <current_date>2026-03-14</current_date>\n"
    "  <timezone>Etc/UTC</timezone>\n"
    "</environment_context>"
)


@dataclass(frozen=True, slots=True)
class CodexShape:
    """The sizes of the stand-in and the seed that draws its text; the defaults are Codex
    0.169's sizes, and make a first prompt of about 8.4k tokens on Qwen2.5-Coder as Codex's
    does."""

    seed: int = 169
    instructions_chars: int = 17_700
    skills_chars: int = 2_600
    tools_chars: int = 16_000
    output_chars: tuple[int, int] = (200, 2_000)


def _fill(rng: random.Random, head: str, target: int, line: Any) -> str:
    """``head`` then lines drawn by ``line(rng, i)`` while that brings the text nearer to
    ``target`` characters (so it ends within half a line of it)."""
    parts, size, i = [head], len(head), 0
    while size < target:
        i += 1
        nxt = line(rng, i)
        if size + len(nxt) + 1 - target > target - size and i > 1:
            break
        parts.append(nxt)
        size += len(nxt) + 1
    return "\n".join(parts)


def instructions(shape: CodexShape) -> str:
    """The first developer message: sections of numbered rules about coding."""
    rng = random.Random(f"{shape.seed}:instructions")
    per_section = 13

    def rule(rng: random.Random, i: int) -> str:
        text = (
            f"{i}. {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}, {rng.choice(WHY)}."
        )
        if rng.random() < 0.3:
            text += f" For example: `{rng.choice(COMMANDS)}`."
        if i % per_section == 1:
            text = f"\n## {SECTIONS[(i // per_section) % len(SECTIONS)]}\n\n{text}"
        return text

    head = (
        "You are a coding agent working in the user's repository through a shell. Follow the "
        "rules below in order of their sections; a later rule never overrides an earlier one."
    )
    return _fill(rng, head, shape.instructions_chars, rule)


def skills(shape: CodexShape) -> str:
    """The second developer message: the skills the agent may load."""
    rng = random.Random(f"{shape.seed}:skills")

    def skill(rng: random.Random, i: int) -> str:
        name, what = SKILLS[(i - 1) % len(SKILLS)]
        return (
            f"- {name}-{i}: {what}; use it {rng.choice(WHEN)}. "
            f"(file: /home/agent/.skills/{name}-{i}/SKILL.md)"
        )

    head = (
        "<skills_instructions>\n## Skills\nA skill is a folder of instructions and scripts. "
        "Load one by reading its SKILL.md before you use it, and only when the task needs it.\n"
        "### Available skills"
    )
    body = _fill(rng, head, shape.skills_chars - 24, skill)
    return body + "\n</skills_instructions>"


# name -> (description, parameters); a parameter is "type: description", "*" after its name
# when it is required; an array's items are strings unless ITEMS names them
FUNCTIONS: dict[str, tuple[str, dict[str, str]]] = {
    "exec_command": (
        "Runs a command in a pseudo-terminal in the workspace and returns its output, or a "
        "session id to poll with write_stdin when the command is still running after the wait.",
        {
            "cmd*": "string: The shell command to run.",
            "workdir": "string: Folder to run it in; the session's cwd when absent.",
            "shell": "string: Shell binary to launch; the user's default when absent.",
            "login": "boolean: Run the shell with -l, loading the login profile.",
            "tty": "boolean: Give the command a terminal, for programs that need one.",
            "yield_time_ms": "number: How long to wait for output before returning.",
            "max_output_tokens": "number: Cut the returned output at this many tokens.",
            "sandbox_permissions": "string: use_default to run in the sandbox, or "
            "require_escalated to ask the user to run this one command outside it.",
            "justification": "string: With require_escalated: one sentence the user reads "
            "before approving, saying what the command does and why it needs to leave the "
            "sandbox.",
            "prefix_rule": "array: With require_escalated: a command prefix the user may approve "
            'for the rest of the session, such as ["npm", "run"].',
        },
    ),
    "write_stdin": (
        "Write characters to the stdin of a running exec_command session and return its new "
        "output.",
        {
            "session_id*": "number: The session exec_command returned.",
            "chars": "string: Bytes to write; empty to only poll.",
            "yield_time_ms": "number: How long to wait for output.",
            "max_output_tokens": "number: Cut the output at this many tokens.",
        },
    ),
    "request_user_input": (
        "Ask the user one to three short questions and wait for the answers.",
        {"questions*": "array: The questions."},
    ),
    "view_image": (
        "Attach a local image file to the conversation.",
        {"path*": "string: Path of the image."},
    ),
    "update_plan": (
        "Record the plan of the task and each step's status.",
        {"explanation": "string: Free text.", "plan*": "array: The steps."},
    ),
    "get_goal": ("Read the current goal of the session.", {}),
    "create_goal": (
        "Set the goal the session works towards.",
        {"objective*": "string: What done looks like.", "done_when": "string: How to check."},
    ),
    "update_goal": (
        "Mark the goal's progress.",
        {"status*": "string: active, blocked or complete", "note": "string: Free text."},
    ),
}
AGENT_TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "spawn_agent": (
        "Start a sub-agent on a task; returns its id.",
        {
            "message*": "string: The task, with everything the agent needs.",
            "agent_type": "string: default, explorer or worker.",
        },
    ),
    "send_input": (
        "Send a message to a running sub-agent.",
        {
            "id*": "string: The id spawn_agent returned.",
            "message": "string: What to tell it.",
            "interrupt": "boolean: Stop its current step first.",
        },
    ),
    "resume_agent": (
        "Resume a sub-agent that was closed.",
        {"id*": "string: The id spawn_agent returned."},
    ),
    "wait_agent": (
        "Wait until one of the sub-agents finishes.",
        {"ids*": "array: The agents to wait for.", "timeout_ms": "number: Give up after this."},
    ),
    "close_agent": (
        "Stop a sub-agent and free its resources.",
        {"id*": "string: The id spawn_agent returned."},
    ),
}
_TEXT = {"type": "string", "description": "Free text."}
ITEMS = {
    "plan": {
        "type": "object",
        "properties": {"step": _TEXT, "status": {"type": "string", "enum": list(STATUSES)}},
        "required": ["step", "status"],
    },
    "questions": {
        "type": "object",
        "properties": {
            "id": _TEXT,
            "header": _TEXT,
            "question": _TEXT,
            "options": {"type": "array", "items": _TEXT},
        },
        "required": ["id", "question"],
    },
}


def _function(name: str, description: str, params: dict[str, str]) -> Item:
    props: dict[str, Any] = {}
    for key, spec in params.items():
        kind, text = spec.split(": ", 1)
        props[key.rstrip("*")] = {"type": kind, "description": text}
        if kind == "array":
            props[key.rstrip("*")]["items"] = ITEMS.get(key.rstrip("*"), {"type": "string"})
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": props,
            "required": [k.rstrip("*") for k in params if k.endswith("*")],
            "additionalProperties": False,
        },
    }


def tools(shape: CodexShape) -> list[Item]:
    """Codex's tool list: 8 function tools, the multi-agent namespace, the hosted web search;
    usage notes drawn by the seed lengthen the descriptions of all but ``exec_command`` until
    the list is ``shape.tools_chars`` characters of JSON."""
    agents = [_function(name, *spec) for name, spec in AGENT_TOOLS.items()]
    listed = [
        *(_function(name, *spec) for name, spec in FUNCTIONS.items()),
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Tools to start sub-agents that work in parallel, talk to them and "
            "wait for their results.",
            "tools": agents,
        },
        {"type": "web_search", "external_web_access": False},
    ]
    rng = random.Random(f"{shape.seed}:tools")
    noted = [*listed[1 : len(FUNCTIONS)], *agents]
    size, i = len(json.dumps(listed)), 0
    while size < shape.tools_chars:
        note = f" {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(WHEN)}, {rng.choice(WHY)}."
        noted[i % len(noted)]["description"] += note
        size, i = size + len(note), i + 1
    return listed


def message(role: str, text: str) -> Item:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def session_key(shape: CodexShape, session: int) -> str:
    """Session ``session``'s uuid (its ``prompt_cache_key`` and ``session-id``)."""
    return str(
        uuid.UUID(int=random.Random(f"{shape.seed}:key:{session}").getrandbits(128), version=4)
    )


def opening(shape: CodexShape, session: int) -> list[Item]:
    """A session's first input: two developer messages, the environment, its task."""
    return [
        message("developer", instructions(shape)),
        message("developer", skills(shape)),
        message("user", ENVIRONMENT),
        message("user", TASKS[session % len(TASKS)]),
    ]


def tool_output(shape: CodexShape, session: int, step: int) -> str:
    """The output of the command of ``step``, as Codex returns it: a header, then lines of a
    listing, a search, a source file or a test log; 200-2,000 characters (seeded)."""
    rng = random.Random(f"{shape.seed}:output:{session}:{step}")
    target = rng.randint(*shape.output_chars)
    kind = rng.randrange(4)

    def line(rng: random.Random, i: int) -> str:
        n = rng.randrange(1, 400)
        return (
            f"-rw-r--r-- 1 agent agent {n * 37:>6} Mar 14 09:{i % 60:02d} module_{n}.py",
            f"src/ledger/module_{n}.py:{i * 7}:    total = parse_amount(row[{i % 9}])",
            f"{i:>4}  def rule_{n}(row):  return round(row.amount * {n / 100:.2f}, 2)",
            f"tests/test_io.py::test_case_{n} {'FAILED' if n % 7 == 0 else 'PASSED'}",
        )[kind]

    head = (
        f"Chunk ID: {rng.getrandbits(24):06x}\nWall time: {rng.random():.4f} seconds\n"
        f"Process exited with code {1 if kind == 3 else 0}\nOutput:"
    )
    return _fill(rng, head, target + 200, line)[:target]  # lines are under 100 characters


def step_items(shape: CodexShape, session: int, step: int) -> list[Item]:
    """What step ``step`` (2 or later) adds: the previous reply as an ``exec_command`` call
    and the call's output."""
    rng = random.Random(f"{shape.seed}:call:{session}:{step}")
    call_id = f"call_{rng.getrandbits(96):024x}"
    args = {"cmd": COMMANDS[rng.randrange(len(COMMANDS))], "workdir": CWD, "yield_time_ms": 10000}
    return [
        {
            "type": "function_call",
            "name": "exec_command",
            "arguments": json.dumps(args),
            "call_id": call_id,
        },
        {
            "type": "function_call_output",
            "call_id": call_id,
            "output": tool_output(shape, session, step),
        },
    ]


def loop_input(shape: CodexShape, session: int, step: int) -> list[Item]:
    """The whole input of step ``step`` (1-based) of a session's tool loop: a full resend."""
    items = opening(shape, session)
    for k in range(2, step + 1):
        items += step_items(shape, session, k)
    return items


def envelope(key: str, turn: str) -> dict[str, Any]:
    """The fields Codex 0.169 sends around its input and tools (captured from ``codex exec``):
    a streamed, unstored request on its session's cache key."""
    return {
        "model": "continuum",
        "instructions": "",
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": key,
        "client_metadata": {
            "x-codex-turn-metadata": json.dumps({"session_id": key, "turn_id": turn})
        },
    }


def request(
    shape: CodexShape, session: int, step: int, max_output_tokens: int
) -> tuple[dict[str, Any], dict[str, str]]:
    """Step ``step``'s request of session ``session``: (body, headers)."""
    key = session_key(shape, session)
    turn = str(uuid.UUID(int=random.Random(f"{key}:{step}").getrandbits(128), version=4))
    body = {
        **envelope(key, turn),
        "input": loop_input(shape, session, step),
        "tools": tools(shape),
        "temperature": 0,
        "max_output_tokens": max_output_tokens,
    }
    return body, {"session-id": key, "content-type": "application/json"}
