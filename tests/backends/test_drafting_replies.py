"""Greedy replies with drafts from the sequence's own tokens (``LlamaConfig.draft``) on the real
model (Gemma 3 270M): the same tokens, text, finish and resident KV as plain decoding, drafts
taken where the reply quotes its context, and none where it cannot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from continuum import InvalidRequest, LlamaConfig, ModelFile
from continuum.backends.base import GenOut
from continuum.backends.drafting import DraftStats
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.bench.speculative import TASKS
from continuum.params import GenerationParams
from tests.backends.test_batching_drafts import Cheap
from tests.conftest import model

CONFIG = LlamaConfig(n_ctx=2048, n_threads=2, n_threads_batch=2)
NAMES = ("Dana", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea", "Max", "Ned", "Oda")
LIST = "\n".join(f"record R-{1000 + i}: owner {n}, status late" for i, n in enumerate(NAMES))
QUOTE = f"The late records:\n{LIST}\n\nThe same records, copied exactly:\nrecord R-1000:"


def _reply(
    model: ModelFile, draft: int, prompt: str, params: GenerationParams, *, bos: bool = True
) -> tuple[GenOut, list[int], DraftStats]:
    with LlamaCppBackend(model, replace(CONFIG, draft=draft)) as b:
        logits, _ = b.decode([b.bos_id] * bos + b.tokenize(prompt))
        assert logits is not None
        out = b.generate(logits.copy(), params)
        return out, list(b.seq_tokens(0)), b.draft_stats


@pytest.mark.slow  # 4-5 s alone: the full run's (pyproject's markers)
@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_tokens=120),
        GenerationParams(max_tokens=37),  # ends inside a kept draft
        GenerationParams(max_tokens=120, stop=("Kim",)),  # a stop string inside a kept draft
    ],
    ids=["long", "max-tokens", "stop"],
)
def test_a_quoting_reply_is_drafted_and_equals_plain_decoding(
    gemma: ModelFile, params: GenerationParams
) -> None:
    plain, plain_kv, none = _reply(gemma, 0, QUOTE, params)
    got, kv, stats = _reply(gemma, 16, QUOTE, params)
    assert none.calls == 0
    assert stats.accepted > 0 and stats.calls < len(got.tokens)  # fewer calls than tokens
    assert got.tokens == plain.tokens and got.text == plain.text
    assert got.finish_reason == plain.finish_reason
    assert kv == plain_kv  # the sequence holds what plain decoding leaves


def test_prose_with_nothing_to_quote_equals_plain_decoding(gemma: ModelFile) -> None:
    params = GenerationParams(max_tokens=40)
    prompt = "Write one sentence about the sea."
    plain, plain_kv, _ = _reply(gemma, 0, prompt, params)
    got, kv, _ = _reply(gemma, 8, prompt, params)
    assert (got.tokens, kv) == (plain.tokens, plain_kv)


@pytest.mark.slow  # 4 s alone
def test_a_reply_decoded_alone_drafts_from_its_tenants_earlier_reply(gemma: ModelFile) -> None:
    """One sequence, no batch scheduler (a server with one lane): a count asked again by the
    same tenant drafts from its first answer and keeps more; another tenant's does not see it.
    Every reply is the same greedy tokens, and the sequence's index is kept across its turns."""
    params = GenerationParams(max_tokens=90)
    text = "List the months of the year and their number of days, one a line:"
    with LlamaCppBackend(gemma, replace(CONFIG, draft=16)) as b:
        b.verify_cost = Cheap()  # drafts whenever there is one (not whether it pays here)
        prompt = [b.bos_id, *b.tokenize(text)]
        kept, replies = [], []
        for tenant in ("a", "a", "b"):
            b.clear_seq(0)
            logits, _ = b.decode(prompt)
            assert logits is not None
            before = b.draft_stats.accepted
            replies.append(b.generate(logits.copy(), params, tenant=tenant).tokens)
            kept.append(b.draft_stats.accepted - before)
        look = b.draft_sources.lookup(0)
        assert look.tokens == b.seq_tokens(0)
    assert replies[0] == replies[1] == replies[2]
    assert kept[1] > kept[0] and kept[1] > kept[2]


