"""``bench fleet`` on real fleets (Redis + workers on the test model + HAProxy), small: a row
per worker count, every turn committed and read back in order, counts that add up, hops
measured on the worker that owns the probe session, a replay that issues the commands the
live turns did; and the read-back check itself fails on a session that is not as sent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from continuum.bench.fleet import _verify, format_table, report_fleet, reset_kind
from continuum.cli.main import main
from continuum.server.fleet import running_fleet, worker_args
from tests.redis_server import free_port

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

SESSIONS, TURNS, MAX_TOKENS = 3, 2, 4


def test_a_small_fleet_bench_has_a_row_per_worker_count_and_commits_every_turn(
    tmp_path: Path,
) -> None:
    args = [
        "bench",
        "fleet",
        "--workers",
        "1,2",
        "--sessions",
        str(SESSIONS),
        "--turns",
        str(TURNS),
        "--max-tokens",
        str(MAX_TOKENS),
        "--parallel",
        "2",
        "--hop-pairs",
        "2",
        "--health-pairs",
        "10",
        "--note",
        "a test run",
        "--json",
        "--out",
        str(tmp_path),
        "--plot",
        str(tmp_path / "fleet.png"),
    ]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)  # stdout is the data alone; progress went to stderr
    assert r == json.loads((tmp_path / "fleet.json").read_text())
    assert (tmp_path / "fleet.png").read_bytes()[:4] == b"\x89PNG"
    assert [row["workers"] for row in r["rows"]] == [1, 2]
    want = SESSIONS * TURNS
    for row in r["rows"]:
        assert len(row["worker_ports"]) == row["workers"]
        assert row["turns_sent"] == row["turns_answered"] == row["turns_committed"] == want
        assert row["turns_failed"] == [] and row["sessions_wrong"] == []
        assert row["sessions_in_order"] == SESSIONS
        # what the streams reported is what the history logged, kind by kind
        assert row["resets_seen_by_clients"] == sum(row["resets"].values())
        assert 0 < row["tokens"] <= want * MAX_TOKENS
        assert row["turns_per_s"] == pytest.approx(want / row["span_s"])
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["span_s"])
        assert row["ttft_ms_p95"] >= row["ttft_ms_p50"] > 0
        hop = row["router_hop"]
        assert 1 <= hop["owner"] <= row["workers"] and hop["owner_turns_seen"] == 1
        assert hop["probe_resets"] == 0  # routed and direct reached the same resident KV
        assert hop["turn"]["pairs"] == 2 and hop["health"]["pairs"] == 10
        replay, live = row["redis_hop"], row["redis_live"]
        assert replay["turns"] == want and replay["sessions_skipped"] == 0
        assert replay["redis_ms"] > 0 and replay["sqlite_ms"] > 0
        per_turn = replay["replay"]["by_command_per_turn"]
        assert per_turn["llen"] == 1.0  # one commit script per turn (its LLEN)
        assert live["turns"] == want
        # the replay sends what the live turns sent, but for each connection's setup
        setup = ("hello", "script|load")
        live_turn = {k: v for k, v in live["by_command_per_turn"].items() if k not in setup}
        assert per_turn == live_turn
    assert any(row["redis_live"]["by_command_per_turn"].get("zrem") for row in r["rows"])
    table = format_table(r)
    for n in (1, 2):
        assert f"| {n} | {want}/{want} | {SESSIONS}/{SESSIONS} |" in table
    lines: list[str] = []
    misses: list[str] = []
    report_fleet(lines, misses, r)
    assert "## A local fleet: Redis + N workers + HAProxy" in lines and misses == []
    assert "a test run" in lines and r["note"] == "a test run"
    assert "--note" not in r["command"]  # a label, not part of what is measured
    lost = {**r, "rows": [{**r["rows"][0], "turns_committed": want - 1}, r["rows"][1]]}
    report_fleet([], misses, lost)
    assert misses == [
        f"fleet of 1: {want - 1} of {want} turns committed, {SESSIONS} of "
        f"{SESSIONS} sessions as sent, in order (goal: all)."
    ]
    assert r["command"].startswith("continuum bench fleet --workers 1,2 --sessions 3")


def test_the_read_back_check_fails_on_a_session_that_is_not_as_sent(tmp_path: Path) -> None:
    args = worker_args(workers=1, threads=1, n_ctx=2048, parallel=2, model=None)
    with running_fleet(
        tmp_path / "fleet", workers=1, port=free_port(), serve_args=args, say=lambda _: None
    ) as fleet:
        sid = "check-1"
        body = {"system": "Be brief.", "session_id": sid}
        httpx.post(f"{fleet.url}/v1/sessions", json=body, timeout=120).raise_for_status()
        msg = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 3}
        turn = httpx.post(f"{fleet.url}/v1/sessions/{sid}/messages", json=msg, timeout=120)
        text = turn.json()["choices"][0]["message"]["content"]
        ok = [[{"text": text, "turn": 1}]]
        assert _verify(fleet.url, [sid], ["Say OK."], ok)["sessions_in_order"] == 1
        for sent, got in (
            (["Say OK.", "Say more."], ok),  # a turn that never committed
            (["Say no."], ok),  # another message than the one sent
            (["Say OK."], [[{"text": text + "!", "turn": 1}]]),  # another reply
            (["Say OK."], [[{"text": text, "turn": 2}]]),  # out of order
        ):
            checked = _verify(fleet.url, [sid], sent, got)
            assert checked["sessions_in_order"] == 0 and checked["sessions_wrong"] == [sid]
            assert checked["turns_committed"] == 1


def test_resets_are_counted_by_kind() -> None:
    rebuilt = "reopened: KV rebuilt from the history log"
    restored = {"reason": "evicted", "detail": f"{rebuilt}; restored 40 tokens from a KV snapshot"}
    assert reset_kind(restored) == "restored"
    assert reset_kind({"reason": "evicted", "detail": rebuilt}) == "rebuilt"
    assert reset_kind({"reason": "restore_failed", "detail": "bad checksum"}) == "rebuilt"
    assert reset_kind({"reason": "high_water", "detail": ""}) == "high_water"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--workers", "0"], "each >= 1"),
        (["--workers", "two"], "must be integers"),
        (["--workers", "1,65"], "at most 64"),
        (["--sessions", "0"], "--sessions"),
        (["--turns", "99"], "--turns"),
        (["--threads", "0"], "--threads"),
        (["--parallel", "33"], "--parallel"),
        (["--hop-pairs", "0"], "--hop-pairs"),
    ],
)
def test_bad_options_are_usage_errors_that_say_what_to_fix(args: list[str], said: str) -> None:
    r = CliRunner().invoke(main, ["bench", "fleet", *args])
    assert r.exit_code == 2 and said in r.output, r.output
