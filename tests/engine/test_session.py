"""The reuse stack on the real default model: memo, prefix KV, layer KV, policy, tools,
persistence across processes, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from continuum import (
    BackendRegistry,
    EngineConfig,
    GenerationParams,
    InvalidRequest,
    LlamaConfig,
    MetadataError,
    ModelFile,
    ReusePolicy,
    Session,
    TokenOp,
    ToolOp,
    UnknownBackend,
)
from continuum.backends.llamacpp_ops import LlamaCppOpBackend
from continuum.bench.conversation import long_system_prompt
from continuum.bench.tiers import QUESTIONS

GREEDY = GenerationParams(max_tokens=12)
SHARED = long_system_prompt(700)[:3000]  # a ~3,000-character shared prefix


def ask(question: str, system: str = SHARED, params: GenerationParams = GREEDY) -> TokenOp:
    return TokenOp(
        "answer",
        messages=(
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ),
        params=params,
    )


@pytest.fixture
def session(gemma: ModelFile, tmp_path: Path) -> Iterator[Session]:
    s = Session(
        "agent-fleet",
        BackendRegistry(),
        model=gemma,
        n_ctx=4096,
        n_slots=4,
        config=EngineConfig(snapshot_dir=tmp_path / "snapshots"),
    )
    yield s
    s.close()


def backend_of(s: Session) -> LlamaCppOpBackend:
    b = s.backend
    assert isinstance(b, LlamaCppOpBackend)
    return b


def calls_to(b: LlamaCppOpBackend, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Record what the model is asked to evaluate: (prompt tokens, tokens reused) per call."""
    seen: list[tuple[Any, ...]] = []
    real = b.generate

    def generate(tokens: Any, params: Any, **kw: Any) -> Any:
        seen.append((tuple(tokens), kw.get("reuse", 0)))
        return real(tokens, params, **kw)

    monkeypatch.setattr(b, "generate", generate)
    return seen


def cold(s: Session, op: TokenOp) -> str:
    """What the backend produces for ``op`` with every tier bypassed."""
    before = s.policy
    s.policy = ReusePolicy.never()
    try:
        r = s.run(op)
        assert r.metrics.hit_tier == "cold" and r.metrics.tokens_reused == 0
        return r.text
    finally:
        s.policy = before


def test_the_seed_snippet_runs() -> None:
    session = Session("agent-fleet", BackendRegistry())
    session.policy = ReusePolicy.always()
    session.policy = ReusePolicy.never()
    session.policy = ReusePolicy.threshold(min_len=64)
    assert session.policy.min_len == 64
    with pytest.raises(InvalidRequest):
        session.policy = "always"  # type: ignore[assignment]


SEED_SNIPPET = """\
from continuum._native import ReusePolicy, Session, BackendRegistry

session = Session("agent-fleet", BackendRegistry())
session.policy = ReusePolicy.always()             # reuse whenever a tier matches
session.policy = ReusePolicy.never()              # bypass every tier
session.policy = ReusePolicy.threshold(min_len=64)  # only reuse prefixes >= 64 tokens
"""


def test_the_seed_snippet_runs_verbatim() -> None:
    """Seed 003's "Setting a policy" snippet, character for character, in a fresh process."""
    code = SEED_SNIPPET + "assert session.policy.min_len == 64\nsession.close()\nprint('ok')\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_memo_serves_five_exact_repeats_without_the_backend(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = calls_to(backend_of(session), monkeypatch)
    first = session.run(ask(QUESTIONS[0]))
    assert first.metrics.hit_tier == "cold"
    seen = len(calls)
    repeats = [session.run(ask(QUESTIONS[0])) for _ in range(5)]
    assert [r.metrics.hit_tier for r in repeats] == ["memo"] * 5
    assert all(
        not r.metrics.backend_called and r.metrics.prompt_tokens_evaluated == 0 for r in repeats
    )
    assert {r.text for r in repeats} == {first.text}
    assert len(calls) == seen == 1  # 0 backend calls
    assert session.stats.calls_eliminated == 5


