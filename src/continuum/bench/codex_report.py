"""The tables, losses and report section of ``continuum bench codex``
(:mod:`continuum.bench.codex`), rendered from its results.

Every figure where continuum is slower than llama-server (or evaluates more prompt tokens) is a
loss, listed; a new session's first TTFT has a goal of its own: at most ``NEW_SESSION_GOAL``
times llama-server's once another session holds the instructions.
"""

from __future__ import annotations

from typing import Any

MODES = ("continuum", "llama-server")
NEW_SESSION_GOAL = 0.2  # a new session's first TTFT, as a share of llama-server's


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"


def _tokens(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.0f}"


def _cell(part: dict[str, list[Any]], i: int, reps: int) -> str:
    """Evaluated, then TTFT (with the runs' range when there were several)."""
    lo, hi = part["ttft_range"][i]
    spread = f" ({lo:,.0f}–{hi:,.0f})" if reps > 1 else ""
    return f"{_tokens(part['evaluated'][i])} | {_ms(part['ttft_ms'][i])}{spread}"


def _ratio(rows: dict[str, dict[str, Any]], part: str, i: int) -> str | None:
    if "continuum" not in rows or "llama-server" not in rows:
        return None
    ours, peer = (rows[m][part]["ttft_ms"][i] for m in MODES)
    return f"{ours / peer:.2f}"


def _head(r: dict[str, Any], what: str) -> str:
    peer = next((row for row in r["rows"] if row["mode"] == "llama-server"), None)
    extra = " ".join(r.get("llama_server_args") or ())
    via = f" · llama-server via {peer['endpoint']}{f' ({extra})' if extra else ''}" if peer else ""
    return (
        f"codex {what} · {r['model']} · {r['n_threads']} threads · n_ctx {r['n_ctx']} per "
        f"session · replies of at most {r['max_output_tokens']} tokens, greedy · median of "
        f"{r['reps']}{' (lowest–highest run in brackets)' if r['reps'] > 1 else ''}{via}"
    )


def loop_table(r: dict[str, Any]) -> list[str]:
    rows = {row["mode"]: row for row in r["rows"]}
    both = len(rows) == len(MODES)
    lines = [
        _head(r, f"tool loop ({r['steps']} steps, one session)"),
        "",
        "| step | "
        + " | ".join(f"{m} prompt | {m} evaluated | {m} TTFT" for m in rows)
        + (" | TTFT continuum / llama-server |" if both else " |"),
        "|---|" + "---|---|---|" * len(rows) + ("---|" if both else ""),
    ]
    for i in range(r["steps"]):
        cells = [
            f"{_tokens(row['loop']['prompt'][i])} | {_cell(row['loop'], i, r['reps'])}"
            for row in rows.values()
        ]
        ratio = _ratio(rows, "loop", i)
        lines.append(f"| {i + 1} | " + " | ".join(cells) + (f" | {ratio} |" if ratio else " |"))
    lines.append("")  # the notes below are not rows of the table
    for mode, row in rows.items():
        server = ", ".join(_ms(x) for x in row["loop"]["server_ttft_ms"])
        lines += [
            f"{mode}, first output event per step: {', '.join(row['loop']['first_event'])}",
            f"{mode}, the server's own time to first token per step: {server}",
        ]
    return lines


def sessions_table(r: dict[str, Any]) -> list[str]:
    rows = {row["mode"]: row for row in r["rows"]}
    both = len(rows) == len(MODES)
    lines = [
        _head(r, f"new sessions ({r['sessions']}, the same instructions)"),
        "",
        "| session | request | "
        + " | ".join(f"{m} evaluated | {m} TTFT" for m in rows)
        + (
            f" | TTFT continuum / llama-server (goal ≤ {NEW_SESSION_GOAL} from session 2) |"
            if both
            else " |"
        ),
        "|---|---|" + "---|---|" * len(rows) + ("---|" if both else ""),
    ]
    for i in range(r["sessions"]):
        what = "first, alone" if i == 0 else f"first; {i} other session(s) resident"
        cells = [_cell(row["firsts"], i, r["reps"]) for row in rows.values()]
        ratio = _ratio(rows, "firsts", i)
        lines.append(
            f"| {i + 1} | {what} | " + " | ".join(cells) + (f" | {ratio} |" if ratio else " |")
        )
    if r["sessions"] > 1:
        for key, what in (("together_p50_ms", "p50"), ("together_max_ms", "slowest")):
            cells = []
            for row in rows.values():
                each = row["together"]["evaluated"]
                total = None if None in each else sum(each)
                cells.append(f"{_tokens(total)} (all) | {_ms(row[key])}")
            ratio = (
                f" | {rows['continuum'][key] / rows['llama-server'][key]:.2f} |" if both else " |"
            )
            lines.append(
                f"| all {r['sessions']} | next step, at once: {what} | " + " | ".join(cells) + ratio
            )
    lines.append("")
    for mode, row in rows.items():
        server = ", ".join(_ms(x) for x in row["firsts"].get("server_ttft_ms", ()))
        lines.append(f"{mode}, the server's own time to first token per session: {server}")
    return lines


