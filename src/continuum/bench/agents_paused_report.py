"""``bench agents-paused`` in ``bench report``: the table and the goals it missed (its plot is
:func:`continuum.bench.plots.plot_agents_paused`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from continuum.bench.agents_paused import format_table

RESULT = "agents-paused.json"
GOAL_JCT = 0.5  # job completion time p50 at most this times llama-server's (p95 no worse)
GOAL_RAM_TTFT = 2.0  # a return from a RAM snapshot at most this times a resident one


def _command(data: dict[str, Any]) -> str:
    sh = data["shape"]
    agents = ",".join(sorted({str(r["agents"]) for r in data["rows"]}, key=int))
    cmd = (
        f"continuum bench agents-paused -m {Path(data['machine']['model_path']).name} "
        f"-t {data['machine']['n_threads']} --reps {data['reps']} --agents {agents} "
        f"--steps {sh['steps'][0]},{sh['steps'][1]} "
        f"--result-tokens {sh['result_tokens'][0]},{sh['result_tokens'][1]} "
        f"--pause-median {sh['pause_median_s']:g} --pause-p90 {sh['pause_p90_s']:g} "
        f"--stagger {sh['stagger_s']:g} --seed {sh['seed']}"
    )
    if any(r["mode"] == "llama-server" for r in data["rows"]):
        cmd += f" --cache-ram {data['cache_ram_mb']} --llama-server PATH"
    return cmd


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    lines += ["## Agents that pause for tools", "", f"Command: `{_command(data)}`", ""]
    lines += [*format_table(data).splitlines(), "", "![agents-paused](agents-paused.png)", ""]
    by = {(r["agents"], r["mode"]): r for r in data["rows"]}
    for (agents, mode), row in by.items():
        peer = by.get((agents, "llama-server"))
        if mode.startswith("continuum") and peer is not None:
            ratio = row["jct_s_p50"] / peer["jct_s_p50"]
            worse95 = row["jct_s_p95"] > peer["jct_s_p95"]
            if ratio > GOAL_JCT or worse95:
                misses.append(
                    f"Agents pausing for tools ({agents} agents, {mode}): job time p50 "
                    f"{row['jct_s_p50']:.1f} s, {ratio:.2f}x llama-server's "
                    f"{peer['jct_s_p50']:.1f} s (goal <= {GOAL_JCT}x); p95 "
                    f"{row['jct_s_p95']:.1f} s vs {peer['jct_s_p95']:.1f} s (goal: no worse)."
                )
        src = row["ttft_by_source"]
        if mode == "continuum" and "ram" in src and "resident" in src:
            ram, resident = src["ram"]["p50"], src["resident"]["p50"]
            if ram > GOAL_RAM_TTFT * resident:
                misses.append(
                    f"Agents pausing for tools ({agents} agents): a return from a RAM snapshot "
                    f"has TTFT p50 {ram:,.0f} ms, {ram / resident:.2f}x a resident return's "
                    f"{resident:,.0f} ms (goal <= {GOAL_RAM_TTFT}x)."
                )
        if mode == "continuum" and row["reprefilled_tokens"] > 0:
            misses.append(
                f"Agents pausing for tools ({agents} agents): {row['reprefilled_tokens']:,.0f} "
                "tokens of paused sessions' history were prefilled again (goal: 0 while the "
                "snapshot RAM budget holds them)."
            )
