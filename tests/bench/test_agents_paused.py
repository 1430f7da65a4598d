"""``bench agents-paused``: more agents than lanes, each pausing for its tools. The figures'
arithmetic on hand-made calls, the bad inputs, and one small run on the real model in which
no paused agent's history is prefilled again (every snapshot fits the RAM budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from continuum.bench.agent_trace import TraceShape
from continuum.bench.agents_paused import (
    SLACK,
    PausedPlan,
    format_table,
    kv_source,
    run_agents_paused,
    summarise,
)
from continuum.bench.agents_paused_report import report_section
from continuum.bench.plots import plot_agents_paused
from continuum.errors import InvalidRequest


def _usage(tier: str, evaluated: int, source: str = "") -> dict[str, Any]:
    tiers = [{"tier": "layer_kv", "outcome": "hit", "source": source}] if source else []
    c = {"hit_tier": tier, "prompt_tokens_evaluated": evaluated, "tiers": tiers}
    return {"usage": {"continuum": c}}


def test_where_a_calls_kv_came_from() -> None:
    assert kv_source("continuum", _usage("prefix_kv", 40), 500) == ("resident", 40)
    assert kv_source("continuum", _usage("layer_kv", 40, "disk"), 500) == ("disk", 40)
    assert kv_source("continuum", _usage("layer_kv", 40, "ram"), 500) == ("ram", 40)
    assert kv_source("continuum", _usage("cold", 540), 500) == ("re-prefill", 540)
    stateless = {"usage": {"continuum": {"hit_tier": "prefix_kv", "prompt_tokens_evaluated": 12}}}
    assert kv_source("continuum-stateless", stateless, 500) == ("resident", 12)
    reused = {"timings": {"prompt_n": 40, "cache_n": 500}}
    assert kv_source("llama-server", reused, 500) == ("reused", 40)
    cut = {"timings": {"prompt_n": 400, "cache_n": 140}}
    assert kv_source("llama-server", cut, 500) == ("re-prefill", 400)


def _call(step: int, sent: float, done: float, new: int, evaluated: int, src: str) -> dict:
    return {
        "step": step,
        "sent_s": sent,
        "done_s": done,
        "ttft_ms": 100.0 * (step + 1),
        "new": new,
        "evaluated": evaluated,
        "source": src,
    }


def test_job_times_survival_and_tokens_prefilled_again() -> None:
    a = [_call(0, 1.0, 2.0, 300, 300, "first"), _call(1, 5.0, 9.0, 200, 200 + SLACK, "ram")]
    b = [_call(0, 0.0, 1.0, 300, 300, "first"), _call(1, 3.0, 4.0, 100, 700, "re-prefill")]
    s = summarise("x", [a, b])
    assert s["jct_s_p50"] == pytest.approx(6.0)  # the median of 8.0 and 4.0
    assert s["returns"] == 2 and s["survived"] == 1  # SLACK tokens over the new: survived
    assert s["reprefilled_tokens"] == 600
    assert s["ttft_by_source"]["ram"]["calls"] == 1 and "first" not in s["ttft_by_source"]
    assert s["evaluated_tokens"] == 300 + 200 + SLACK + 300 + 700


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (PausedPlan(modes=("vibes",)), "vibes"),
        (PausedPlan(modes=("llama-server",)), "--llama-server"),
        (PausedPlan(agents=(0,)), "agent counts"),
    ],
)
def test_a_bad_plan_is_a_typed_error(plan: PausedPlan, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        plan.chosen()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--steps", "0,3"], "steps"),
        (["--steps", "a,b"], "LOW,HIGH"),
        (["--result-tokens", "9,2"], "result_tokens"),
        (["--pause-median", "30"], "90th"),
        (["--agents", "0"], ">= 1"),
        (["--modes", "vibes"], "vibes"),
        (["--modes", "llama-server"], "--llama-server"),
    ],
)
def test_bad_command_lines_say_what_to_fix(args: list[str], says: str) -> None:
    from click.testing import CliRunner

    from continuum.cli.main import main

    r = CliRunner().invoke(main, ["bench", "agents-paused", *args])
    assert r.exit_code == 2 and says in r.output, r.output


@pytest.mark.slow
def test_more_agents_than_lanes_keep_their_kv_through_the_pauses(tmp_path: Path) -> None:
    """Six agents on four lanes, on Gemma 3 270M: agents are parked while they pause and come
    back from their snapshots; with and without a session key, no returning call prefills its
    history again (the snapshots fit the RAM budget)."""
    shape = TraceShape(
        steps=(3, 3), result_tokens=(40, 80), pause_median_s=0.3, pause_p90_s=1.0, stagger_s=0.5
    )
    modes = ("continuum", "continuum-stateless")
    plan = PausedPlan("gemma3-270m", (6,), 1, 2, 8, shape, modes=modes)
    r = run_agents_paused(plan)
    rows = {row["mode"]: row for row in r["rows"]}
    for mode in ("continuum", "continuum-stateless"):
        (run,) = r["runs"]["6"][mode]
        assert [len(calls) for calls in run["agents"]] == [3] * 6
        assert run["returns"] == 12 and run["survived"] == 12, run["ttft_by_source"]
        assert rows[mode]["reprefilled_tokens"] == 0
        assert rows[mode]["jct_s_p95"] >= rows[mode]["jct_s_p50"] > 0
    sources = set(rows["continuum"]["ttft_by_source"])
    assert sources <= {"resident", "ram", "disk"} and "ram" in sources  # parked, then back
    assert "| 6 | continuum |" in format_table(r)
    lines: list[str] = []
    misses: list[str] = []
    report_section(lines, misses, r)
    assert "## Agents that pause for tools" in lines
    assert not [m for m in misses if "prefilled again" in m]  # no peer: nothing else to miss
    assert plot_agents_paused(r, tmp_path).read_bytes()[:4] == b"\x89PNG"
