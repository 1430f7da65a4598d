"""``continuum bench semantic-verified``: the semantic tier's verified mode against the others.

What is measured, on the two pair sets nobody tuned on (``independent``: 561 pairs; ``second``: 300
triples, each with a third wording ``c`` of ``b``, written later by another helper who had seen
neither the code nor the first set):

1. **The judges.** Every pair the tier would judge (both sides judgeable, guard passed, cosine
   >= ``floor``) is put to each judge: a model (the default 0.5B, the ``qwen2.5-coder-1.5b``
   alias) and a prompt (``intent``: the two requests; ``answer``: both requests and the
   default model's own greedy answers to each, up to ``answer_tokens``). For a sweep of
   margins: paraphrase hits (same pairs accepted, of *all* same pairs of the set: pairs never
   judged count as not served) and false hits (different pairs accepted, of all different
   pairs), with the 95% Wilson interval.
2. **The verified tier on a stream.** The tier in its verified mode (``delta``, an answer judge
   off the request path, promotion) is fed each judged pair as two requests, ``a`` then ``b``,
   in a shuffled order; the promotion queue is drained after each request (the judge keeps up
   with the stream). The first half of the stream is the warm-up; on the second half, each
   ``b`` served at first sight is a paraphrase hit (same) or a false hit (different). Served
   from another pair's entry counts as a false hit (its answer was not labelled). Then every
   promotion is counted by label (Krites' vetted mappings), and on the ``second`` set every
   ``c`` is asked once more: served with ``a``'s answer is right only for a same triple,
   served with ``b``'s own answer is right. With ``groups`` in the sets, the same tier and
   judge are fed the third held-out set, many wordings per answer, where each answer group's
   own threshold can be learned (:mod:`continuum.bench.semantic_groups`).
3. **The request path's cost** in the verified mode (embedding and lookup; no judge on it)
   against a cold answer on the same model.

Judgments are deterministic (greedy logits): each pair's margin is computed once per judge and
the stream reads it back (:class:`RecordedJudge`), so the stream costs no more judging.
Answers are cached in ``answers`` (keyed by the model's digest and ``answer_tokens``), and the
margins too; when a set's margins were all cached, the judge's latency is timed on 20 of them.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import field_validator

from continuum.backends.embedders import Embedder, SentenceTransformerEmbedder
from continuum.backends.llamacpp import LlamaConfig, LlamaCppBackend
from continuum.backends.models import resolve_model
from continuum.backends.progress import Progress
from continuum.bench.semantic import load_pairs, score_pairs
from continuum.bench.semantic_groups import judged_sweep, load_groups, run_groups_stream
from continuum.bench.semantic_judge import cold_answer_ms
from continuum.bench.settings import BenchSettings
from continuum.bench.stats import wilson
from continuum.keys import OpKey
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.settings import Names, setting
from continuum.tiers.base import Hit, TierRequest, TierResult
from continuum.tiers.semantic import DEFAULT_THRESHOLD, SemanticTier
from continuum.tiers.semantic_calibration import Calibration
from continuum.tiers.verifier import JudgeVerifier, Verdict

MARGINS = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
PAIR_SETS = ("independent", "second")
SETS = (*PAIR_SETS, "groups")  # groups: many wordings per answer (bench.semantic_groups)
PARAMS = GenerationParams(max_tokens=64)
TIMING_SAMPLE = 20  # judgments timed when a set's margins were all cached


class VerifiedConfig(BenchSettings):
    """What a ``bench semantic-verified`` run is told (its command line is generated from it)."""

    judges: Names = setting(
        (
            "qwen2.5-coder-0.5b:intent",
            "qwen2.5-coder-0.5b:answer",
            "qwen2.5-coder-1.5b:intent",
            "qwen2.5-coder-1.5b:answer",
        ),
        "Judges, comma-separated MODEL:KIND (KIND intent or answer).",
    )
    sets: Names = setting(
        SETS, "Sets, comma-separated (independent, second; groups after a pair set)."
    )
    delta: float = setting(0.01, "The verified tier's error bound (its delta).", gt=0, le=0.5)
    floor: float = setting(0.5, "The lowest cosine at which a candidate is judged.", ge=-1, le=1)
    answer_tokens: int = setting(64, "Tokens of each greedy answer the answer judge sees.", ge=1)
    limit: int | None = setting(
        None, "At most this many pairs per pair set (groups: limit // 22 of them, >= 1).", ge=2
    )
    answers: str | None = setting(None, "A JSON file caching the answers between runs.")
    seed: int = setting(7, "The stream's shuffle.")
    cold: int = setting(8, "Requests answered cold (<= 256 tokens) to price the path.", ge=1)

    @field_validator("judges")
    @classmethod
    def _judges(cls, judges: tuple[str, ...]) -> tuple[str, ...]:
        if not judges:
            raise ValueError("give at least one judge, MODEL:intent or MODEL:answer")
        judge_specs(judges)  # MODEL:KIND each
        return judges

    @field_validator("answers")
    @classmethod
    def _answers(cls, answers: str | None) -> str | None:
        """A cache that exists must be a JSON object (one this bench wrote); else refused."""
        if answers is None or not Path(answers).exists():
            return answers
        try:
            saved = json.loads(Path(answers).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(
                f"{answers} is not a cache this bench wrote ({e}); give a new file name"
            ) from None
        if not isinstance(saved, dict):
            raise ValueError(f"{answers} is not a cache this bench wrote; give a new file name")
        return answers

    @field_validator("sets")
    @classmethod
    def _sets(cls, sets: tuple[str, ...]) -> tuple[str, ...]:
        if not sets or set(sets) - set(SETS):
            raise ValueError(f"sets must be among {', '.join(SETS)}; got {', '.join(sets)}")
        if sets[0] == "groups":
            raise ValueError(
                "groups is streamed with the judge the first pair set's table picks: name "
                "independent or second before it"
            )
        return sets


def judge_specs(names: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for name in names:
        model, _, kind = name.rpartition(":")
        if not model or kind not in ("intent", "answer"):
            raise ValueError(f"a judge is MODEL:intent or MODEL:answer, got {name!r}")
        out.append((model, kind))
    return out


class Answers:
    """The model's greedy answers to requests, cached by text (in ``path`` when given), and
    each judge's margins (deterministic too), cached by the judge's identity and the texts."""

    def __init__(self, backend: LlamaCppBackend, tokens: int, path: Path | None) -> None:
        self.backend = backend
        self.params = GenerationParams(max_tokens=tokens)
        self.key = f"{backend.model.digest}:{tokens}"
        self.path = path
        self.saved = json.loads(path.read_text()) if path is not None and path.exists() else {}
        self.cache: dict[str, str] = self.saved.setdefault(self.key, {})
        self.ms: list[float] = []

    def margins(self, judge: JudgeVerifier) -> dict[str, float | None]:
        """The cache of ``judge``'s margins (per ``b\x1fa``; None: no judgment was made)."""
        name = f"margins:{judge.identity}" + ("" if judge.kind == "intent" else f":{self.key}")
        found: dict[str, float | None] = self.saved.setdefault(name, {})
        return found

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.saved))

    def get(self, texts: Sequence[str], progress: Progress | None) -> dict[str, str]:
        todo = [t for t in dict.fromkeys(texts) if t not in self.cache]
        b = self.backend
        for i, text in enumerate(todo):
            if progress is not None:
                progress("answering the requests", i, len(todo))
            prompt = b.chat_format.render([{"role": "user", "content": text}], True)
            tokens = ([b.bos_id] if b.add_bos else []) + b.tokenize(prompt)
            b.clear()
            t0 = time.perf_counter()
            logits, _ = b.decode(tokens)
            assert logits is not None
            self.cache[text] = b.generate(logits, self.params).text
            self.ms.append((time.perf_counter() - t0) * 1000)
            if i % 20 == 19 or i == len(todo) - 1:
                self.save()
        return {t: self.cache[t] for t in texts}