def format_table(r: dict[str, Any]) -> str:
    lost = misses(r)
    return "\n".join(
        [
            *loop_table(r),
            "",
            *sessions_table(r),
            "",
            *(["Losses:", *(f"- {m}" for m in lost)] if lost else [_no_loss(r)]),
        ]
    )


def _no_loss(r: dict[str, Any]) -> str:
    if len(r["rows"]) < len(MODES):
        return "Losses: none counted (no llama-server run to compare with)."
    return "Losses: none."


def _runs(r: dict[str, Any], part: str, i: int) -> str:
    """The lowest and highest run of each server, for a loss read against the noise."""
    spans = []
    for row in r["rows"]:
        lo, hi = row[part]["ttft_range"][i]
        spans.append(f"{row['mode']} {lo:,.0f}–{hi:,.0f} ms")
    return f" (runs: {', '.join(spans)})" if r["reps"] > 1 else ""


def misses(r: dict[str, Any]) -> list[str]:
    """Every figure where continuum loses to llama-server, and every missed goal."""
    rows = {row["mode"]: row for row in r["rows"]}
    if len(rows) < len(MODES):
        return []
    ours, peer = rows["continuum"], rows["llama-server"]
    out = []
    for part, label in (("loop", "codex tool loop, step {}"), ("firsts", "codex session {}")):
        for i, (o, p) in enumerate(zip(ours[part]["ttft_ms"], peer[part]["ttft_ms"], strict=True)):
            if part == "firsts" and i == 0:
                continue  # session 1's first request is the loop's step 1
            who = label.format(i + 1) + ("'s first request" if part == "firsts" else "")
            goal = NEW_SESSION_GOAL if part == "firsts" and i > 0 else 1.0
            if o > goal * p:
                aim = f" (goal: ≤ {goal}x)" if goal < 1 else ""
                out.append(
                    f"{who}: TTFT {o:,.0f} ms vs llama-server's {p:,.0f} ms, "
                    f"{o / p:.2f}x{aim}{_runs(r, part, i)}."
                )
            oe, pe = ours[part]["evaluated"][i], peer[part]["evaluated"][i]
            if oe is not None and pe is not None and oe > pe:
                out.append(f"{who}: {oe:,.0f} prompt tokens evaluated vs llama-server's {pe:,.0f}.")
    for key, what in (("together_p50_ms", "TTFT p50"), ("together_max_ms", "slowest TTFT")):
        if key in ours and key in peer and ours[key] > peer[key]:
            out.append(
                f"codex, all {r['sessions']} sessions' next step at once: {what} "
                f"{ours[key]:,.0f} ms vs llama-server's {peer[key]:,.0f} ms."
            )
    return out


def report_codex(lines: list[str], lost: list[str], r: dict[str, Any]) -> None:
    """The section of docs/benchmarks.md, and the losses it adds to the page's list."""
    peer = any(row["mode"] == "llama-server" for row in r["rows"])
    req = r["request"]
    cmd = (
        f"continuum bench codex --reps {r['reps']} --steps {r['steps']} --sessions "
        f"{r['sessions']} --max-output-tokens {r['max_output_tokens']} --n-ctx {r['n_ctx']}"
        + (" --llama-server PATH" if peer else "")
        + (
            f" --llama-server-args '{' '.join(r['llama_server_args'])}'"
            if peer and r.get("llama_server_args")
            else ""
        )
    )
    lines += [
        "## Codex's requests",
        "",
        "The requests the Codex CLI (0.169) sends, as a synthetic stand-in of the same shape "
        f"and size (developer messages of {' and '.join(f'{n:,}' for n in req['developer_chars'])}"
        f" characters, {req['tools']} tools in {req['tools_chars']:,} characters of JSON; "
        "`continuum.bench.codex_input`): a tool loop that re-sends everything each step, then "
        "new sessions with the same instructions. TTFT is measured at the client, to the "
        "first event carrying model output; tokens evaluated are each server's own report. "
        f"Goal: a new session's first TTFT at most {NEW_SESSION_GOAL}x llama-server's once "
        "another session holds the instructions. llama-server's own `/v1/responses` skips "
        "tools that are not functions, so it is sent the `multi_agent_v1` namespace's 5 tools "
        "as plain function tools: both servers offer the same 13 tools (`web_search` is left "
        "out by both). With tools offered, both stream a reply's text as it is written, but "
        "continuum holds what could be a tool call until it is complete (a bare JSON call, a "
        "`<tool_call>` or `<tools>` block), where llama-server streams this model's calls as "
        "text; so a held reply's TTFT at the client includes its decode, and the server's own "
        "first-token time is listed under the loop's table.",
        "",
        f"Model `{r['model']}`. Command: `{cmd}`",
        "",
        *loop_table(r),
        "",
        *sessions_table(r),
        "",
        "![codex](codex.png)",
        "",
    ]
    lost += misses(r)
