"""``bench memory``: a real ``continuum serve`` process is measured from /proc after a real
request; bad modes are refused before anything starts; llama-server modes are dropped without a
binary; the table names the model and gives ratios to llama-server only when it ran."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from continuum.backends.models import ModelFile
from continuum.bench.memory import memory_table, run_memory
from continuum.cli.main import main
from continuum.errors import InvalidRequest

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_our_server_is_measured_alone_after_a_request(gemma: ModelFile) -> None:
    result = run_memory("gemma3-270m", 1, 2, 1024, ("continuum", "llama-server"), None)
    [row] = result["rows"]  # no llama-server binary: its modes are left out
    assert row["mode"] == "continuum" and result["model"] == gemma.path.name
    # the weights alone are ~240 MB, all of them touched by the request's decode
    assert row["rss_mb"] > 240 and row["peak_mb"] >= row["rss_mb"]
    table = memory_table(result)
    assert gemma.path.name in table and "| continuum |" in table and "—" in table


def test_unknown_modes_are_refused_before_anything_starts() -> None:
    with pytest.raises(InvalidRequest, match="unknown mode"):
        run_memory("gemma3-270m", 1, 2, 1024, ("continuum", "vllm"), None)


def test_ratios_are_to_llama_server() -> None:
    rows = [
        {"mode": "continuum", "rss_mb": 1100, "peak_mb": 1100, "runs": []},
        {"mode": "llama-server", "rss_mb": 1000, "peak_mb": 1000, "runs": []},
    ]
    result = {
        "model": "m.gguf",
        "slots": 4,
        "n_ctx_per_slot": 8192,
        "threads": 2,
        "reps": 1,
        "rows": rows,
    }
    table = memory_table(result)
    assert "| continuum | 1,100 | 1,100 | 1.10x |" in table
    assert "| llama-server | 1,000 | 1,000 | 1.00x |" in table


def test_the_command_refuses_a_bad_mode_with_one_line() -> None:
    r = CliRunner().invoke(main, ["bench", "memory", "--modes", "nope", "--reps", "1"])
    assert r.exit_code != 0 and "unknown mode" in r.output
    assert "Traceback" not in r.output
