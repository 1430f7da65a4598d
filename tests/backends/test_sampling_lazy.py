"""A lazy tool-call grammar (``tool_choice: auto``) on the real default model's vocabulary
(Qwen2.5-Coder 0.5B, whose template writes calls in ``<tool_call>`` tags, each one token):
the reply is free until the model starts a call; from there the call must name a declared tool
with arguments that fit it, whether it began with the template's tag or with a tag small models
use instead (``<tools>``). What the model would write is not needed: the grammar is walked
token by token, as the sampler does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from continuum import constraints
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.sampling import GrammarSampler, grammar_sampler
from continuum.errors import InvalidRequest
from continuum.params import GenerationParams
from continuum.toolcalls import normalize_tools
from tests.conftest import model

SHELL = {
    "type": "object",
    "properties": {"cmd": {"type": "string"}},
    "required": ["cmd"],
}
TOOLS = normalize_tools(
    [
        {"type": "function", "function": {"name": "exec_command", "parameters": SHELL}},
        {"type": "function", "function": {"name": "update_plan"}},
    ]
)
LAZY = constraints.tool_calls(TOOLS, ["exec_command", "update_plan"], parallel=True, lazy=True)
CALL = '{"name": "exec_command", "arguments": {"cmd": "cat answer.py"}}'


@pytest.fixture(scope="module")
def qwen() -> Iterator[LlamaCppBackend]:
    with LlamaCppBackend(model("qwen2.5-coder-0.5b"), LlamaConfig(n_ctx=256)) as b:
        yield b


@pytest.fixture
def lazy(qwen: LlamaCppBackend) -> Iterator[GrammarSampler]:
    g = qwen.grammar_for(GenerationParams(constraint=LAZY))
    assert g is not None
    yield g
    g.close()


def _walk(g: GrammarSampler, tokens: list[int]) -> int:
    """How many of ``tokens`` the grammar lets through, in order (each accepted as sampled)."""
    for i, t in enumerate(tokens):
        if not g.allows(t):
            return i
        g.accept(t)
    return len(tokens)


def test_text_before_a_call_is_free(qwen: LlamaCppBackend, lazy: GrammarSampler) -> None:
    text = qwen.tokenize('Sure: the file holds {"name": "anything"} and <b>tags</b>.\n')
    assert _walk(lazy, text) == len(text)


def test_after_the_call_tag_only_a_declared_tool_is_written(
    qwen: LlamaCppBackend, lazy: GrammarSampler
) -> None:
    start = qwen.tokenize("Let me look.\n<tool_call>")
    assert len(qwen.tokenize("<tool_call>")) == 1  # the trigger is the tag's own token
    wrong = qwen.tokenize('\n{"name": "execute_command", "arguments": {}}')
    assert _walk(lazy, start) == len(start)
    let_through = qwen.detokenize(wrong[: _walk(lazy, wrong)])
    assert let_through.startswith('\n{"name": "')  # the call's opening is written as usual
    assert '\n{"name": "exec'.startswith(let_through)  # and refused at the unknown name


def test_a_whole_tagged_call_passes_and_the_reply_ends_after_it(
    qwen: LlamaCppBackend, lazy: GrammarSampler
) -> None:
    call = qwen.tokenize(f"<tool_call>\n{CALL}\n</tool_call>")
    assert _walk(lazy, call) == len(call)
    assert not lazy.allows(qwen.tokenize(" Done")[0])  # past a call: another one, or the end
    assert lazy.allows(qwen.tokenize("\n")[0])


def test_a_call_in_a_tag_of_the_models_own_must_name_a_declared_tool(
    qwen: LlamaCppBackend, lazy: GrammarSampler
) -> None:
    good = qwen.tokenize(f"I will run it. <tools>\n{CALL}\n</tools>")
    assert _walk(lazy, good) == len(good)


def test_a_misnamed_call_in_a_tag_of_the_models_own_is_refused(
    qwen: LlamaCppBackend, lazy: GrammarSampler
) -> None:
    bad = qwen.tokenize('<tools>\n{"name": "execute_command", "arguments": {"cmd": "ls"}}')
    let_through = qwen.detokenize(bad[: _walk(lazy, bad)])
    assert let_through.startswith('<tools>\n{"name": "')
    assert '<tools>\n{"name": "exec'.startswith(let_through)


def test_arguments_must_fit_the_tools_schema(qwen: LlamaCppBackend, lazy: GrammarSampler) -> None:
    bad = qwen.tokenize('<tool_call>\n{"name": "exec_command", "arguments": {"command": "ls"}}')
    assert _walk(lazy, bad) < len(bad)


def test_a_lazy_flag_that_is_not_a_boolean_is_an_invalid_request() -> None:
    bad = LAZY.replace('"lazy":true', '"lazy":"yes"')
    assert bad != LAZY
    with pytest.raises(InvalidRequest, match="lazy must be true or false"):
        GenerationParams(constraint=bad).validate()
    assert constraints.is_lazy(LAZY)
    assert not constraints.is_lazy(constraints.tool_calls(TOOLS, ["update_plan"], parallel=False))


def test_without_call_tags_a_lazy_constraint_has_no_grammar(qwen: LlamaCppBackend) -> None:
    """A template with no call tag (Gemma 3's) has nothing to wait for: calls are parsed."""
    assert grammar_sampler(LAZY, qwen._vocab, qwen.n_vocab, False, qwen.tokenize) is None