class RecordedJudge:
    """A judge whose margins were computed already (by the same judge on the same texts); a
    judgment it does not hold is made by ``judge`` and recorded."""

    def __init__(self, judge: JudgeVerifier, margin: float, known: dict[str, float | None]):
        self.judge = judge
        self.kind = judge.kind
        self.threshold = margin
        self.known = known
        self.identity = f"{judge.identity}@{margin:g}"

    def verify(self, query: str, stored: str) -> Verdict:
        return self._recorded(query, stored, lambda: self.judge.verify(query, stored))

    def verify_answers(self, query: str, stored: str, answer: str, stored_answer: str) -> Verdict:
        return self._recorded(
            query, stored, lambda: self.judge.verify_answers(query, stored, answer, stored_answer)
        )

    def _recorded(self, query: str, stored: str, judge: Callable[[], Verdict]) -> Verdict:
        key = f"{query}\x1f{stored}"
        if self.known.get(key) is None:
            v = judge()
            if v.margin is None:
                return v
            self.known[key] = v.margin
        m = self.known[key]
        assert m is not None
        return Verdict(m >= self.threshold, "" if m >= self.threshold else "judge", m, 0.0)

    def close(self) -> None:
        """The judge is the bench's to close."""


def _candidates(scored: Sequence[dict[str, Any]], floor: float) -> list[dict[str, Any]]:
    return [p for p in scored if p["guard"] is None and p["cosine"] >= floor]


