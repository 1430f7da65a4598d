"""``bench park-return``: each way really keeps the returning agent's KV where it says (the
server's own report), on a real server and model; bad plans are refused before anything runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from continuum.bench.park_return import ReturnPlan, format_table, run_park_return
from continuum.cli.main import main
from continuum.errors import InvalidRequest


@pytest.mark.parametrize(
    ("plan", "says"),
    [
        (ReturnPlan(sizes=()), "sizes"),
        (ReturnPlan(sizes=(0, 10)), "sizes"),
        (ReturnPlan(history=-1), "history"),
        (ReturnPlan(reps=0), "reps"),
        (ReturnPlan(pause_s=-1), "pause"),
        (ReturnPlan(pause_s=float("nan")), "pause"),
    ],
)
def test_a_bad_plan_is_refused_naming_what_to_fix(plan: ReturnPlan, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        plan.check()


@pytest.mark.parametrize(
    "args",
    [
        ["--sizes", "0"],
        ["--sizes", "ten"],
        ["--history", "-5"],
        ["--pause", "-1"],
        ["--pause", "x"],
        ["--pause", "nan"],  # past click's range check: the plan's own check refuses it
    ],
)
def test_bad_options_are_usage_errors(args: list[str]) -> None:
    r = CliRunner().invoke(main, ["bench", "park-return", *args])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output


@pytest.mark.slow
def test_each_way_keeps_the_kv_where_it_says() -> None:
    size = 60
    plan = ReturnPlan(model="gemma3-270m", sizes=(size,), history=120, pause_s=0.5, reps=1)
    result = run_park_return(plan)
    (row,) = result["rows"]
    assert row["resident_sources"] == ["resident"]
    assert row["ram_sources"] == ["ram"]  # parked to a RAM snapshot, restored from it
    # a return evaluates its new message (and the template around it), not the transcript
    assert row["resident_evaluated"] < size + 40 and row["ram_evaluated"] < size + 40
    assert row["re-prefill_evaluated"] > 120 + size
    table = format_table(result)
    assert "gemma-3-270m" in table and "RAM / resident" in table
