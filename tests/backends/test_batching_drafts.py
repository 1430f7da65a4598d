"""Drafting in a batch scheduler's steps (``LlamaConfig.draft`` on a context with a KV stream
per sequence, as the server's lanes) on the real model (Gemma 3 270M): replies decoded
together, some quoting their prompt and drafting, are token for token the replies decoded
alone without drafts, with the same resident KV; drafts of several replies share calls; sampled
replies draft by speculative sampling and end as plain sampling leaves a sequence."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from continuum import GenerationParams, LlamaConfig, ModelFile
from continuum.backends.batching import BatchScheduler
from continuum.backends.drafting import VerifyCost
from continuum.backends.llamacpp import LlamaCppBackend
from continuum.backends.step_plan import Program
from tests.conftest import model

STREAMS = LlamaConfig(n_ctx=1024, n_threads=2, n_threads_batch=2, n_seq_max=4, kv_unified=False)
FIRST = ("Dana", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea")
SECOND = ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gil", "Hu", "Io")


def _quote(names: tuple[str, ...]) -> str:
    rows = "\n".join(f"record R-{1000 + i}: owner {n}, status late" for i, n in enumerate(names))
    return f"The late records:\n{rows}\n\nThe same records, copied exactly:\nrecord R-1000:"


# two sequences quote the same list (their drafts come at the same steps, of one length), one
# another list, and one writes prose with nothing to quote
PROMPTS = (_quote(FIRST), _quote(FIRST), _quote(SECOND), "Write two sentences about the sea.")


class Cheap(VerifyCost):
    """A fixed cost table: a call of k rows costs 1 + 0.05 (k - 1) one-row steps, so replies
    draft whatever the step holds (the test is of what drafting decodes, not of when it
    pays on this CPU)."""

    def observe(self, rows: int, seconds: float) -> None:
        pass

    def steps(self, rows: int) -> float:
        return 1.0 + 0.05 * max(rows - 1, 0)


@pytest.fixture
def plain(gemma: ModelFile) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend(gemma, STREAMS)
    yield b
    b.close()


def _prompts(b: LlamaCppBackend) -> list[list[int]]:
    return [[b.bos_id, *b.tokenize(p)] for p in PROMPTS]


def _alone(
    b: LlamaCppBackend, prompt: list[int], params: GenerationParams
) -> tuple[list[int], list[int]]:
    """The reply decoded alone without drafts, and what its sequence holds after it."""
    b.clear_seq(0)
    logits, _ = b.decode(prompt, 0)
    assert logits is not None
    out = b.generate(logits, params, seq=0).tokens
    held = list(b.seq_tokens(0))
    b.clear_seq(0)
    return list(out), held


@pytest.mark.slow  # 5-11 s each alone
@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(max_tokens=100),
        GenerationParams(max_tokens=45, stop=("Hal",)),  # a stop string inside a kept draft
    ],
    ids=["long", "stop"],
)
def test_replies_drafting_in_batch_steps_equal_plain_decoding_alone(
    gemma: ModelFile, plain: LlamaCppBackend, params: GenerationParams
) -> None:
    prompts = _prompts(plain)
    alone, alone_kv = zip(*(_alone(plain, p, params) for p in prompts), strict=True)
    with LlamaCppBackend(gemma, replace(STREAMS, draft=16)) as b, BatchScheduler(b) as sched:
        sched.draft_cost = Cheap()
        futures = [sched.submit(i, p, params) for i, p in enumerate(prompts)]
        together = [list(f.result(timeout=300).tokens) for f in futures]
        stats, drafts = sched.stats(), sched.draft_stats
        kv = [b.seq_tokens(i) for i in range(len(prompts))]
    assert together == list(alone)
    assert kv == list(alone_kv)  # each sequence holds what plain decoding leaves
    assert drafts.accepted > 0  # the quoting replies kept drafts
    assert stats.draft_calls < drafts.calls  # the two same quotes' drafts shared calls
    assert stats.steps < max(len(t) for t in together)  # fewer steps than the longest reply


@pytest.mark.slow  # 8 s alone
def test_sampled_replies_draft_in_batch_steps_by_speculative_sampling(gemma: ModelFile) -> None:
    """Each reply's drafts are kept by speculative sampling (its rule is pinned in
    test_drafting.py); each sequence ends holding its prompt and its reply's tokens but the
    last, as plain sampling leaves it; a seeded reply repeats itself with drafting on."""
    params = GenerationParams(max_tokens=80, temperature=0.7, seed=11)
    with LlamaCppBackend(gemma, replace(STREAMS, draft=16)) as b:
        prompts = _prompts(b)
        runs = []
        for _ in range(2):
            b.clear()
            with BatchScheduler(b) as sched:
                sched.draft_cost = Cheap()
                futures = [sched.submit(i, p, params) for i, p in enumerate(prompts)]
                outs = [f.result(timeout=300) for f in futures]
                accepted = sched.draft_stats.accepted
            runs.append([list(o.tokens) for o in outs])
            for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
                decoded = o.tokens if o.finish_reason == "stop" else o.tokens[:-1]
                assert b.seq_tokens(i) == [*p, *decoded]  # every token but a last one cut
            assert accepted > 0
    assert runs[0] == runs[1]  # the same draws and the same drafts: the same replies


@pytest.mark.slow  # 4 s alone
def test_a_tenants_earlier_reply_is_a_draft_source_for_its_next_sequences_only(
    gemma: ModelFile,
) -> None:
    """A reply that quotes nothing of its prompt (a count) drafts little from its own tokens;
    asked again on another sequence by the same tenant, it drafts from the first reply and
    keeps more; another tenant's sequence does not see that reply. Every reply is the same
    greedy tokens."""
    params = GenerationParams(max_tokens=90)
    with LlamaCppBackend(gemma, replace(STREAMS, draft=16)) as b, BatchScheduler(b) as sched:
        sched.draft_cost = Cheap()
        text = "List the months of the year and their number of days, one a line:"
        prompt = [b.bos_id, *b.tokenize(text)]  # Gemma 270M counts "1. 2. 3. ..." (no template)
        kept, replies = [], []
        for seq, tenant in ((0, "a"), (1, "a"), (2, "b")):
            before = sched.draft_stats.accepted
            replies.append(
                sched.submit(seq, prompt, params, program=Program(tenant)).result(timeout=120)
            )
            kept.append(sched.draft_stats.accepted - before)
    assert replies[0].tokens == replies[1].tokens == replies[2].tokens
    assert kept[1] > kept[0] and kept[1] > kept[2]


@pytest.mark.slow  # 4 s alone
def test_a_sequences_next_reply_extends_its_index_and_replies_as_plain_decoding(
    gemma: ModelFile, plain: LlamaCppBackend
) -> None:
    """A sequence's second reply (its next turn, appended) drafts from an index kept from the
    first reply and extended by what came since, not built again over the whole sequence; its
    reply is still plain decoding's, token for token."""
    params = GenerationParams(max_tokens=60)
    with LlamaCppBackend(gemma, replace(STREAMS, draft=16)) as b, BatchScheduler(b) as sched:
        sched.draft_cost = Cheap()
        first = _prompts(b)[0]
        sched.submit(0, first, params).result(timeout=120)
        held = list(b.seq_tokens(0))
        turn = b.tokenize("\n\nOnce more, copied exactly:\nrecord R-1000:")
        before = sched.draft_stats.accepted
        second = sched.submit(0, turn, params).result(timeout=120)
        kept = sched.draft_stats.accepted - before
        look = sched.draft_sources.lookup(0)
        assert look.rebuilds == 0 and look.tokens == b.seq_tokens(0)  # only ever extended
    alone, _ = _alone(plain, [*held, *turn], params)
    assert list(second.tokens) == alone
    assert kept > 0  # it quoted the records again, drafting from the kept index


