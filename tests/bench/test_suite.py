"""The benchmarks run end to end on tiny sizes, so they cannot rot; and the chat CLI works."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from continuum.bench.eva import MODES, EvaConfig, format_table, run_eva
from continuum.bench.residency import format_table as residency_table
from continuum.bench.residency import run_residency

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)
# the benches' wiring is what these test: on the fastest model that runs every experiment
FAST = "gemma3-270m"

ROW_FIELDS = {
    "mode",
    "evaluated_prompt_tokens",
    "wire_chars",
    "mean_ttft_ms_turns_2_16",
    "ttft_spread_ms",
    "mean_prefill_ms_turns_2_16",
    "retention_checks",
    "replies_identical_to_stateful",
    "runs_agree",
}


def continuum_cli() -> str:
    return shutil.which("continuum") or str(Path(sys.executable).parent / "continuum")


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``continuum bench all --tiny`` run: every experiment's JSON and table, the plots and
    the report. The tests below read what it wrote (each experiment at its tiny sizes) instead
    of running the experiments again in process."""
    out = tmp_path_factory.mktemp("bench-all")
    done = subprocess.run(
        # the fastest model that runs every experiment: the suite's wiring is what is tested
        [continuum_cli(), "bench", "all", "--tiny", "--model", FAST, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _result(suite: Path, experiment: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((suite / f"{experiment}.json").read_text())
    return result


def test_eva_runs_every_mode_and_reports_every_field(suite: Path) -> None:
    result = _result(suite, "eva")  # turns=3, max_tokens=4, every mode
    assert [r["mode"] for r in result["rows"]] == ["stateful", "prefix", "cold", "raw"]
    for row in result["rows"]:
        assert set(row) == ROW_FIELDS
        assert row["evaluated_prompt_tokens"] > 0
        assert row["mean_ttft_ms_turns_2_16"] > 0
    by = {r["mode"]: r for r in result["rows"]}
    # the stateful run decodes far less than a cold recompute and sends far fewer characters
    assert by["stateful"]["evaluated_prompt_tokens"] < by["cold"]["evaluated_prompt_tokens"]
    assert by["stateful"]["wire_chars"] < by["prefix"]["wire_chars"]
    # raw replays exactly the stateful deltas
    assert by["raw"]["evaluated_prompt_tokens"] == by["stateful"]["evaluated_prompt_tokens"]
    assert by["stateful"]["replies_identical_to_stateful"] == [3, 3]
    assert set(result["machine"]) >= {"cpu", "n_threads", "model_digest", "llama_cpp_python"}
    assert len(result["runs"]["stateful"][0]["ttft_ms"]) == 3
    table = format_table(result)
    assert "| stateful |" in table and "raw llama_decode floor" in table
    assert (suite / "eva.txt").read_text() == table + "\n"


def test_eva_with_a_long_system_prompt_raises_n_ctx_to_fit() -> None:
    result = run_eva(
        EvaConfig(model=FAST, reps=1, turns=2, max_tokens=2, system_tokens=600, modes=("stateful",))
    )
    assert result["system_prompt_tokens"] > 500
    assert result["config"]["n_ctx"] >= 600 + 2 * 50
    assert MODES[0] == "stateful"


def test_residency_measures_park_restore_and_reprefill() -> None:
    result = run_residency(model=FAST, sizes=(64, 128), reps=1)
    assert [r["tokens"] for r in result["rows"]] == [64, 128]
    for r in result["rows"]:
        assert r["snapshot_bytes"] > 0 and r["restore_ms"] > 0 and r["reprefill_ms"] > 0
    assert result["rows"][1]["snapshot_bytes"] > result["rows"][0]["snapshot_bytes"]
    assert "| 128 |" in residency_table(result)


def test_bench_eva_cli_writes_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            continuum_cli(),
            "bench",
            "eva",
            "--reps",
            "1",
            "--turns",
            "2",
            "--max-tokens",
            "2",
            "--modes",
            "stateful,raw",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "| stateful |" in done.stdout and "| raw |" in done.stdout
    # progress went to stderr as lines (not a terminal here), not to stdout
    assert re.search(r"\d+% \(\d+ of \d+, \d+ s\)", done.stderr), done.stderr
    data = json.loads((tmp_path / "eva.json").read_text())
    assert data["experiment"] == "eva"


def test_chat_cli_streams_resumes_and_reports_metrics(tmp_path: Path) -> None:
    env = {**os.environ, "CONTINUUM_HOME": str(tmp_path)}
    first = subprocess.run(
        [
            continuum_cli(),
            "chat",
            "--max-tokens",
            "8",
            "--n-ctx",
            "1024",
            "--metrics",
            "--system",
            "You are terse.",
        ],
        input="My name is Ada.\n\nWhat is my name?\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    session_id = first.stderr.split()[1]
    metrics = [json.loads(ln) for ln in first.stderr.splitlines() if ln.startswith("{")]
    assert [m["turn"] for m in metrics] == [1, 2]
    # `continuum chat` decodes the next turn's template while the person reads (eager glue)
    reused = metrics[0]["context_used"] + metrics[1]["eager_tokens_used"]
    assert metrics[1]["tokens_reused"] == reused
    assert len(first.stdout.strip().splitlines()) >= 2
    second = subprocess.run(
        [
            continuum_cli(),
            "chat",
            "--session",
            session_id,
            "--max-tokens",
            "8",
            "--n-ctx",
            "1024",
            "--metrics",
        ],
        input="And again?\n/exit\nignored\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    (m,) = [json.loads(ln) for ln in second.stderr.splitlines() if ln.startswith("{")]
    assert m["turn"] == 3
    assert [r["reason"] for r in m["resets"]] == ["evicted"]


def test_tiers_bench_runs_end_to_end_on_tiny_sizes(suite: Path) -> None:
    from continuum.bench.tiers import format_table as tiers_table

    r = _result(suite, "tiers")  # sizes (64,), a 600-character shared prefix
    sp, wf = r["shared_prefix"], r["workflow"]
    assert sp["prefix_chars"] == 600
    assert sp["tokens_sent_per_later_call_with"] < sp["tokens_sent_per_later_call_without"]
    # a reuse that is not exact (EngineConfig.exact off) may part from cold at a near-tie:
    # the bench counts and lists every answer that did, and only reuse can cause one
    for part, calls in ((sp, sp["calls"]), (wf, 20)):
        assert part["answers_compared"] == calls
        assert part["answers_identical"] == calls - len(part["mismatches"])
        assert all(m["tier"] not in ("cold", "") for m in part["mismatches"])
    assert r["memo"]["hits"] == 5 and r["memo"]["backend_calls"] == 0
    assert wf["steps"] == 20 and wf["calls_eliminated"] > 0
    assert wf["tool_runs_with"] < wf["tool_runs_without"]
    (row,) = r["restore"]
    assert row["ram_ttft_ms"] > 0 and row["disk_ttft_ms"] > 0
    assert len(r["overhead"]["prefix_lookup"]) == 4
    assert "20-step workflow" in tiers_table(r)
    assert "~600-char prefix" in (suite / "tiers.txt").read_text()


def test_plots_render_from_bench_json(tmp_path: Path) -> None:
    from continuum.bench.plots import plot_all

    results = tmp_path / "results"
    results.mkdir()
    (results / "residency.json").write_text(
        json.dumps(run_residency(model=FAST, sizes=(32, 64), reps=1))
    )
    eva = run_eva(
        EvaConfig(model=FAST, reps=1, turns=2, max_tokens=2, modes=("stateful", "prefix", "raw"))
    )
    (results / "eva.json").write_text(json.dumps(eva))
    made = plot_all(results, tmp_path / "docs")
    assert sorted(p.name for p in made) == ["eva.png", "residency.png"]
    for p in made:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_http_bench_runs_against_real_servers_on_tiny_sizes() -> None:
    ours = ("delta", "resend")
    from continuum.bench.http import HttpConfig, run_http
    from continuum.bench.http import format_table as http_table

    r = run_http(HttpConfig(model=FAST, reps=1, turns=2, max_tokens=2))
    by = {row["mode"]: row for row in r["rows"]}
    assert set(by) == {"delta", "resend", "llama-cpp-python"}
    assert by["delta"]["wire_bytes"] < by["resend"]["wire_bytes"]
    assert by["delta"]["wire_bytes"] < by["llama-cpp-python"]["wire_bytes"]
    # the session-delta and the verified re-send decode the same tokens; with no idle gap the
    # eager glue may or may not win the race to the next request, so some may come early
    work = [by[m]["evaluated_prompt_tokens"] + by[m]["decoded_early_tokens"] for m in ours]
    assert work[0] == work[1]
    assert by["llama-cpp-python"]["evaluated_prompt_tokens"] is None  # it reports none
    assert all(len(row["ttft_ms_per_turn"]) == 2 for row in r["rows"])
    assert "delta vs llama-cpp-python" in http_table(r)


def test_report_renders_every_experiment_and_lists_missed_goals(tmp_path: Path) -> None:
    from continuum.bench.report import render_report

    results = tmp_path / "results"
    results.mkdir()
    eva = run_eva(
        EvaConfig(model=FAST, reps=1, turns=2, max_tokens=2, modes=("stateful", "prefix", "raw"))
    )
    (results / "eva.json").write_text(json.dumps(eva))
    (results / "residency.json").write_text(
        json.dumps(run_residency(model=FAST, sizes=(32,), reps=1))
    )
    page = render_report(results)
    assert "## Stateful sessions (seed 000)" in page and "131.8 ms" in page
    assert "continuum bench eva --reps 1" in page
    assert "## Switching sessions" in page
    assert "## Where we lose" in page
    for row in eva["rows"]:
        assert f"{row['mean_ttft_ms_turns_2_16']:.1f} ms" in page  # the measured figures


def test_report_and_plot_refuse_a_missing_results_folder(tmp_path: Path) -> None:
    from continuum import InvalidRequest
    from continuum.bench.plots import plot_all
    from continuum.bench.report import render_report

    missing = tmp_path / "nope"
    for fn in (render_report, lambda p: plot_all(p, tmp_path)):
        try:
            fn(missing)
        except InvalidRequest as e:
            assert "nope" in str(e) and "not a folder" in str(e)
        else:  # pragma: no cover - the assertion below reports it
            raise AssertionError("a missing results folder was accepted")
    for cmd in ("report", "plot"):
        done = subprocess.run(
            [continuum_cli(), "bench", cmd, "--results", str(missing)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2 and "error:" in done.stderr
        assert "Traceback" not in done.stderr


def test_semantic_bench_sweeps_every_set_and_renders(suite: Path) -> None:
    from continuum.bench.semantic import SETS, format_table, load_pairs

    assert len(load_pairs("dev")) >= 300 and len(load_pairs("holdout")) >= 250
    assert len(load_pairs("independent")) >= 400
    r = _result(suite, "semantic")  # sizes (50,), 10 queries
    assert set(r["sets"]) == set(SETS)
    for s in r["sets"].values():
        rows = s["sweep"]
        assert [row["threshold"] for row in rows] == sorted(row["threshold"] for row in rows)
        for row in rows:  # the guard only ever removes hits
            assert row["paraphrase_hit_guard"] <= row["paraphrase_hit_raw"]
            assert row["false_hit_guard"] <= row["false_hit_raw"]
        # hit rates fall as the threshold rises
        hits = [row["paraphrase_hit_raw"] for row in rows]
        assert hits == sorted(hits, reverse=True)
        d = s["default"]
        lo, hi = d["false_hit_ci95_guard"]
        assert lo <= d["false_hit_guard"] <= hi and hi > 0  # an interval, even at 0 hits
    for name in ("dev", "holdout"):
        assert set(r["sets"][name]["default"]["false_by_kind_guard"]) >= {"number", "entity"}
    independent = r["sets"]["independent"]
    assert not independent["designed_on"] and r["sets"]["dev"]["designed_on"]
    assert len(independent["pairs"]) >= 12
    assert {"antonym", "code_symbols", "paraphrase_multilingual"} <= set(independent["pairs"])
    assert [row["entries"] for row in r["lookup"]] == [50]
    assert all(row["search_us_p50"] > 0 for row in r["lookup"])
    assert r["embed_ms_median"] > 0
    table = format_table(r)
    assert "holdout set" in table and "independent set, never tuned on" in table
    assert "95% CI" in table
    assert (suite / "semantic.png").read_bytes()[:4] == b"\x89PNG"
    page = (suite / "benchmarks.md").read_text()
    assert "## Semantic tier (seed 003)" in page and "continuum bench semantic" in page
    for name in ("holdout", "independent"):
        default = r["sets"][name]["default"]
        assert f"{default['paraphrase_hit_guard']:.1%}" in page
    assert "Independent set at" in page


def test_prefill_bench_runs_every_mode_on_tiny_sizes(suite: Path) -> None:
    from continuum.bench.prefill import MODES, format_table

    r = _result(suite, "prefill")  # sizes (12, 40), a 20 ms idle gap, 3-token replies
    assert [(row["message_tokens"] > 0, row["mode"]) for row in r["rows"]] == [
        (True, m) for _ in (12, 40) for m in MODES
    ]
    by = {(row["message_tokens"], row["mode"]): row for row in r["rows"]}
    big = max(row["message_tokens"] for row in r["rows"])
    assert by[(big, "arrival")]["fed_tokens"] > 0  # decoded before the end of input
    assert (
        by[(big, "arrival")]["evaluated_after_input"] < by[(big, "append")]["evaluated_after_input"]
    )
    assert by[(big, "eager")]["eager_used"] > 0 and by[(big, "append")]["eager_used"] == 0
    assert all(row["floor_ms"] > 0 and row["ttft_ms"] > 0 for row in r["rows"])
    assert "TTFT after input" in format_table(r)
    assert (suite / "prefill.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Prefill on arrival and eager glue" in (suite / "benchmarks.md").read_text()


def test_http_bench_input_stream_mode_with_an_idle_gap(suite: Path) -> None:
    from continuum.bench.http import HttpConfig, run_http
    from continuum.bench.http import format_table as http_table

    r = _result(suite, "http")  # delta, input and llama-cpp-python, a 20 ms idle gap
    by = {row["mode"]: row for row in r["rows"]}
    assert set(by) == {"delta", "input", "llama-cpp-python"} and r["idle_ms"] == 20
    assert by["input"]["wire_bytes"] < by["delta"]["wire_bytes"]  # bare text, no JSON
    assert all(t == t for t in by["input"]["ttft_ms_per_turn"])  # measured (not NaN)
    assert "input" in http_table(r)
    with pytest.raises(ValueError, match="modes"):
        run_http(HttpConfig(model=FAST, reps=1, turns=2, modes=("llama-server",)))


def test_restore_and_overhead_benches_on_tiny_sizes(suite: Path) -> None:
    from continuum.bench.overhead import format_table as overhead_table
    from continuum.bench.tiers import restore_table

    r = _result(suite, "restore")  # sizes (64,)
    (row,) = r["restore"]
    assert row["prompt_tokens"] > 64 and row["ram_ttft_ms"] > 0 and row["disk_ttft_ms"] > 0
    assert "re-prefill TTFT" in restore_table(r)
    o = _result(suite, "overhead")  # semantic sizes (50,), a 64-token system prompt
    assert len(o["tiers"]["prefix_lookup"]) == 4
    assert [x["entries"] for x in o["semantic"]["lookup"]] == [50]
    mem = o["session_memory"]
    assert mem["sessions"] == 4 and mem["kv_bytes_per_session"] > 0
    assert mem["bookkeeping_bytes_per_session"] < mem["kv_bytes_per_session"]
    assert "memory per resident session" in overhead_table(o)


def test_bench_all_tiny_writes_every_result_plot_and_the_report(suite: Path) -> None:
    out = suite
    names = {p.name for p in out.iterdir()}
    for experiment in (
        "eva",
        "sweep",
        "tiers",
        "restore",
        "residency",
        "overhead",
        "semantic",
        "prefill",
        "http",
    ):
        assert {f"{experiment}.json", f"{experiment}.txt"} <= names, experiment
        assert json.loads((out / f"{experiment}.json").read_text())
    assert {
        "eva.png",
        "sweep.png",
        "residency.png",
        "restore.png",
        "semantic.png",
        "prefill.png",
    } <= names
    page = (out / "benchmarks.md").read_text()
    assert "## Semantic tier" in page and "## Prefill on arrival" in page
    assert "## Context sweep" in page
