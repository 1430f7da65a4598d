"""Sampling from numpy logits: temperature, top-k and top-p, and constraints as llama.cpp
grammars.

:func:`gbnf` turns a :mod:`continuum.constraints` constraint into GBNF. JSON schemas go through
llama.cpp's own converter (``llama_cpp.llama_grammar.SchemaConverter``, the code behind
llama-server's ``json_schema``). A forced tool call is written in the model's own format: for a
template that asks for ``<tool_call>`` tags (Qwen2.5's) exactly the text the template renders
for a call,

    <tool_call>
    {"name": "get_weather", "arguments": {...}}
    </tool_call>

so a transcript that re-renders the call matches the generated tokens; for any other template
a bare ``{"name": ..., "arguments": ...}`` object (a JSON list of them when calls may be
parallel). The reply ends when the grammar does: past its end only end-of-generation tokens are
allowed.

:class:`GrammarSampler` applies a grammar the way llama.cpp's common sampler does: the token
chosen from the raw logits is checked alone first (cheap), and only when the grammar rejects it
is the whole vocabulary masked and the token chosen again.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import SchemaConverter as _SchemaConverter

from continuum import constraints
from continuum.backends.base import Logits
from continuum.errors import BackendError, InvalidRequest
from continuum.params import GenerationParams
from continuum.toolcalls import CALL_END, CALL_START

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
SchemaConverter: Any = _SchemaConverter  # untyped upstream
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


def sample(logits: Logits, params: GenerationParams, rng: np.random.Generator | None) -> int:
    """Greedy at temperature 0 (or without ``rng``), else top-k, then top-p, then a draw."""
    if params.temperature <= 0 or rng is None:
        return int(np.argmax(logits))
    p = distribution(logits, params)
    return int(rng.choice(p.size, p=p))


def speculative_choice(p: np.ndarray, draft: int, rng: np.random.Generator) -> int:
    """Standard speculative sampling for a draft that proposes one token with certainty
    (Leviathan et al., Chen et al., 2023): ``draft`` is kept with probability ``p[draft]``,
    else the token is drawn from ``p`` without it, renormalised. Either way the token is
    distributed as ``p``: P(t) = p[t] for t = draft, and (1 - p[draft]) * p[t] / (1 - p[draft])
    for every other t."""
    if rng.random() < p[draft]:
        return draft
    rest = p.copy()
    rest[draft] = 0.0
    total = rest.sum()
    return draft if total <= 0 else int(rng.choice(rest.size, p=rest / total))


def distribution(logits: Logits, params: GenerationParams) -> np.ndarray:
    """What :func:`sample` draws from at ``params.temperature`` > 0: the softmax of the
    tempered logits, cut to the top k, then to the top p (float64, sums to 1)."""
    z = logits.astype(np.float64) / params.temperature
    if params.top_k > 0 and params.top_k < z.size:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z >= kth, z, -np.inf)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p)
        cum = np.cumsum(p[order])
        cut = int(np.searchsorted(cum, params.top_p)) + 1
        mask = np.zeros_like(p)
        mask[order[:cut]] = 1.0
        p = p * mask
        p /= p.sum()
    return p


def cut_at(
    gen: list[int],
    text: str,
    detokenize: Callable[[list[int]], str],
    tokenize: Callable[..., list[int]],
) -> tuple[list[int], list[int]]:
    """A reply cut at a stop string: of the generated tokens ``gen``, the longest prefix whose
    text lies inside ``text`` (the reply before the stop string), and the tokens of the rest
    of ``text`` (the head of a token that crossed the cut), so that together they are exactly
    ``text``."""
    k = len(gen)
    head = detokenize(gen)
    while k and not (len(head) <= len(text) and text.startswith(head)):
        k -= 1
        head = detokenize(gen[:k])
    rest = text[len(head) :]
    return gen[:k], tokenize(rest, special=False) if rest else []


def _literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped.replace("\r", "\\r") + '"'


def _converter() -> Any:
    return SchemaConverter(
        prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _visit(conv: Any, schema: dict[str, Any], name: str, what: str) -> str:
    try:
        return str(conv.visit(conv.resolve_refs(schema, what), name))
    except Exception as e:  # the converter raises bare exceptions of several kinds
        raise InvalidRequest(f"{what}: this JSON schema cannot be enforced ({e})") from None


def gbnf(constraint: str, *, tagged: bool, tag_tokens: bool = False) -> str:
    """The GBNF grammar (root rule ``root``) of ``constraint``; ``tagged``: the model writes
    tool calls inside ``<tool_call>`` tags; ``tag_tokens``: each tag is one token of the
    vocabulary (Qwen2.5's), matched as that token — a grammar's string literal never matches
    a special token, so the tags would be spelled out in plain tokens that re-tokenise
    differently."""
    data = constraints.parse(constraint)
    conv = _converter()
    if data["type"] == "json_object":
        _visit(conv, {"type": "object"}, "", "response_format")
        return str(conv.format_grammar())
    if data["type"] == "json_schema":
        _visit(conv, data["schema"], "", "response_format.json_schema")
        return str(conv.format_grammar())
    objects = []
    for i, tool in enumerate(data["tools"]):
        args = _visit(conv, tool["parameters"], f"args{i}", f"tool {tool['name']!r} parameters")
        head = '{"name": ' + json.dumps(tool["name"]) + ', "arguments": '
        objects.append(f"( {_literal(head)} {args} {_literal('}')} )")
    rules = [f"callobj ::= {' | '.join(objects)}"]
    if tagged and tag_tokens:
        rules.append('call ::= <tool_call> "\\n" callobj "\\n" </tool_call>')
    elif tagged:
        rules.append('call ::= "<tool_call>\\n" callobj "\\n</tool_call>"')
    else:
        rules.append("call ::= callobj")
    if not data["parallel"]:
        root = "call"
    elif tagged:
        root = 'call ( "\\n" call )*'
    else:
        root = '"[" call ( ", " call )* "]"'
    if data.get("lazy"):  # begun at a tag of its own: one call in it
        wrapped = (f"( {_literal(o)} wrapws callobj wrapws {_literal(c)} )" for o, c in WRAPS)
        root = f"( {root} ) | {' | '.join(wrapped)}"
        rules.append("wrapws ::= [ \\n]{0,2}")
    rules.append(f"root ::= {root}")
    return str(conv.format_grammar()).rstrip("\n") + "\n" + "\n".join(rules) + "\n"


# tags small models put a call in instead of their template's (a lazy grammar starts there too)
WRAPS = (("<tools>", "</tools>"), ("<function_call>", "</function_call>"))


def lazy_triggers(*, tag_tokens: bool) -> tuple[str, ...]:
    """The patterns whose appearance in a reply starts a lazy tool-call grammar (llama.cpp
    searches the reply's text for them and feeds the grammar from the match on): the wrapping
    tags, and ``<tool_call>`` where it is text — where it is one token, that token is the
    trigger (:class:`GrammarSampler`'s ``tokens``)."""
    words = [o for o, _ in WRAPS] + ([] if tag_tokens else [CALL_START])
    return tuple(re.escape(w) for w in words)


def grammar_sampler(
    constraint: str, vocab: Any, n_vocab: int, tagged: bool, tokenize: Callable[[str], list[int]]
) -> GrammarSampler | None:
    """The sampler for ``constraint`` in a vocabulary whose template writes calls in
    ``<tool_call>`` tags when ``tagged``. A lazy tool-call constraint needs such a tag to wait
    for; without one (None) the reply's calls are only parsed."""
    lazy = constraints.is_lazy(constraint)
    if lazy and not tagged:
        return None
    tags = [tokenize(t) for t in (CALL_START, CALL_END)] if tagged else []
    tag_tokens = tagged and all(len(t) == 1 for t in tags)
    text = gbnf(constraint, tagged=tagged, tag_tokens=tag_tokens)
    if not lazy:
        return GrammarSampler(vocab, n_vocab, text)
    patterns = lazy_triggers(tag_tokens=tag_tokens)
    return GrammarSampler(
        vocab, n_vocab, text, patterns=patterns, tokens=(tags[0][0],) if tag_tokens else ()
    )


class GrammarSampler:
    """One grammar's state over one generation: :meth:`choose` a token, then :meth:`accept`
    it. Close it when the generation ends (it holds a llama.cpp sampler)."""

    def __init__(
        self,
        vocab: Any,
        n_vocab: int,
        grammar: str,
        *,
        patterns: tuple[str, ...] = (),
        tokens: tuple[int, ...] = (),
    ) -> None:
        """With trigger ``patterns`` or ``tokens`` the grammar is lazy (llama.cpp's
        ``llama_sampler_init_grammar_lazy_patterns``): every token is allowed until one of
        them appears in the reply, and the grammar applies from there."""
        if patterns or tokens:
            pats = (ctypes.c_char_p * len(patterns))(*(p.encode() for p in patterns))
            toks = (llama_cpp.llama_token * len(tokens))(*tokens)
            self._ptr = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                vocab, grammar.encode(), b"root", pats, len(patterns), toks, len(tokens)
            )
        else:
            self._ptr = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if not self._ptr:
            raise InvalidRequest("llama.cpp could not parse the grammar built for this request")
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_arr = llama_cpp.llama_token_data_array(self._one, 1, -1, False)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._all = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        data = self._all.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        self._all_arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)

    def allows(self, token: int) -> bool:
        self._one[0] = llama_cpp.llama_token_data(token, 0.0, 0.0)
        self._one_arr.size, self._one_arr.selected = 1, -1
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._one_arr))
        return bool(np.isfinite(self._one[0].logit))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every token the grammar rejects at -inf (a copy)."""
        self._all["id"] = self._ids
        self._all["logit"] = logits
        self._all_arr.size, self._all_arr.selected = self._ids.size, -1
        llama_cpp.llama_sampler_apply(self._ptr, ctypes.byref(self._all_arr))
        out = self._all["logit"].copy()
        if not np.isfinite(out).any():
            raise BackendError("the grammar allows no token here: the constraint is unsatisfiable")
        return out

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._ptr, token)

    def close(self) -> None:
        if self._ptr:
            llama_cpp.llama_sampler_free(self._ptr)
            self._ptr = None


__all__ = [
    "WRAPS",
    "GrammarSampler",
    "cut_at",
    "gbnf",
    "grammar_sampler",
    "lazy_triggers",
    "sample",
]