@pytest.mark.slow  # the default model: ~30 s alone
def test_on_the_default_model_agents_drafting_in_batch_steps_reply_as_plain_decoding() -> None:
    """Qwen2.5-Coder-0.5B-Instruct, the server's default model, through its chat template:
    bench speculative's JSON re-emit and tool-arguments tasks and a prose question at once on
    three lanes, drafting in the batch steps (with the fixed cheap cost table, so that drafts
    are verified on any CPU): each reply is token for token the reply decoded alone without
    drafts, and drafts were kept."""
    from continuum.bench.speculative import TASKS

    qwen = model("qwen2.5-coder-0.5b")
    lanes = replace(STREAMS, n_ctx=2048, n_seq_max=3)
    params = GenerationParams(max_tokens=120)
    with LlamaCppBackend(qwen, lanes) as plain:
        render = plain.chat_format.render
        prompts = [
            plain.tokenize(render(TASKS[t], add_generation_prompt=True))
            for t in ("json", "tool-args", "prose")
        ]
        alone = [_alone(plain, p, params)[0] for p in prompts]
    with LlamaCppBackend(qwen, replace(lanes, draft=16)) as b, BatchScheduler(b) as sched:
        sched.draft_cost = Cheap()
        futures = [sched.submit(i, p, params) for i, p in enumerate(prompts)]
        together = [list(f.result(timeout=600).tokens) for f in futures]
        kept = sched.draft_stats.accepted
    assert together == alone
    assert kept > 0
