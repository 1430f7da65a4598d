"""Constraints as llama.cpp grammars, on the real Gemma 3 270M (a base model: whatever it would
say, the grammar decides the shape). Tagged tool calls are tested on Qwen in tests/server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from continuum import constraints
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import ModelFile
from continuum.backends.sampling import GrammarSampler, gbnf
from continuum.errors import InvalidRequest
from continuum.params import GenerationParams
from continuum.toolcalls import normalize_tools

COLOR = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer"}},
    "required": ["color", "n"],
}
HUE = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"]}
PAINT = normalize_tools(
    [
        {"type": "function", "function": {"name": "paint", "parameters": HUE}},
        {"type": "function", "function": {"name": "noop"}},
    ]
)


@pytest.fixture(scope="module")
def llama(request: pytest.FixtureRequest) -> Iterator[LlamaCppBackend]:
    from tests.conftest import model

    mf: ModelFile = model("gemma3-270m")
    with LlamaCppBackend(mf, LlamaConfig(n_ctx=512)) as b:
        yield b


def _generate(b: LlamaCppBackend, prompt: str, constraint: str, **kw: object) -> tuple[str, str]:
    b.clear()
    logits, _ = b.decode([b.bos_id, *b.tokenize(prompt)])
    assert logits is not None
    kw.setdefault("max_tokens", 40)
    out = b.generate(logits, GenerationParams(constraint=constraint, **kw))  # type: ignore[arg-type]
    return out.text, out.finish_reason


def test_a_json_schema_shapes_the_reply_and_ends_it(llama: LlamaCppBackend) -> None:
    text, finish = _generate(llama, "The apple is", constraints.json_schema(COLOR))
    reply = json.loads(text)
    assert reply["color"] in ("red", "green") and isinstance(reply["n"], int)
    assert finish == "stop"  # past the grammar's end only end-of-generation is allowed


def test_json_object_is_any_object(llama: LlamaCppBackend) -> None:
    text, _ = _generate(llama, "Data:", constraints.json_object(), max_tokens=24)
    assert text.startswith("{")


@pytest.mark.slow  # over 3 s alone: the full run's (see pyproject's markers)
def test_sampled_generation_stays_inside_the_grammar(llama: LlamaCppBackend) -> None:
    seen = set()
    for seed in range(3):
        text, _ = _generate(
            llama, "Paint:", constraints.json_schema(COLOR), temperature=1.5, seed=seed
        )
        seen.add(json.loads(text)["color"])
    assert seen <= {"red", "green"}


def test_a_forced_call_is_a_bare_object_for_a_template_without_tags(
    llama: LlamaCppBackend,
) -> None:
    assert not llama.chat_format.tool_call_tags  # Gemma's template has no tool-call tags
    forced = constraints.tool_calls(PAINT, ["paint"], parallel=False)
    text, finish = _generate(llama, "Call:", forced)
    call = json.loads(text)
    assert call["name"] == "paint" and call["arguments"]["color"] in ("red", "green")
    assert list(call) == ["name", "arguments"] and finish == "stop"


def test_parallel_calls_without_tags_are_a_json_list() -> None:
    g = gbnf(constraints.tool_calls(PAINT, ["paint", "noop"], parallel=True), tagged=False)
    assert 'root ::= "[" call ( ", " call )* "]"' in g
    tagged = gbnf(constraints.tool_calls(PAINT, ["noop"], parallel=True), tagged=True)
    assert 'call ::= "<tool_call>\\n" callobj "\\n</tool_call>"' in tagged
    assert '"{\\"name\\": \\"noop\\", \\"arguments\\": "' in tagged
    assert 'root ::= call ( "\\n" call )*' in tagged and "paint" not in tagged


def test_every_grammar_built_here_parses_in_llama_cpp(llama: LlamaCppBackend) -> None:
    for c in (
        constraints.json_object(),
        constraints.json_schema(COLOR),
        constraints.json_schema({"type": "array", "items": {"type": "string"}, "maxItems": 3}),
        constraints.tool_calls(PAINT, ["paint", "noop"], parallel=True),
    ):
        for tagged in (False, True):
            GrammarSampler(llama._vocab, llama.n_vocab, gbnf(c, tagged=tagged)).close()


def test_unenforceable_or_malformed_constraints_are_invalid_requests() -> None:
    with pytest.raises(InvalidRequest, match="cannot be enforced"):
        gbnf(constraints.json_schema({"$ref": "https://example.com/x.json"}), tagged=False)
    with pytest.raises(InvalidRequest, match="constraint type must be"):
        GenerationParams(constraint='{"type": "xml"}').validate()
    with pytest.raises(InvalidRequest, match="not JSON"):
        GenerationParams(constraint="{nope").validate()
    with pytest.raises(InvalidRequest, match="not among the request's tools"):
        constraints.tool_calls(PAINT, ["draw"], parallel=False)
    with pytest.raises(InvalidRequest, match="schema object"):
        constraints.json_schema([1])


def test_an_invalid_grammar_is_refused_not_crashed(llama: LlamaCppBackend) -> None:
    with pytest.raises(InvalidRequest, match="could not parse the grammar"):
        GrammarSampler(llama._vocab, llama.n_vocab, "root ::= (")


def test_a_constraint_is_part_of_the_key_and_free_text_keys_are_unchanged() -> None:
    free = GenerationParams().key_fields()
    assert "constraint" not in free  # keys stored before constraints existed still match
    shaped = GenerationParams(constraint=constraints.json_object()).key_fields()
    assert shaped["constraint"] == '{"type":"json_object"}'
