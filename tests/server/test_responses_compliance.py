"""The Open Responses compliance suite, run unchanged by Bun against a real ``continuum serve``
on the default model (Qwen2.5-Coder-0.5B-Instruct), and what that suite does not check.

The suite is upstream's CLI runner and the modules it imports, vendored in
``tests/vendor/openresponses`` (see its README for the commit). Bun and the suite's one package,
zod, come from the npm registry at the versions upstream pins, into a temporary folder beside a
copy of the suite; npm that cannot be reached fails the module, it never skips it. The suite
sends no ``max_output_tokens`` and wants ``status: completed``, so the server keeps its own
default reply length (``ServerConfig.default_max_tokens``) rather than the tests' short one; it
sends no seed either, so the server's own (``ServerConfig.seed``) makes its sampling repeatable.

The suite runs once; each of its tests is one test here, which prints that test's request,
response and errors when it fails. Beside it, on the same server: a three-response
``previous_response_id`` chain that remembers its first message, two forks of one response that
do not see each other, and a ``store: false`` response that cannot be retrieved. What
``tests/server/test_responses.py`` already covers is not repeated (a stored response retrieved
and deleted, a fork's reused tokens, the compaction item read back as a note)."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from continuum.server.state import ServerConfig
from tests.server.test_app import Running, _serve

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

MODEL = "qwen2.5-coder-0.5b"
SUITE = Path(__file__).resolve().parents[1] / "vendor" / "openresponses"
BUN = "1.3.12"  # upstream's .tool-versions
ZOD = "3.25.76"  # upstream's bun.lock
# the platform package carries the binary itself (the `bun` package's postinstall only picks
# one of these); baseline runs on any x86-64, without AVX2
BUN_PACKAGES = {"x86_64": "@oven/bun-linux-x64-baseline", "aarch64": "@oven/bun-linux-aarch64"}
# every test the vendored suite defines, in its order: a new vendored commit updates this list
SUITE_IDS = (
    "basic-response",
    "assistant-phase",
    "response-output-phase-schema",
    "streaming-response",
    "websocket-response",
    "websocket-sequential-responses",
    "websocket-continuation",
    "websocket-reconnect-store-false-recovery",
    "websocket-previous-response-not-found",
    "websocket-failed-continuation-evicts-cache",
    "websocket-compact-new-chain",
    "system-prompt",
    "tool-calling",
    "image-input",
    "multi-turn",
    "compact-response",
    "compact-missing-model",
)
BRIEF = "Answer in a few words."
# The suite samples at the Responses default temperature 1 and sends no seed; a fixed server
# seed (serve --seed) makes each run the same on one machine. The 0.5B model answers the
# tool-calling prompt in prose instead of a call in about one run of eight, and which seed
# draws prose depends on the CPU's arithmetic (seed 0 calls the tool on AVX2 machines and
# asks for the location on AVX-512 ones): so a prose answer there — the model's choice, read
# from the response — runs that one test again under the next seeds, up to PROSE_RETRIES
# times. A server that never returns a call fails every try.
SEED = 0
PROSE_RETRIES = 3
SAMPLED = "tool-calling"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(
        tmp_path_factory.mktemp("compliance"),
        model=MODEL,
        default_max_tokens=ServerConfig.default_max_tokens,
        seed=SEED,
    )


# --- the Open Responses compliance suite -----------------------------------------------------


def install_suite(root: Path) -> tuple[Path, Path]:
    """The vendored suite copied under ``root``, with Bun and zod installed from npm beside it:
    the suite's folder and the Bun binary."""
    assert sys.platform == "linux", f"no Bun package is pinned for {sys.platform}"
    package = BUN_PACKAGES[platform.machine()]
    npm = shutil.which("npm")
    assert npm is not None, "npm (Node.js) is needed to install Bun"
    suite = root / "openresponses"
    shutil.copytree(SUITE, suite)
    (suite / "package.json").write_text('{"private": true}\n')
    flags = ["--no-audit", "--no-fund", "--ignore-scripts", "--no-save"]
    proc = subprocess.run(
        [npm, "install", *flags, f"{package}@{BUN}", f"zod@{ZOD}"],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"npm install failed:\n{proc.stdout}\n{proc.stderr}"
    bun = suite / "node_modules" / package / "bin" / "bun"
    version = subprocess.run([bun, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == BUN
    return suite, bun


@dataclass
class SuiteRun:
    """What one run of the suite's CLI printed: its JSON report, by test ID."""

    stdout: str
    stderr: str
    results: dict[str, dict[str, Any]]
    summary: dict[str, int]
    retried: list[dict[str, Any]] = field(default_factory=list)  # prose answers run again


@pytest.fixture(scope="module")
def compliance(srv: Running, tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    suite, bun = install_suite(tmp_path_factory.mktemp("bun"))
    args = ["--base-url", srv.url + "/v1", "--api-key", "none", "--model", srv.state.model_id]
    proc = subprocess.run(
        [bun, "bin/compliance-test.ts", *args, "--json"],
        cwd=suite,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"the suite printed no JSON report (exit {proc.returncode}):\n"
            f"{proc.stdout}\n{proc.stderr}"
        )
    results = {r["id"]: r for r in report["results"]}
    run = SuiteRun(proc.stdout, proc.stderr, results, report["summary"])
    for seed in range(SEED + 1, SEED + 1 + PROSE_RETRIES):
        if not answered_in_prose(run.results.get(SAMPLED)):
            break
        srv.state.config.seed = seed  # read per request: the next try samples another reply
        again = subprocess.run(
            [bun, "bin/compliance-test.ts", *args, "--json", "--filter", SAMPLED],
            cwd=suite,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        (retry,) = json.loads(again.stdout)["results"]
        run.retried.append(run.results[SAMPLED])
        run.results[SAMPLED] = retry
    srv.state.config.seed = SEED
    print(f"\ncompliance: {len(run.retried)} prose answer(s) to {SAMPLED} run again")
    return run


def answered_in_prose(result: dict[str, Any] | None) -> bool:
    """Whether a failed test's response is a completed reply of text alone (the model chose
    prose over a call), not an error or a malformed item."""
    if result is None or result["status"] == "passed":
        return False
    response = result.get("response") or {}
    output = response.get("output") or []
    return (
        response.get("status") == "completed"
        and bool(output)
        and all(item.get("type") == "message" for item in output)
    )


def test_the_suite_ran_every_test_it_defines(compliance: SuiteRun) -> None:
    assert sorted(compliance.results) == sorted(SUITE_IDS), compliance.stdout
    assert compliance.summary["skipped"] == 0, compliance.stdout
    assert compliance.summary["total"] == len(SUITE_IDS)


# what the server does not implement, each test expected to fail (strictly: one that starts
# passing fails here, so the list is mended): images (no model here reads them: an
# input_image part is a 400 naming it)
NOT_IMPLEMENTED = {
    "image-input": "no vision model: input_image parts are refused with a 400 naming them",
}


@pytest.mark.parametrize(
    "test_id",
    [
        pytest.param(t, marks=pytest.mark.xfail(reason=NOT_IMPLEMENTED[t], strict=True))
        if t in NOT_IMPLEMENTED
        else t
        for t in SUITE_IDS
    ],
)
def test_open_responses_compliance(compliance: SuiteRun, test_id: str) -> None:
    result = compliance.results.get(test_id)
    assert result is not None, f"{test_id} did not run:\n{compliance.stdout}\n{compliance.stderr}"
    assert result["status"] == "passed", (
        f"{result['name']}: {result['status']}\n"
        f"errors: {json.dumps(result.get('errors'), indent=2)}\n"
        f"request: {json.dumps(result.get('request'), indent=2)}\n"
        f"response: {json.dumps(result.get('response'), indent=2)}\n"
        f"stderr: {compliance.stderr}\n"
        f"earlier tries, answered in prose: {len(compliance.retried) if test_id == SAMPLED else 0}"
    )


# --- what the suite does not check ------------------------------------------------------------


def create(srv: Running, **kw: Any) -> Any:
    kw.setdefault("max_output_tokens", 16)
    kw.setdefault("instructions", BRIEF)
    return srv.client().responses.create(model=srv.state.model_id, temperature=0, **kw)


def test_a_chain_of_three_answers_from_its_first_message(srv: Running) -> None:
    first = create(srv, input="My name is Priya. Reply with OK.")
    second = create(srv, input="I live in Madrid. Reply with OK.", previous_response_id=first.id)
    third = create(
        srv, input="What is my name, and where do I live?", previous_response_id=second.id
    )
    assert "Priya" in third.output_text and "Madrid" in third.output_text, third.output_text
    # each continuation is served on top of what the chain already holds
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens
    c = srv.client()
    for response, previous in ((third, second.id), (second, first.id), (first, None)):
        stored = c.responses.retrieve(response.id)
        assert stored.previous_response_id == previous
        assert stored.output_text == response.output_text and stored.status == response.status


def test_two_forks_of_one_response_do_not_see_each_other(srv: Running) -> None:
    base = create(srv, input="My name is Priya. Reply with OK.")
    green = create(srv, input="My car is green. Reply with OK.", previous_response_id=base.id)
    blue = create(srv, input="My car is blue. Reply with OK.", previous_response_id=base.id)
    ask = "What colour is my car?"
    on_green = create(srv, input=ask, previous_response_id=green.id).output_text.lower()
    on_blue = create(srv, input=ask, previous_response_id=blue.id).output_text.lower()
    assert "green" in on_green and "blue" not in on_green, on_green
    assert "blue" in on_blue and "green" not in on_blue, on_blue
    assert green.previous_response_id == blue.previous_response_id == base.id


def test_a_response_not_stored_cannot_be_retrieved_or_deleted(srv: Running) -> None:
    r = create(srv, input="Say hello.", store=False)
    assert r.id.startswith("resp_") and r.output_text
    with srv.http() as h:
        got = h.get(f"/v1/responses/{r.id}")
        assert got.status_code == 404, got.text
        assert h.delete(f"/v1/responses/{r.id}").status_code == 404


def test_the_server_seed_makes_sampled_replies_repeatable(srv: Running) -> None:
    c = srv.client()
    ask = [{"role": "user", "content": "Name three fruits."}]
    chat = c.chat.completions.create(
        model=srv.state.model_id, temperature=1.0, max_tokens=16, messages=ask
    )
    again = c.chat.completions.create(
        model=srv.state.model_id, temperature=1.0, max_tokens=16, messages=ask
    )
    extra = again.usage.model_extra["continuum"]  # type: ignore[union-attr,index]
    assert extra["hit_tier"] == "memo"  # seeded: deterministic, so the memo may answer it
    # a session turn never reads the memo: it samples the same tokens from the same seed
    sid = c.post("/sessions", body={}, cast_to=object)["id"]  # type: ignore[index]
    turn = c.post(
        f"/sessions/{sid}/messages",
        cast_to=object,
        body={"messages": ask, "temperature": 1.0, "max_tokens": 16},
    )
    assert turn["choices"][0]["message"]["content"] == chat.choices[0].message.content  # type: ignore[index]
    # the request's own seed wins over the server's
    own = c.chat.completions.create(
        model=srv.state.model_id, temperature=1.0, max_tokens=16, messages=ask, seed=SEED + 1
    )
    assert own.usage.model_extra["continuum"]["hit_tier"] != "memo"  # type: ignore[union-attr,index]
