"""eva's context sweep runs end to end on tiny sizes against the real model and real servers;
its sampling of cold recompute, its JSON, table, plot and report section are pinned."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from continuum.backends.models import resolve_model
from continuum.bench import eva
from continuum.bench.plots import plot_all, plot_sweep
from continuum.bench.report import render_report
from continuum.bench.sweep import SweepConfig, _order, format_table, run_sweep
from tests.bench.test_suite import continuum_cli

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

ROW_FIELDS = {
    "mode",
    "mean_ttft_ms_turns_2_16",
    "ttft_spread_ms",
    "runs",
    "timed_turns",
    "evaluated_prompt_tokens",
    "wire_bytes",
    "replies_identical_to_stateful",
}


@pytest.fixture(scope="module")
def swept() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    partial: list[dict[str, Any]] = []
    cfg = SweepConfig(
        sizes=(64, 200),
        reps=2,
        max_tokens=2,
        turns=4,
        modes=("stateful", "prefix", "cold", "delta", "llama-cpp-python"),
        idle_ms=0,
        cold_full_upto=100,  # every turn at 64 requested tokens; turns 2 and 4 at 200
        cold_all_reps_upto=100,  # cold in both runs at 64, in the first only at 200
    )
    result = run_sweep(cfg, on_point=lambda r: partial.append(json.loads(json.dumps(r))))
    return result, partial


def test_sweep_measures_every_mode_at_every_size(
    swept: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    result, partial = swept
    points = result["points"]
    assert [p["requested_tokens"] for p in points] == [64, 200]
    assert points[0]["system_prompt_tokens"] < points[1]["system_prompt_tokens"]
    assert [len(p["points"]) for p in partial] == [1, 2]  # written out after every size
    for p in points:
        assert p["n_ctx"] >= p["system_prompt_tokens"] + 4 * 50
        rows = {r["mode"]: r for r in p["rows"]}
        assert list(rows) == ["stateful", "prefix", "cold", "delta", "llama-cpp-python"]
        for row in rows.values():
            assert set(row) >= ROW_FIELDS
            assert row["mean_ttft_ms_turns_2_16"] > 0
            lo, hi = row["ttft_spread_ms"]
            assert lo <= row["mean_ttft_ms_turns_2_16"] <= hi
        # a resident session decodes only the new messages; a cold recompute every prompt
        assert rows["stateful"]["evaluated_prompt_tokens"] < rows["cold"]["evaluated_prompt_tokens"]
        assert rows["stateful"]["evaluated_prompt_tokens"] > p["system_prompt_tokens"]
        # over HTTP the session API sends only the new message; replay sends the transcript
        assert rows["delta"]["wire_bytes"] < rows["llama-cpp-python"]["wire_bytes"]
        assert rows["llama-cpp-python"]["evaluated_prompt_tokens"] is None  # it reports none
        assert rows["delta"]["evaluated_prompt_tokens"] >= p["system_prompt_tokens"]
        assert rows["stateful"]["wire_bytes"] is None  # in process
        assert rows["stateful"]["runs"] == rows["delta"]["runs"] == 2


def test_sweep_samples_cold_recompute_as_configured(
    swept: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    small, large = ({r["mode"]: r for r in p["rows"]} for p in swept[0]["points"])
    assert small["cold"]["timed_turns"] == [2, 3, 4] and small["cold"]["runs"] == 2
    assert large["cold"]["timed_turns"] == [2, 4] and large["cold"]["runs"] == 1
    assert swept[0]["points"][1]["cold_turns"] == [2, 4]
    for rows, p in ((small, swept[0]["points"][0]), (large, swept[0]["points"][1])):
        # the timed turns evaluated their whole prompt, so the whole-conversation count is
        # the sum of the stateful run's prompt lengths
        assert rows["cold"]["sampled_turns_evaluated_whole"] is True
        stateful_run = p["runs"]["stateful"][0]
        assert rows["cold"]["evaluated_prompt_tokens"] == sum(stateful_run["prompt_tokens"])
        cold_run = p["runs"]["cold"][0]
        for n, ev in zip(cold_run["turn_numbers"], cold_run["evaluated"], strict=True):
            assert ev == stateful_run["prompt_tokens"][n - 1]
        same, total = rows["cold"]["replies_identical_to_stateful"]
        assert total == len(rows["cold"]["timed_turns"]) and 0 <= same <= total


def test_sweep_table_plot_and_report(
    swept: tuple[dict[str, Any], list[dict[str, Any]]], tmp_path: Path
) -> None:
    result = swept[0]
    table = format_table(result)
    assert "| stateful | prefix | cold | delta | llama-cpp-python |" in table
    assert "(turns 2, 4, 1 run)" in table and "(turns 2–4, 2 runs)" in table
    assert "cold recompute is timed on every turn up to 100" in table
    result = {**result, "config": {**result["config"], "idle_ms": 250}}
    (tmp_path / "sweep.json").write_text(json.dumps(result))
    png = plot_sweep(result, tmp_path / "sweep.png")
    assert png.name == "sweep.png" and png.stat().st_size > 10_000
    # the same sweep with no idle gap (an agent loop) is a second section with its own plot
    modes = ["delta", "llama-cpp-python"]  # run with --modes: the command says so
    no_gap = {**result, "config": {**result["config"], "idle_ms": 0, "modes": modes}}
    (tmp_path / "sweep-idle0.json").write_text(json.dumps(no_gap))
    page = render_report(tmp_path)
    assert "## Context sweep (seed 000's conversation at growing context)\n" in page
    assert "![context sweep](sweep.png)" in page
    assert "## Context sweep (seed 000's conversation at growing context, no idle gap" in page
    assert "![context sweep](sweep-idle0.png)" in page and "--idle-ms 0" in page
    assert "continuum bench sweep --reps 2 --sizes 64,200 --idle-ms 250`" in page
    assert "--idle-ms 0 --modes delta,llama-cpp-python`" in page
    # the sweep with the default idle gap comes first, whatever the file names sort as
    assert page.index("growing context)\n") < page.index("growing context, no idle gap")
    assert "TTFT ratios (peer / ours): " in page and "stateful vs prefix" in page
    made = {p.name for p in plot_all(tmp_path, tmp_path)}
    assert {"sweep.png", "sweep-idle0.png"} <= made


def test_mode_order_rotates_and_keeps_cold_after_stateful() -> None:
    modes = ("stateful", "prefix", "cold", "delta")
    assert _order(modes, 0) == ["stateful", "cold", "prefix", "delta"]
    assert _order(modes, 1) == ["prefix", "delta", "stateful", "cold"]
    assert _order(modes, 2) == ["delta", "stateful", "cold", "prefix"]
    assert _order(("delta", "prefix"), 1) == ["prefix", "delta"]


def test_cold_sample_by_size() -> None:
    cfg = SweepConfig()
    assert cfg.cold_turns(512) == tuple(range(2, 17))
    assert cfg.cold_turns(8192) == (2, 9, 16)
    assert cfg.cold_in_rep(4096, 2) and cfg.cold_in_rep(16384, 0)
    assert not cfg.cold_in_rep(16384, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"modes": ("cold",)}, "include stateful"),
        ({"modes": ("warp",)}, "modes must be among"),
        ({"modes": ()}, "modes must be among"),
        ({"modes": ("delta", "llama-server")}, "--llama-server PATH"),
        ({"reps": 0}, "reps must be >= 1"),
        ({"sizes": ()}, "sizes positive"),
        ({"turns": 1}, "turns must be 2..16"),
    ],
)
def test_sweep_refuses_a_bad_configuration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_sweep(SweepConfig(**kwargs))


def test_sampled_cold_run_needs_the_replies_before_it() -> None:
    model = resolve_model(None)
    cfg = eva.EvaConfig(reps=1, turns=3, max_tokens=2)
    with pytest.raises(ValueError, match="replies before them"):
        eva.run_cold(model, cfg, (2, 3), None)
    with pytest.raises(ValueError, match="replies before them"):
        eva.run_cold(model, cfg, (3,), ["only one reply"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--modes", "cold"], "include stateful"),
        (["--modes", "stateful,warp"], "modes must be among"),
        (["--sizes", "big"], "sizes must be integers"),
        (["--modes", "llama-server"], "--llama-server PATH"),
        (["--llama-server", "/no/such/llama-server"], "does not exist"),
        (["--sizes", "0"], "each >= 2"),
        (["--sizes", "512,40000"], "choose smaller --sizes"),  # over Gemma 3's 32k
        (["--reps", "0"], "--reps"),
    ],
)
def test_bench_sweep_cli_rejects_bad_arguments(args: list[str], message: str) -> None:
    done = subprocess.run(
        [continuum_cli(), "bench", "sweep", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