@pytest.mark.slow  # 2-3 s each alone
@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_tokens=90, temperature=0.7, seed=7),
        GenerationParams(max_tokens=90, temperature=0.7, top_k=20, top_p=0.9, seed=3),
        GenerationParams(max_tokens=90, temperature=0.7, seed=7, stop=("R-1004",)),
    ],
    ids=["temperature", "top-k-p", "stop"],
)
def test_a_sampled_quoting_reply_drafts_by_speculative_sampling(
    gemma: ModelFile, params: GenerationParams
) -> None:
    """Drafted tokens are kept by standard speculative sampling (the rule's distribution is
    pinned in test_drafting.py); the reply ends as plain sampling ends one, and the sequence
    holds the prompt and the reply's tokens but the last, as plain sampling leaves it."""
    with LlamaCppBackend(gemma, CONFIG) as b:
        prompt = [b.bos_id, *b.tokenize(QUOTE)]
    got, kv, stats = _reply(gemma, 16, QUOTE, params)
    assert stats.calls > 0 and stats.accepted > 0 and stats.calls < len(got.tokens)
    assert "R-1002" in got.text  # it copies the records
    assert got.finish_reason == ("stop" if params.stop else "length")
    assert not any(s in got.text for s in params.stop)
    held = len(kv) - len(prompt)
    assert kv[: len(prompt)] == prompt and kv[len(prompt) :] == list(got.tokens[:held])
    if got.finish_reason == "length":
        assert held == len(got.tokens) - 1  # all but the last
    else:  # cut at the stop string: the tokens inside the text before it
        assert held <= len(got.tokens) and got.text.endswith("record ")


@pytest.mark.parametrize("bad", [-1, 33, 2.0])
def test_a_draft_length_outside_0_to_32_is_refused_naming_it(gemma: ModelFile, bad: object) -> None:
    with pytest.raises(InvalidRequest, match="draft must be an integer in"):
        LlamaCppBackend(gemma, replace(CONFIG, draft=bad))  # type: ignore[arg-type]


@pytest.mark.slow  # the default model: several seconds alone
def test_on_the_default_model_a_quoted_tool_call_list_is_drafted_and_unchanged() -> None:
    """Qwen2.5-Coder-0.5B-Instruct copying ids and paths from a tool result (bench
    speculative's tool-args task), through its own chat template."""
    qwen = model("qwen2.5-coder-0.5b")
    with LlamaCppBackend(qwen, CONFIG) as b:
        prompt = b.chat_format.render(TASKS["tool-args"], add_generation_prompt=True)
    params = GenerationParams(max_tokens=96)
    plain, plain_kv, _ = _reply(qwen, 0, prompt, params, bos=False)
    got, kv, stats = _reply(qwen, 16, prompt, params, bos=False)
    assert stats.accepted > 0 and stats.calls < len(got.tokens)
    assert (got.tokens, got.text, kv) == (plain.tokens, plain.text, plain_kv)


@pytest.mark.slow  # the default model: several seconds alone
def test_on_the_default_model_a_sampled_quoted_json_is_drafted_by_speculative_sampling() -> None:
    """Qwen2.5-Coder-0.5B-Instruct re-emitting a JSON document (bench speculative's json task)
    at temperature 0.7: drafts are kept, the reply is the document again, and the sequence
    holds the prompt and the reply's tokens but the last, as plain sampling leaves it."""
    qwen = model("qwen2.5-coder-0.5b")
    with LlamaCppBackend(qwen, CONFIG) as b:
        prompt = b.chat_format.render(TASKS["json"], add_generation_prompt=True)
        tokens = b.tokenize(prompt)
    params = GenerationParams(max_tokens=80, temperature=0.7, seed=11)
    got, kv, stats = _reply(qwen, 16, prompt, params, bos=False)
    assert stats.calls > 0 and stats.accepted > 0 and stats.calls < len(got.tokens)
    assert '"service"' in got.text and "billing" in got.text
    assert kv[: len(tokens)] == tokens
    assert kv[len(tokens) :] == list(got.tokens[: len(kv) - len(tokens)])
    assert len(kv) - len(tokens) == len(got.tokens) - (got.finish_reason == "length")
