"""The semantic tier's judge on a server-shaped engine (sessions in lanes) that runs the judge's
own model: the judge is a sequence of the one context (a KV stream after the lanes'), not a
context apart, and its judgments are commands the step loop applies between its steps, made on
the loop's thread while sessions generate. Its margins are those of a judge on a context of its
own. Real models: Qwen2.5-Coder-0.5B-Instruct (the default, and the default judge) and
all-MiniLM-L6-v2."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from continuum.backends.embedders import SentenceTransformerEmbedder
from continuum.engine import Engine, EngineSettings, compose
from continuum.params import GenerationParams
from continuum.tiers.verifier import JudgeVerifier
from tests.conftest import model
from tests.engine.test_core_one_owner import _record

PAIRS = (
    ("Can you tell me what Kubernetes is?", "Explain what Kubernetes is."),
    ("How do I convert euros to dollars?", "How do I convert dollars to euros?"),
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    tmp = tmp_path_factory.mktemp("judge")
    settings = EngineSettings.of(
        model="qwen2.5-coder-0.5b",
        n_ctx=2048,
        parallel=2,
        threads=2,
        semantic=True,
        store=tmp / "h.db",
        snapshot_dir=tmp / "s",
    )
    with compose(settings, embedder=SentenceTransformerEmbedder()) as e:
        yield e


def _judge(e: Engine) -> JudgeVerifier:
    assert e.semantic is not None and isinstance(e.semantic.verifier, JudgeVerifier)
    return e.semantic.verifier


@pytest.mark.slow  # about 15 s alone
def test_the_judge_is_a_sequence_of_the_one_context(engine: Engine) -> None:
    judge, llama = _judge(engine), engine.backend.llama  # type: ignore[attr-defined]
    assert judge.backend is llama and judge.seq == 2  # after the two lanes' streams
    assert llama.config.n_seq_max == 3 and llama.config.kv_unified is False
    w = engine.worker()
    assert w.scheduler is not None and w.scheduler.backend is llama  # lanes on that context
    apart = JudgeVerifier.open(model("qwen2.5-coder-0.5b"), threads=2, timeout_s=60.0)
    try:
        alone = [apart.verify(a, b).margin for a, b in PAIRS]
    finally:
        apart.close()
    assert all(m is not None for m in alone)
    head = list(llama.seq_tokens(judge.seq))
    judge.timeout_s = 60.0  # what it judges must not depend on how busy the machine is
    assert [judge.verify(a, b).margin for a, b in PAIRS] == alone
    assert llama.seq_tokens(judge.seq) == head  # only the instruction stays between judgments


@pytest.mark.slow  # about 20 s alone
def test_judgments_are_made_by_the_step_loop_while_sessions_generate(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    judge, w = _judge(engine), engine.worker()
    judge.timeout_s = 60.0
    assert w.scheduler is not None
    quiet = [judge.verify(a, b).margin for a, b in PAIRS]
    seen = _record(monkeypatch)
    session = w.create_session("You are a storyteller.")
    replies: list[str] = []
    talk = threading.Thread(
        target=lambda: replies.append(
            session.append(
                [{"role": "user", "content": "Count from 1 to 300, separated by commas."}],
                GenerationParams(max_tokens=200),
            ).text
        )
    )
    talk.start()
    busy = [judge.verify(a, b).margin for a, b in PAIRS]
    assert talk.is_alive()  # the judgments came while the session generated
    talk.join(120)
    assert replies and replies[0]
    assert busy == quiet  # judged between the session's steps, as on a quiet context
    loop = w.scheduler._thread.ident
    off_loop = {key: n for key, n in seen.items() if key[1] != loop}
    assert not off_loop, f"actions made off the step loop's thread: {off_loop}"
