"""``bench concurrent`` on the real model: continuum serve in its own process, two agents at
once, each its own conversation; the table and the report section render."""

from __future__ import annotations

from pathlib import Path

from continuum.bench.concurrent import format_table, report_concurrent, run_concurrent
from continuum.bench.plots import plot_concurrent


def test_two_agents_at_once_against_continuum_serve(tmp_path: Path) -> None:
    r = run_concurrent(model="gemma3-270m", clients=(2,), reps=1, threads=2, turns=2,
                       max_tokens=4, system_tokens=64)  # fmt: skip
    (row,) = r["rows"]
    assert row["mode"] == "continuum" and row["clients"] == 2
    (run,) = r["runs"]["continuum/2"]
    assert len(run["replies"]) == 2 and all(len(c) == 2 and all(c) for c in run["replies"])
    assert run["tokens"] > 0 and row["tokens_per_s"] > 0
    assert row["ttft_ms_p95"] >= row["ttft_ms_p50"] > 0
    assert "| 2 | continuum |" in format_table(r)
    lines: list[str] = []
    misses: list[str] = []
    report_concurrent(lines, misses, r)
    assert "## Many agents at once" in lines and not misses  # no peer: nothing to lose to
    assert plot_concurrent(r, tmp_path).read_bytes()[:4] == b"\x89PNG"


def test_bad_command_lines_say_what_to_fix() -> None:
    from click.testing import CliRunner

    from continuum.cli.main import main

    cases = [
        (["bench", "concurrent", "--clients", "0"], "each >= 1"),
        (["bench", "concurrent", "--clients", "two"], "must be integers"),
        (["bench", "concurrent", "--llama-server", "/no/such/llama-server"], "does not exist"),
        (["bench", "concurrent", "--turns", "99"], "--turns"),
        (["bench", "prefill", "--llama-server", "/no/such/llama-server"], "does not exist"),
        (["serve", "--semantic", "--semantic-verifier", "vibes"], "judge"),
        (["serve", "--parallel", "0"], "--parallel"),
        (["serve", "--parallel", "33"], "--parallel"),
        (["serve", "--parallel", "four"], "--parallel"),
    ]
    for args, said in cases:
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and said in r.output, (args, r.output)


def test_continuum_runs_with_serves_default_lanes() -> None:
    """The bench measures serve as a user runs it: its default --parallel, raised to one lane
    per client beyond that."""
    from continuum.bench.concurrent import SERVE_LANES
    from continuum.cli.serve import serve
    from continuum.server.state import ServerConfig

    default = next(p.default for p in serve.params if p.name == "parallel")
    assert SERVE_LANES == default == ServerConfig().parallel