def judge_table(
    judge: JudgeVerifier,
    scored: Sequence[dict[str, Any]],
    floor: float,
    answers: dict[str, str],
    cache: dict[str, float | None],
    progress: Progress | None,
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """The judge over one set's candidates: its margin sweep and each pair's margin (read
    from ``cache`` when there, else judged and added to it)."""
    cands = _candidates(scored, floor)
    margins: dict[str, float | None] = {}
    ms: list[float] = []
    failed: Counter[str] = Counter()
    for i, p in enumerate(cands):
        key = f"{p['b']}\x1f{p['a']}"
        if key not in cache:
            if progress is not None and i % 10 == 0:
                progress(f"judging with {judge.identity}", i, len(cands))
            v = _judge(judge, p, answers)
            ms.append(v.ms)
            cache[key] = v.margin
            if v.margin is None:
                failed[v.reason] += 1
        margins[key] = cache[key]
    if not ms:  # every margin was cached: time the judge on a sample (its verdicts are known)
        for p in cands[:TIMING_SAMPLE]:
            ms.append(_judge(judge, p, answers).ms)
    same = sum(p["label"] == "same" for p in scored)
    different = len(scored) - same
    rows = []
    for m in MARGINS:
        ok = [p for p in cands if (margins[f"{p['b']}\x1f{p['a']}"] or -1e9) >= m]
        k = sum(p["label"] == "different" for p in ok)
        rows.append(
            {
                "margin": m,
                "paraphrase_hit": sum(p["label"] == "same" for p in ok) / max(same, 1),
                "false_hits": k,
                "false_hit": k / max(different, 1),
                "false_hit_ci95": wilson(k, different),
            }
        )
    table = {
        "judge": judge.identity,
        "judged": len(cands),
        "failed": dict(failed),
        "ms_p50": statistics.median(ms) if ms else None,  # None: nothing to judge
        "sweep": rows,
    }
    return table, margins


def _judge(judge: JudgeVerifier, p: dict[str, Any], answers: dict[str, str]) -> Verdict:
    if judge.kind == "intent":
        return judge.verify(p["b"], p["a"])
    return judge.verify_answers(p["b"], p["a"], answers[p["b"]], answers[p["a"]])


def best_row(table: dict[str, Any], delta: float) -> dict[str, Any] | None:
    """The margin with the most paraphrase hits whose false hits stay within ``delta``."""
    ok = [r for r in table["sweep"] if r["false_hit"] <= delta]
    return max(ok, key=lambda r: (r["paraphrase_hit"], r["margin"])) if ok else None


def _ask(text: str) -> TierRequest:
    return TierRequest(
        "bench",
        OpKey("k:" + text),
        "ask",
        PARAMS,
        (),
        ReusePolicy.always(),
        "llamacpp",
        "bench-model",
        messages=({"role": "user", "content": text},),
    )


def _text(hit: Hit) -> str:
    assert hit.result is not None  # the semantic tier serves results
    return hit.result.text


def _record(tier: SemanticTier, request: TierRequest, text: str) -> None:
    tier.record(request, TierResult(text, (), "stop", 0))
    assert tier.promoter is not None
    tier.promoter.drain()


def run_stream(
    tier: SemanticTier,
    scored: Sequence[dict[str, Any]],
    floor: float,
    answers: dict[str, str],
    seed: int,
) -> dict[str, Any]:
    """The verified tier fed every pair as ``a`` then ``b`` (see the module docstring); pairs
    it never judges (guard, floor, text it cannot judge) go through it too, with no answer."""
    rows = list(scored)
    random.Random(seed).shuffle(rows)
    warm = len(rows) // 2
    served: Counter[str] = Counter()
    for i, p in enumerate(rows):
        first = _ask(p["a"])
        if tier.lookup(first).outcome.outcome != "hit":
            _record(tier, first, answers.get(p["a"], ""))
        second = _ask(p["b"])
        got = tier.lookup(second)
        if not isinstance(got, Hit):
            _record(tier, second, answers.get(p["b"], ""))
        elif i >= warm:
            right = _text(got) == answers.get(p["a"]) and p["label"] == "same"
            served["paraphrase_hit" if right else "false_hit"] += 1
    measured = Counter(p["label"] for p in rows[warm:])
    out: dict[str, Any] = {
        "stream": len(rows),
        "warm_up": warm,
        "served": dict(served),
        "tier": tier.stats(),
    }
    promoted = {e.query for e, _ in tier.entries() if e.text != answers.get(e.query, e.text)}
    out["promoted_by_label"] = dict(Counter(p["label"] for p in rows if p["b"] in promoted))
    same = [p for p in scored if p["label"] == "same"]
    different = [p for p in scored if p["label"] == "different"]
    out["promoted_same_share"] = out["promoted_by_label"].get("same", 0) / max(len(same), 1)
    promoted_wrong = out["promoted_by_label"].get("different", 0)
    out["promoted_false_share"] = promoted_wrong / max(len(different), 1)
    out["promoted_false_ci95"] = wilson(promoted_wrong, len(different))
    out["first_sight_paraphrase_share"] = served["paraphrase_hit"] / max(measured["same"], 1)
    out["first_sight_false_share"] = served["false_hit"] / max(measured["different"], 1)
    out["first_sight_false_ci95"] = wilson(served["false_hit"], measured["different"])
    if rows and "c" in rows[0]:
        out["third_wording"] = _probe_third(tier, rows, answers)
    return out


def _probe_third(
    tier: SemanticTier, rows: Sequence[dict[str, Any]], answers: dict[str, str]
) -> dict[str, Any]:
    """Each ``c`` asked after the stream: served right, served wrong, or answered cold."""
    counts: Counter[str] = Counter()
    for p in rows:
        got = tier.lookup(_ask(p["c"]))
        if not isinstance(got, Hit):
            counts["cold"] += 1
        elif _text(got) == answers.get(p["b"]) or (
            _text(got) == answers.get(p["a"]) and p["label"] == "same"
        ):
            counts[f"right_{p['label']}"] += 1
        else:
            counts[f"wrong_{p['label']}"] += 1
    return dict(counts)


def run_verified(cfg: VerifiedConfig, progress: Progress | None = None) -> dict[str, Any]:
    specs = judge_specs(cfg.judges)
    embedder: Embedder = SentenceTransformerEmbedder()
    pair_sets = [name for name in cfg.sets if name in PAIR_SETS]
    scored_sets = {name: score_pairs(embedder, _limited(name, cfg)) for name in pair_sets}
    groups = load_groups(cfg.limit, cfg.seed) if "groups" in cfg.sets else []
    model = resolve_model(cfg.model)
    llama = LlamaConfig(n_ctx=2048, n_threads=cfg.threads, n_threads_batch=cfg.threads)
    backend = LlamaCppBackend(model, llama)
    try:
        answerer = Answers(backend, cfg.answer_tokens, Path(cfg.answers) if cfg.answers else None)
        cands = [p for s in scored_sets.values() for p in _candidates(s, cfg.floor)]
        texts = [t for p in cands for t in (p["a"], p["b"])]
        if any(kind == "answer" for _, kind in specs):  # an answer judge reads real answers
            texts += [row["text"] for row in groups]
        answers = answerer.get(texts, progress)
        tables: dict[str, dict[str, Any]] = {}
        margins: dict[str, dict[str, dict[str, float | None]]] = {}
        for model_name, kind in specs:
            judge = JudgeVerifier.open(
                resolve_model(model_name), share=backend, threads=cfg.threads, kind=kind
            )
            try:
                for name, scored in scored_sets.items():
                    cache = answerer.margins(judge)
                    table, found = judge_table(judge, scored, cfg.floor, answers, cache, progress)
                    answerer.save()
                    tables.setdefault(name, {})[f"{model_name}:{kind}"] = table
                    margins.setdefault(f"{model_name}:{kind}", {})[name] = found
                if groups:  # judged as the stream goes, kept in the cache for the next run
                    margins[f"{model_name}:{kind}"]["groups"] = answerer.margins(judge)
            finally:
                judge.close()
        questions = [p["a"] for p in next(iter(scored_sets.values()))[: cfg.cold]]
        cold = cold_answer_ms(backend, questions * cfg.reps)
        stream = _streams(cfg, specs, tables, margins, scored_sets, answers, embedder, backend)
        answerer.save()
    finally:
        backend.close()
    return {
        "experiment": "semantic-verified",
        "model": model.name,
        "embedder": getattr(embedder, "name", type(embedder).__name__),
        "config": cfg.model_dump(mode="json"),
        "tables": tables,
        "stream": stream,
        "cold_answer_ms_p50": statistics.median(cold),
        "guard_alone": {n: _guard_alone(s) for n, s in scored_sets.items()},
    }


def _limited(name: str, cfg: VerifiedConfig) -> list[dict[str, Any]]:
    rows = load_pairs(name)
    if cfg.limit is None:
        return rows
    random.Random(cfg.seed).shuffle(rows)
    return rows[: cfg.limit]


def _guard_alone(scored: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The guard alone at the tier's default threshold, on the same denominators."""
    same = [p for p in scored if p["label"] == "same"]
    different = [p for p in scored if p["label"] == "different"]
    hit = [p for p in scored if p["guard"] is None and p["cosine"] >= DEFAULT_THRESHOLD]
    k = sum(p["label"] == "different" for p in hit)
    return {
        "paraphrase_hit": sum(p["label"] == "same" for p in hit) / max(len(same), 1),
        "false_hit": k / max(len(different), 1),
        "false_hit_ci95": wilson(k, len(different)),
    }


def _streams(
    cfg: VerifiedConfig,
    specs: Sequence[tuple[str, str]],
    tables: dict[str, dict[str, Any]],
    margins: dict[str, dict[str, dict[str, float | None]]],
    scored_sets: dict[str, list[dict[str, Any]]],
    answers: dict[str, str],
    embedder: Embedder,
    backend: LlamaCppBackend,
) -> dict[str, Any]:
    """The stream with the judge and margin the first set's table picks."""
    first = next(iter(scored_sets))
    best: tuple[float, str, float] | None = None
    for model_name, kind in specs:
        name = f"{model_name}:{kind}"
        row = best_row(tables[first][name], cfg.delta)
        if row is not None and (best is None or row["paraphrase_hit"] > best[0]):
            best = (row["paraphrase_hit"], name, row["margin"])
    if best is None:
        return {"skipped": "no judge keeps false hits within delta at any margin"}
    _, name, margin = best
    model_name, _, kind = name.rpartition(":")
    out: dict[str, Any] = {"judge": name, "margin": margin, "chosen_on": first, "sets": {}}
    judge = JudgeVerifier.open(
        resolve_model(model_name),
        share=backend,
        threads=cfg.threads,
        kind=kind,
    )
    try:
        for set_name, scored in scored_sets.items():
            known = dict(margins[name][set_name])
            tier = _verified_tier(embedder, RecordedJudge(judge, margin, known), cfg)
            out["sets"][set_name] = run_stream(tier, scored, cfg.floor, answers, cfg.seed)
            ms = sorted(tier.counts.lookup_ms)
            out["sets"][set_name]["lookup_ms_p50"] = ms[len(ms) // 2] if ms else 0.0
            tier.close()
        if "groups" in cfg.sets:
            recorded = RecordedJudge(judge, margin, margins[name]["groups"])
            tier = _verified_tier(embedder, recorded, cfg)
            given = answers if kind == "answer" else None  # an intent judge reads no answers
            rows = load_groups(cfg.limit, cfg.seed)
            out["groups"] = run_groups_stream(tier, rows, _ask, given, cfg.seed)
            out["groups"]["judged"] = judged_sweep(rows, recorded.known, MARGINS)
            tier.close()
    finally:
        judge.close()
    return out


def _verified_tier(embedder: Embedder, judge: RecordedJudge, cfg: VerifiedConfig) -> SemanticTier:
    calibration = Calibration(cfg.delta)
    return SemanticTier(embedder, threshold=cfg.floor, verifier=judge, calibration=calibration)
