"""``bench speculative`` runs end to end on tiny sizes (Gemma 3 270M), compares with
llama-server's best n-gram mode when given one (its table and losses, from a result), and its
command refuses bad values naming the option (tests/cli/test_bench_options.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from continuum.bench.plots import plot_speculative_batched
from continuum.bench.speculative import (
    SpeculativeConfig,
    format_table,
    report_section,
    result_name,
    run_speculative,
)
from continuum.bench.speculative_batched import format_table as batched_table
from continuum.bench.speculative_batched import report_section as batched_section
from continuum.bench.speculative_peer import PLAIN, SPEC_TYPES
from continuum.bench.speculative_peer import _row as peer_row


@pytest.mark.slow  # 9 s alone: the full run's (pyproject's markers)
def test_each_task_is_timed_with_and_without_drafts() -> None:
    cfg = SpeculativeConfig(
        model="gemma3-270m", threads=2, reps=2, tasks=("json", "prose"), max_tokens=24
    )
    r = run_speculative(cfg)
    assert [row["task"] for row in r["rows"]] == ["json", "prose"]
    for row in r["rows"]:
        assert row["plain_tok_s"] > 0 and row["draft_tok_s"] > 0
        assert row["speedup"] == pytest.approx(row["draft_tok_s"] / row["plain_tok_s"])
        assert row["same_tokens"] == row["runs"] == 2  # greedy: drafting changes no token
        assert 0 <= row["accepted_share"] <= 1
    table = format_table(r)
    assert "gemma-3-270m" in table and "| json |" in table and "drafting tok/s" in table
    json.dumps(r)


@pytest.mark.slow  # 4 s alone
def test_sampled_replies_are_timed_with_and_without_drafts_and_reported_as_sampled() -> None:
    cfg = SpeculativeConfig(
        model="gemma3-270m", threads=2, reps=2, tasks=("json",), max_tokens=24, temperature=0.7
    )
    r = run_speculative(cfg)
    assert r["temperature"] == 0.7 and result_name(0.7) == "speculative-sampled.json"
    (row,) = r["rows"]
    assert row["plain_tok_s"] > 0 and row["draft_tok_s"] > 0 and row["runs"] == 2
    assert "sampled at temperature 0.7, seeded by repetition" in format_table(r)
    row["same_tokens"] = 0  # sampled: not a miss (greedy: pinned below)
    lines: list[str] = []
    misses: list[str] = []
    report_section(lines, misses, r)
    assert lines[0] == "## Drafting from the context (sampled replies)"
    assert any("--temperature 0.7" in line for line in lines)
    assert not any("differ from plain decoding" in m for m in misses)
    r["temperature"] = 0.0
    report_section([], misses, r)
    assert any("replies differ from plain decoding" in m for m in misses)


@pytest.mark.slow  # 16 s in the full run
def test_agents_at_once_are_timed_in_batch_steps_with_and_without_drafts(tmp_path: Path) -> None:
    """A sweep of one and three agents on two tasks (the third agent repeats the first task):
    each task's agents are timed in both modes, greedy replies are the same tokens with
    drafting on and off, and the section lists a loss as a miss."""
    cfg = SpeculativeConfig(
        model="gemma3-270m",
        threads=2,
        reps=2,
        tasks=("json", "prose"),
        max_tokens=40,
        agents=(1, 3),
    )
    assert cfg.batched and not SpeculativeConfig().batched
    r = run_speculative(cfg)
    assert (
        r["experiment"] == "speculative-batched"
        and result_name(0.0, True) == "speculative-batched.json"
    )
    one, three = r["sweep"]
    assert [(row["task"], row["agents"]) for row in one["rows"]] == [("json", 1)]
    assert [(row["task"], row["agents"]) for row in three["rows"]] == [("json", 2), ("prose", 1)]
    for row in one["rows"] + three["rows"]:
        assert row["plain_tok_s"] > 0 and row["draft_tok_s"] > 0
        assert row["same_tokens"] == row["runs"] == 2 * row["agents"]
    assert three["all"]["plain_tok_s"] > 0 and three["all"]["draft_tok_s"] > 0
    assert [len(run["agents_tok_s"]) for run in three["per_run"]["draft"]] == [3, 3]
    assert "agents at once in batch steps" in batched_table(r)
    assert plot_speculative_batched(r, tmp_path).read_bytes()[:4] == b"\x89PNG"
    lines: list[str] = []
    misses: list[str] = []
    three["rows"][1]["speedup"], three["all"]["speedup"] = 0.9, 0.95
    batched_section(lines, misses, r)
    assert lines[0].startswith("## Drafting from the context in batch steps")
    assert any("--agents 1,3" in line for line in lines)
    assert any("3 agents, prose: 0.90x" in m for m in misses)
    assert any("3 agents: throughput 0.95x" in m for m in misses)
    json.dumps(r)


def test_an_unknown_task_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match="tasks must be among edit-file"):
        SpeculativeConfig(tasks=("poetry",))


def _peer_runs(rates: dict[str, list[float]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The peer's runs of one task, ``json``: each mode's decode rates, the same 3 tokens
    except ngram-mod's second run."""
    return {
        mode: {
            "json": [
                {
                    "tokens": [1, 2, 4] if mode == "ngram-mod" and i == 1 else [1, 2, 3],
                    "decode_tok_s": rate,
                    "drafted": 0 if mode == PLAIN else 10,
                    "accepted": 0 if mode == PLAIN else 6,
                }
                for i, rate in enumerate(rs)
            ]
        }
        for mode, rs in rates.items()
    }


def test_the_peers_best_ngram_mode_is_compared_and_a_loss_to_it_is_listed() -> None:
    rates = {PLAIN: [20.0, 22.0, 21.0]} | {m: [18.0, 19.0, 18.5] for m in SPEC_TYPES}
    rates["ngram-mod"] = [30.0, 33.0, 31.0]
    runs = _peer_runs(rates)
    row = peer_row("json", runs)
    assert row["best"] == "ngram-mod" and row["best_tok_s"] == 31.0
    assert row["plain_tok_s"] == 21.0 and row["speedup"] == pytest.approx(31 / 21)
    assert row["accepted_share"] == 0.6 and row["same_tokens"] == 2 and row["runs"] == 3
    ours = {
        "task": "json",
        "tokens": 3,
        "plain_tok_s": 25.0,
        "draft_tok_s": 30.0,
        "speedup": 1.2,
        "accepted_share": 0.5,
        "draft_calls": 4,
        "redone": 0,
        "same_tokens": 3,
        "runs": 3,
    }
    result = {
        "model": "m.gguf",
        "n_threads": 2,
        "reps": 3,
        "max_draft": 16,
        "max_tokens": 400,
        "rows": [ours],
        "llama_server": {"modes": [PLAIN, *SPEC_TYPES], "rows": [row]},
    }
    table = format_table(result)
    assert "| json | 3 | 21.0 | 18.5 | 18.5 | 18.5 | 31.0 | 18.5 | ngram-mod | 1.48x |" in table
    lines: list[str] = []
    misses: list[str] = []
    report_section(lines, misses, result)
    assert any("--llama-server PATH" in line for line in lines)
    assert any("llama-server's best n-gram mode (ngram-mod) 31.0" in m for m in misses)
    assert any("1.20x the plain decode rate (goal 1.5x)" in m for m in misses)