def test_memo_serves_only_deterministic_requests_unless_the_policy_opts_in(
    session: Session,
) -> None:
    sampled = GenerationParams(max_tokens=8, temperature=0.8)
    session.run(ask(QUESTIONS[1], params=sampled))
    again = session.run(ask(QUESTIONS[1], params=sampled))
    assert again.metrics.hit_tier != "memo" and again.metrics.backend_called
    seeded = GenerationParams(max_tokens=8, temperature=0.8, seed=7)
    session.run(ask(QUESTIONS[1], params=seeded))
    assert session.run(ask(QUESTIONS[1], params=seeded)).metrics.hit_tier == "memo"
    session.policy = ReusePolicy.always(nondeterministic=True)
    assert session.run(ask(QUESTIONS[1], params=sampled)).metrics.hit_tier == "memo"


@pytest.mark.slow
def test_prefix_kv_decodes_only_the_suffix_and_equals_a_cold_call(session: Session) -> None:
    b = backend_of(session)
    results = [session.run(ask(q)) for q in QUESTIONS]
    prompts = [b.prompt_tokens(ask(q).messages, None) for q in QUESTIONS]
    assert results[0].metrics.hit_tier == "cold"
    assert len(prompts[0]) > 600
    for i in range(1, len(QUESTIONS)):
        m = results[i].metrics
        common = max(
            next(
                (k for k, (x, y) in enumerate(zip(prompts[i], p, strict=False)) if x != y),
                min(len(p), len(prompts[i])),
            )
            for p in prompts[:i]
        )
        assert m.hit_tier == "prefix_kv"
        assert m.tokens_reused == min(common, len(prompts[i]) - 8)
        assert m.prompt_tokens_evaluated == len(prompts[i]) - m.tokens_reused < 40
    for i in (1, 5, 9):  # reuse never changes the answer: token-identical to a cold call
        assert results[i].text == cold(session, ask(QUESTIONS[i]))


@pytest.mark.slow
def test_layer_kv_restores_a_dropped_prefix_and_equals_cold(session: Session) -> None:
    system = long_system_prompt(2000)
    session.run(ask(QUESTIONS[0], system=system))
    assert session.drop_resident() == 1  # spilled into layer KV
    r = session.run(ask(QUESTIONS[1], system=system))
    assert r.metrics.hit_tier == "layer_kv" and r.metrics.tier("layer_kv").source == "ram"  # type: ignore[union-attr]
    assert r.metrics.tokens_reused > 1900
    assert r.text == cold(session, ask(QUESTIONS[1], system=system))


