"""``continuum serve --draft N`` on the real model (Gemma 3 270M), four lanes: replies draft from
their own context inside the server's batch steps. Greedy answers, one at a time and several at
once, stateless and in sessions, are the answers of a server that does not draft; /metrics says
what the drafts kept. A server on an upstream cannot draft: ``--draft`` is refused there before
anything loads (test_settings_options)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server.test_app import Running, _serve

NAMES = (
    ("Dana", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim"),
    ("Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gil", "Hu"),
    ("Lea", "Max", "Ned", "Oda", "Pia", "Rex", "Sam", "Tia"),
)


def _quote(names: tuple[str, ...]) -> str:
    rows = "\n".join(f"record R-{1000 + i}: owner {n}, status late" for i, n in enumerate(names))
    return f"The late records:\n{rows}\n\nCopy these records exactly, one a line."


# one alone first (a stateless request), then three at once: two quoting (one in a session),
# one prose with nothing to quote
ALONE = _quote(NAMES[0])
AT_ONCE = (_quote(NAMES[1]), _quote(NAMES[2]), "Write two sentences about the sea.")


def _answers(srv: Running) -> tuple[str, list[str]]:
    client = srv.client()

    def ask(content: str, session: str | None = None) -> str:
        got = client.chat.completions.create(
            model=srv.state.model_id,
            max_tokens=120,
            temperature=0,
            messages=[{"role": "user", "content": content}],
            extra_headers={"x-session-id": session} if session else None,
        )
        return got.choices[0].message.content or ""

    alone = ask(ALONE)
    with ThreadPoolExecutor(3) as pool:
        sessions = ("drafting-a", None, None)
        at_once = list(pool.map(ask, AT_ONCE, sessions))
    return alone, at_once


def _metric(srv: Running, kind: str) -> float:
    text = srv.http().get("/metrics").text
    found = re.search(rf'^continuum_draft_tokens{{kind="{kind}"}} ([0-9.e+]+)$', text, re.M)
    assert found is not None, text
    return float(found.group(1))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    served = _serve(tmp_path_factory.mktemp("plain"), model="gemma3-270m", n_ctx=2048)
    try:
        return _answers(next(served))
    finally:
        served.close()  # the server stops before the drafting one starts


@pytest.fixture(scope="module")
def drafting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(
        tmp_path_factory.mktemp("drafting"), model="gemma3-270m", n_ctx=2048, draft=16
    )


@pytest.mark.slow  # two servers on the real model, 13 s in the full run
def test_a_drafting_server_answers_as_one_that_does_not(
    plain: tuple[str, list[str]], drafting: Running
) -> None:
    assert drafting.state.worker is not None and drafting.state.worker.scheduler is not None
    alone, at_once = _answers(drafting)
    assert (alone, at_once) == plain
    assert _metric(drafting, "kept") > 0  # the quoting replies kept drafts
    assert _metric(drafting, "drafted") >= _metric(drafting, "kept")