@pytest.mark.slow
def test_a_corrupt_snapshot_is_detected_and_falls_back_to_cold(
    session: Session, tmp_path: Path
) -> None:
    session.run(ask(QUESTIONS[0]))
    session.drop_resident()
    (snap,) = (tmp_path / "snapshots").glob("*.ckv")
    data = bytearray(snap.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snap.write_bytes(bytes(data))
    session.layer.store.release_ram()  # force the read from disk
    r = session.run(ask(QUESTIONS[1]))
    assert r.metrics.hit_tier == "cold" and r.metrics.tier("layer_kv").rejected == 1  # type: ignore[union-attr]
    assert session.layer.corrupt == 1 and not snap.exists()
    assert r.text == cold(session, ask(QUESTIONS[1]))


@pytest.mark.slow
def test_policy_never_sends_exactly_what_the_backend_would_see_alone(
    session: Session, gemma: ModelFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = ask("Trailing spaces stay   \r\nas sent.  ")
    calls = calls_to(backend_of(session), monkeypatch)
    session.run(op)  # populate the tiers first: never() must ignore them
    session.policy = ReusePolicy.never()
    memo_before = len(session.memo)
    r = session.run(op)
    assert r.metrics.hit_tier == "cold" and r.metrics.tokens_reused == 0
    plain = LlamaCppOpBackend(gemma, config=LlamaConfig(n_ctx=4096), n_slots=0)
    try:
        alone = plain.prompt_tokens(op.messages, None)
        expected = plain.generate(alone, op.params)
        assert calls[-1] == (tuple(alone), 0)  # identical model inputs, nothing reused
        assert r.text == expected.text
    finally:
        plain.close()
    assert len(session.memo) == memo_before


@pytest.mark.slow
def test_threshold_policy_gates_every_tier(session: Session) -> None:
    b = backend_of(session)
    n = len(b.prompt_tokens(ask(QUESTIONS[0]).messages, None))
    session.policy = ReusePolicy.threshold(min_len=n + 100)  # longer than any prompt here
    session.run(ask(QUESTIONS[0]))
    again = session.run(ask(QUESTIONS[0]))
    assert again.metrics.hit_tier == "cold"  # neither memo nor a prefix may serve it
    session.policy = ReusePolicy.threshold(min_len=64)
    assert session.run(ask(QUESTIONS[0])).metrics.hit_tier == "memo"
    assert session.run(ask(QUESTIONS[2])).metrics.hit_tier == "prefix_kv"


def test_tool_ops_always_run_unless_read_only(session: Session) -> None:
    calls: list[dict[str, int]] = []

    def lookup(x: int) -> int:
        calls.append({"x": x})
        return x * 2

    results = [session.run(ToolOp("lookup", lookup, {"x": 3})) for _ in range(3)]
    assert len(calls) == 3 and all(r.value == 6 for r in results)
    assert all(r.metrics.hit_tier == "tool" for r in results)
    ro = [session.run(ToolOp("lookup", lookup, {"x": 4}, read_only=True)) for _ in range(3)]
    assert len(calls) == 4 and [r.metrics.hit_tier for r in ro] == ["tool", "memo", "memo"]
    session.policy = ReusePolicy.never()
    session.run(ToolOp("lookup", lookup, {"x": 4}, read_only=True))
    assert len(calls) == 5


def test_bad_input_is_a_typed_error(gemma: ModelFile, tmp_path: Path) -> None:
    with pytest.raises(UnknownBackend) as e:
        Session("ns", BackendRegistry(), backend="no-such-backend")
    assert "llamacpp" in str(e.value)
    with pytest.raises(InvalidRequest) as e2:
        TokenOp("answer", prompt="hi", params={"temprature": 0.0})  # type: ignore[arg-type]
    assert "temprature" in str(e2.value)
    with pytest.raises(InvalidRequest):
        TokenOp("answer")
    with pytest.raises(InvalidRequest):
        TokenOp("answer", prompt="hi", messages=({"role": "user", "content": "hi"},))
    with pytest.raises(InvalidRequest):
        Session("", BackendRegistry())
    s = Session(
        "ns",
        BackendRegistry(),
        model=gemma,
        n_ctx=1024,
        n_slots=1,
        config=EngineConfig(snapshot_dir=tmp_path / "snaps"),
    )
    try:
        garbage = tmp_path / "garbage.db"
        garbage.write_bytes(b"not sqlite at all" * 10)
        with pytest.raises(MetadataError):
            s.load_cache_metadata(garbage)
        with pytest.raises(MetadataError):
            s.load_cache_metadata(tmp_path / "missing.db")
        s.run(TokenOp("answer", prompt="Hello there", params=GREEDY))
        good = tmp_path / "meta.db"
        s.save_cache_metadata(good)
        import sqlite3

        with sqlite3.connect(good) as db:
            db.execute("UPDATE meta SET value = '99' WHERE key = 'format_version'")
        with pytest.raises(MetadataError) as e3:
            s.load_cache_metadata(good)
        assert "format version" in str(e3.value)
        with pytest.raises(InvalidRequest):
            s.run("not an op")  # type: ignore[arg-type]
    finally:
        s.close()


_WORKLOAD = textwrap.dedent("""
    import json, sys
    from continuum import (BackendRegistry, EngineConfig, GenerationParams, MetadataError,
                           ReusePolicy, Session, TokenOp)
    from continuum.bench.conversation import long_system_prompt
    phase, meta, snaps = sys.argv[1], sys.argv[2], sys.argv[3]
    system = long_system_prompt(700)[:3000]
    s = Session("agent-fleet", BackendRegistry(), n_ctx=4096, n_slots=4,
                config=EngineConfig(snapshot_dir=snaps))
    if phase == "second":
        s.load_cache_metadata(meta)
    texts = []
    for q in ["What is rule one?", "Summarise section 2.", "Who escalates?", "Item 3 limit?",
              "Record numbers?", "Deadlines?", "A record type?", "Section 5?"]:
        op = TokenOp("answer", messages=({"role": "system", "content": system},
                                         {"role": "user", "content": q}),
                     params=GenerationParams(max_tokens=8))
        texts.append(s.run(op).text)
    saved = None
    if phase == "first":
        try:
            s.save_cache_metadata(meta)
        except MetadataError as e:  # typed, and the ops' results are already returned
            saved = str(e)
    print(json.dumps({"texts": texts, "save_error": saved, **s.metrics()}))
    s.close()
""")


def _phase(phase: str, meta: Path, snaps: Path, limit_file_bytes: int | None = None) -> dict:  # type: ignore[type-arg]
    code = _WORKLOAD
    if limit_file_bytes is not None:
        code = (
            "import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_file_bytes}, {limit_file_bytes}))\n"
            + code
        )
    done = subprocess.run(
        [sys.executable, "-c", code, phase, str(meta), str(snaps)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_warm_restart_in_a_new_process_hits_at_least_80_percent(tmp_path: Path) -> None:
    first = _phase("first", tmp_path / "meta.db", tmp_path / "snaps")
    second = _phase("second", tmp_path / "meta.db", tmp_path / "snaps")
    assert first["hit_rate"] >= 0.8  # one cold call, then shared-prefix hits
    assert second["hit_rate"] >= 0.8
    assert second["hits"].get("memo", 0) == 0  # resume bumped the memo version
    assert second["hits"]["layer_kv"] >= 1  # the first op came back from disk
    assert second["texts"] == first["texts"]
    assert first["save_error"] is None


@pytest.mark.slow
def test_a_full_disk_while_writing_a_snapshot_loses_nothing(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes every write past 64 KiB fail (EFBIG), as a full disk would
    out = _phase("first", tmp_path / "meta.db", tmp_path / "snaps", limit_file_bytes=64 << 10)
    assert len(out["texts"]) == 8 and all(isinstance(t, str) for t in out["texts"])
    assert out["hits"]["prefix_kv"] >= 6
    assert out["snapshot_write_errors"] >= 1  # counted, and the ops went on
    assert out["bytes_resident"]["snapshots_ram"] > 0  # the snapshots stayed in RAM
    # saving the metadata on the full disk fails with a typed error and leaves no torn file
    assert out["save_error"] and "could not be written" in out["save_error"]
    assert not (tmp_path / "meta.db").exists()


@pytest.mark.slow
def test_tenants_never_see_each_others_entries(gemma: ModelFile, tmp_path: Path) -> None:
    cfg = EngineConfig(snapshot_dir=tmp_path / "shared-snaps")
    a = Session("tenant-a", BackendRegistry(), model=gemma, n_ctx=4096, n_slots=2, config=cfg)
    try:
        a.run(ask(QUESTIONS[0]))
        a.save_cache_metadata(tmp_path / "a.db")
    finally:
        a.close()
    b = Session("tenant-b", BackendRegistry(), model=gemma, n_ctx=4096, n_slots=2, config=cfg)
    try:
        loaded = b.load_cache_metadata(tmp_path / "a.db")
        assert loaded["snapshots"] >= 1
        r = b.run(ask(QUESTIONS[0]))
        assert r.metrics.hit_tier == "cold"  # same tokens, same snapshot dir, other tenant
    finally:
        b.close()
