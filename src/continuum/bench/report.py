"""``continuum bench report``: docs/benchmarks.md, generated from a results folder.

Every figure in the page comes from the JSON files a bench wrote (nothing is typed in by hand):
for each experiment found, the seed's claim, our measured figure and the peer's, the command
that produced it, the plot when there is one, and a closing section that lists, from the same
numbers, where a stated goal was not met.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from continuum.backends.models import DEFAULT_ALIAS
from continuum.bench import sweep
from continuum.bench.eva import table_rows
from continuum.bench.report_models import alias_of, model_named, models_by_file
from continuum.errors import InvalidRequest

SEED_000 = (
    "Qwen3-4B, 16 turns: stateful 131.8 ms vs same-worker prefix reuse 175.6 ms mean "
    "TTFT (1.33x); 588 vs 765 evaluated tokens; 1,389 vs 29,348 wire characters; 5/5 "
    "retention checks in both modes"
)
SEED_003 = (
    "Azure OpenAI: ~99% fewer tokens on a 3,000-character shared prefix; memo 5/5 hits "
    "at 0 ms; mixed 20-step workflow 92.5% fewer tokens, 4 of 20 calls eliminated; "
    "warm restart hit rate >= 80%"
)


def _load(results: Path, name: str) -> dict[str, Any] | None:
    p = results / name
    return json.loads(p.read_text()) if p.exists() else None


def _eva(lines: list[str], misses: list[str], data: dict[str, Any], command: str) -> None:
    by = {r["mode"]: r for r in data["rows"]}
    model = Path(data["machine"]["model_path"]).name
    lines += [
        f"Model {model}, system prompt {data['system_prompt_tokens']} tokens, "
        f"{data['config']['turns']} turns, median of {data['config']['reps']} runs. "
        f"Command: `{command}`",
        "",
        *table_rows(data),
    ]
    lines.append("")
    if "stateful" in by and "prefix" in by:
        s, p = by["stateful"]["mean_ttft_ms_turns_2_16"], by["prefix"]["mean_ttft_ms_turns_2_16"]
        if s > p:
            misses.append(
                f"eva ({data['system_prompt_tokens']}-token system prompt): stateful "
                f"{s:.1f} ms is slower than same-worker prefix reuse {p:.1f} ms."
            )
    if "stateful" in by and "raw" in by:
        s, r = by["stateful"]["mean_ttft_ms_turns_2_16"], by["raw"]["mean_ttft_ms_turns_2_16"]
        if s > 1.05 * r:
            misses.append(
                f"eva ({data['system_prompt_tokens']}-token system prompt): stateful "
                f"{s:.1f} ms is more than 5% above the raw decode floor {r:.1f} ms."
            )


def _sweep(lines: list[str], misses: list[str], data: dict[str, Any], plot: str) -> None:
    c = data["config"]
    sizes = ",".join(str(p["requested_tokens"]) for p in data["points"])
    cmd = f"continuum bench sweep --reps {c['reps']} --sizes {sizes} --idle-ms {c['idle_ms']}"
    if set(c["modes"]) != set(sweep.default_modes(c["llama_server"])):
        cmd += f" --modes {','.join(c['modes'])}"
    cmd += " --llama-server PATH" if c["llama_server"] else ""
    lines += [
        "## Context sweep (seed 000's conversation at growing context"
        + (", no idle gap: an agent loop)" if c["idle_ms"] == 0 else ")"),
        "",
        "The same 16-turn conversation after a system prompt of growing length; n_ctx sized so "
        "the conversation fits under continuum's high-water mark, the same for every mode. "
        "Mean TTFT of turns 2–16, median of runs [spread]; HTTP modes wait the same idle gap "
        "between a reply and the next message.",
        "",
        f"{model_named(data, 'Qwen3-4B')} Command: `{cmd}`",
        "",
        *sweep.table_lines(data),
        "",
        sweep.cold_note(data),
        "",
        f"![context sweep]({plot})",
        "",
    ]
    ratios = []
    for p in data["points"]:
        by = {r["mode"]: r["mean_ttft_ms_turns_2_16"] for r in p["rows"]}
        n = f"{p['system_prompt_tokens']:,}"
        for ours, peer in (("stateful", "prefix"), ("delta", "llama-server")):
            if ours in by and peer in by:
                ratios.append(f"{n} tokens: {ours} vs {peer} {by[peer] / by[ours]:.2f}x")
                if by[ours] > by[peer]:
                    misses.append(
                        f"context sweep, {n}-token system prompt, idle gap {c['idle_ms']} ms: "
                        f"{ours} {by[ours]:.1f} ms is "
                        f"slower than {peer} {by[peer]:.1f} ms."
                    )
    if ratios:
        lines += ["TTFT ratios (peer / ours): " + "; ".join(ratios) + ".", ""]


def _prefill(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    sizes = ",".join(str(s) for s in dict.fromkeys(r["message_tokens"] for r in data["rows"]))
    lines += [
        "## Prefill on arrival and eager glue",
        "",
        "Goal: TTFT after the end of input flat in message length and within 20% of the decode "
        "of the closing glue plus one token. A request-based server starts work when the "
        "request arrives; its careful user pre-warms the slot with the partial message "
        "(`llama-server-prewarm`: `n_predict: 0`, `cache_prompt`, one request in flight).",
        "",
        f"{model_named(data, None)} "
        f"Command: `continuum bench prefill --reps {data['reps']} --idle-ms {data['idle_ms']} "
        f"--rate {data['rate_tps']:.0f}"
        + (" --llama-server PATH" if data.get("llama_server") else "")
        + f"` (message sizes requested: {sizes} tokens)",
        "",
        "| message tokens | mode | TTFT after input | decoded after input | fed before (peer: "
        "pre-warm requests) | glue + 1 token | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    floors = {r["message_tokens"]: r["floor_ms"] for r in data["rows"] if r.get("floor_ms")}
    for r in data["rows"]:
        floor = floors[r["message_tokens"]]
        ratio = r["ttft_ms"] / floor
        fed = r["fed_tokens"] or r.get("prewarm_requests", 0)
        lines.append(
            f"| {r['message_tokens']} | {r['mode']} | {r['ttft_ms']:.1f} ms | "
            f"{r['evaluated_after_input']:.0f} | {fed:.0f} | {floor:.1f} ms | {ratio:.2f} |"
        )
        if r["mode"] == "arrival" and ratio > 1.2:
            misses.append(
                f"prefill on arrival, {r['message_tokens']}-token message: TTFT "
                f"{r['ttft_ms']:.1f} ms is {ratio:.2f}x the closing glue + 1 token "
                f"({r['floor_ms']:.1f} ms; goal within 1.2x). Fed tokens are decoded only in "
                "batches of 8+ (so the KV equals a whole-message append), so a short message "
                "leaves up to ~8 tokens plus the held-back last word for after the end of input."
            )
    best: dict[int, dict[str, Any]] = {}
    for r in data["rows"]:  # our best mode at each size against each peer mode
        if r["mode"] in ("append", "eager", "arrival"):
            k = r["message_tokens"]
            best[k] = min(best.get(k, r), r, key=lambda x: x["ttft_ms"])
    for r in data["rows"]:
        ours = best.get(r["message_tokens"])
        if r["mode"].startswith("llama-server") and ours and r["ttft_ms"] < ours["ttft_ms"]:
            misses.append(
                f"prefill, {r['message_tokens']}-token message: {r['mode']} "
                f"{r['ttft_ms']:.1f} ms is faster than our best mode ({ours['mode']}, "
                f"{ours['ttft_ms']:.1f} ms)."
            )
    same = all(r["same_reply_all_modes"] for r in data["rows"])
    lines += [
        "",
        f"Same reply in every mode and run: {'yes' if same else 'no'}.",
        "",
        "![prefill](prefill.png)",
        "",
    ]


def _semantic(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    t = data["default_threshold"]
    g = data["gptcache_reference"]
    sizes = ",".join(str(r["entries"]) for r in data["lookup"])
    lines += [
        "## Semantic tier (seed 003)",
        "",
        "Seed's claim: different wording, same intent, matched by embedding, 1 vector lookup "
        f"and 0 tokens per hit. Peer: GPTCache reports {g['false_hit_rate']:.1%} wrong hits "
        f"at its default threshold {g['threshold']}.",
        "",
        f"Metric: {data['metric']}. Embedder: {data['machine']['embedder']}. Command: "
        f"`continuum bench semantic --reps {data['config']['reps']} --sizes {sizes}`",
        "",
        f"| set | pairs | paraphrase hits at {t} (guard alone) | false hits at {t} (guard alone) | "
        f"95% CI | paraphrase hits at {t} (no guard) | false hits at {t} (no guard) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in data["sets"].items():
        d = s["default"]
        lo, hi = d.get("false_hit_ci95_guard", (float("nan"), float("nan")))
        role = " (designed on)" if s.get("designed_on") else ""
        lines.append(
            f"| {name}{role} | {sum(s['pairs'].values())} | {d['paraphrase_hit_guard']:.1%} | "
            f"{d['false_hit_guard']:.1%} ({d['false_hits_guard']}) | {lo:.1%}-{hi:.1%} | "
            f"{d['paraphrase_hit_raw']:.1%} | {d['false_hit_raw']:.1%} |"
        )
        if d["false_hit_guard"] > 0.01 or d["paraphrase_hit_guard"] < 0.5:
            misses.append(
                f"semantic, guard alone ({name} set) at {t}: {d['false_hit_guard']:.1%} "
                "false hits, "
                f"{d['paraphrase_hit_guard']:.1%} paraphrase hits (goal <= 1% and >= 50%)."
            )
    lines += [
        "",
        "The dev set was used while designing the guard; the holdout set was written "
        "afterwards by someone who had seen neither, but its edits are of the kinds the guard "
        "checks; the independent set (16 kinds of edit, multilingual and code included) was "
        "written by a helper given only the task and was never tuned on: its figures are the "
        "ones to believe.",
        "",
    ]
    ind = data["sets"].get("independent")
    if ind is not None:
        d = ind["default"]
        lines += [
            f"Independent set at {t}, by kind (guard): false hits "
            + ", ".join(f"{k} {v:.0%}" for k, v in sorted(d["false_by_kind_guard"].items()))
            + "; paraphrase hits "
            + ", ".join(f"{k} {v:.0%}" for k, v in sorted(d["paraphrase_by_kind_guard"].items())),
            "",
        ]
    if data.get("judge"):
        from continuum.bench.semantic_judge import report_judge

        report_judge(lines, misses, data["judge"], t)
    lines += [
        "![semantic](semantic.png)",
        "",
        f"Query embedding: median {data['embed_ms_median']:.1f} ms. Lookup without it:",
        "",
        "| entries | index | search p50 | search p99 | whole lookup p50 |",
        "|---|---|---|---|---|",
    ]
    for r in data["lookup"]:
        lines.append(
            f"| {r['entries']:,} | {r['index']} | {r['search_us_p50']:.0f} µs | "
            f"{r['search_us_p99']:.0f} µs | {r['lookup_us_p50']:.0f} µs |"
        )
        total_ms = r["lookup_us_p50"] / 1000 + data["embed_ms_median"]
        if r["entries"] >= 100_000 and total_ms > 5:
            misses.append(
                f"semantic lookup at {r['entries']:,} entries: {total_ms:.1f} ms median "
                f"including the query's embedding ({data['embed_ms_median']:.1f} ms) — "
                "over the 5 ms goal; the index search alone is "
                f"{r['lookup_us_p50'] / 1000:.2f} ms."
            )
    lines.append("")


def _evas(lines: list[str], misses: list[str], results: Path) -> None:
    evas = sorted(results.glob("eva*.json"))
    if not evas:
        return
    lines += ["## Stateful sessions (seed 000)", "", f"Seed's claim: {SEED_000}.", ""]
    for p in evas:
        data = json.loads(p.read_text())
        st = data["config"]["system_tokens"]
        alias = data["config"].get("model") or alias_of(Path(data["machine"]["model_path"]).name)
        cmd = (
            f"continuum bench eva --reps {data['config']['reps']}"
            + (f" --system-tokens {st}" if st else "")
            + (f" --model {alias}" if alias != DEFAULT_ALIAS else "")
        )
        _eva(lines, misses, data, cmd)
    if (results.parent / "eva.png").exists() or (results / "eva.png").exists():
        lines += ["![eva](eva.png)", ""]


def _restore_table(rows: list[dict[str, Any]]) -> list[str]:
    """Layer-KV restore against re-prefill, one row per prompt size (tiers and restore)."""
    lines = [
        "| prompt tokens | re-prefill TTFT | layer KV from RAM | from disk |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['prompt_tokens']:,} | {row['reprefill_ttft_ms']:.0f} ms | "
            f"{row['ram_ttft_ms']:.1f} ms ({row['ram_speedup']:.0f}x) | "
            f"{row['disk_ttft_ms']:.1f} ms ({row['disk_speedup']:.0f}x) |"
        )
    return lines


def _tiers(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    sp, wf, me = data["shared_prefix"], data["workflow"], data["memo"]
    lines += [
        "## The reuse stack (seed 003)",
        "",
        f"Seed's claim: {SEED_003}.",
        "",
        f"{model_named(data, 'Azure OpenAI')} "
        f"Command: `continuum bench tiers --reps {data['reps']}`",
        "",
        "| experiment | seed | ours (with the stack) | without the stack |",
        "|---|---|---|---|",
        f"| ~3,000-char shared prefix, tokens per later call | ~99% fewer | "
        f"{sp['tokens_sent_per_later_call_with']:.0f} ({sp['fewer_tokens_pct']:.1f}% fewer) |"
        f" {sp['tokens_sent_per_later_call_without']:.0f} |",
        f"| memo, 5 exact repeats | 5/5, 0 ms | {me['hits']}/5, "
        f"{min(me['repeat_ms']):.2f}–{max(me['repeat_ms']):.2f} ms | "
        f"{me['first_ms']:.0f} ms |",
        f"| 20-step workflow, tokens | 92.5% fewer | {wf['tokens_sent_with']:,} "
        f"({wf['tokens_saved_pct']:.1f}% fewer) | {wf['tokens_sent_without']:,} |",
        f"| 20-step workflow, backend calls eliminated | 4 of 20 | "
        f"{wf['calls_eliminated']} of {wf['backend_calls_without']} | — |",
        "",
        *_restore_table(data["restore"]),
    ]
    for row in data["restore"]:
        if 1500 <= row["prompt_tokens"] <= 2600:
            if row["ram_speedup"] < 500:
                misses.append(
                    f"layer KV at {row['prompt_tokens']} tokens: {row['ram_speedup']:.0f}x "
                    "from RAM end to end (goal 500x). One decode step is required for a "
                    "first token and costs more than 1/500 of the prefill here."
                )
            if row["disk_speedup"] < 50:
                misses.append(
                    f"layer KV at {row['prompt_tokens']} tokens: "
                    f"{row['disk_speedup']:.0f}x from disk (goal 50x)."
                )
    if sp["fewer_tokens_pct"] < 99:
        misses.append(
            f"shared prefix: {sp['fewer_tokens_pct']:.1f}% fewer tokens (goal 99%); the "
            f"{sp['tokens_sent_per_later_call_with']:.0f} tokens still sent are the "
            "question itself."
        )
    lines += ["", "![restore](restore.png)", ""]


def _http_command(http: dict[str, Any], by: dict[str, dict[str, Any]]) -> str:
    cmd = f"continuum bench http --reps {http['reps']}"
    cmd += " --llama-server PATH" if "llama-server" in by else ""
    cmd += f" --system-tokens {http['system_tokens']}" if http.get("system_tokens") else ""
    if set(by) - {"delta", "resend", "llama-cpp-python", "llama-server"}:
        cmd += f" --modes {','.join(by)}"
    cmd += f" --idle-ms {http['idle_ms']}" if http.get("idle_ms") else ""
    cmd += f" --rate {http['rate_tps']:.0f}" if http.get("rate_tps") else ""
    cmd += f" --end-delay-ms {http['end_delay_ms']}" if http.get("end_delay_ms") else ""
    return cmd


def _http(lines: list[str], misses: list[str], http: dict[str, Any]) -> None:
    by = {r["mode"]: r for r in http["rows"]}
    gap = f", idle gap {http['idle_ms']} ms" if http.get("idle_ms") else ""
    lines += [
        f"## Over HTTP ({http['system_chars']:,}-char system prompt, n_ctx {http['n_ctx']}{gap})",
        "",
        f"{model_named(http, 'Qwen3-4B')} Command: `{_http_command(http, by)}`",
        "",
        "| mode | mean TTFT turns 2–16 | wire bytes | evaluated after input | decoded ahead "
        "of input |",
        "|---|---|---|---|---|",
    ]
    for r in http["rows"]:
        ev = r["evaluated_prompt_tokens"]
        early = r.get("decoded_early_tokens")
        lines.append(
            f"| {r['mode']} | {r['mean_ttft_ms_turns_2_16']:.1f} ms | "
            f"{r['wire_bytes']:,} | {'not reported' if ev is None else f'{ev:,}'} | "
            f"{'not measured' if early is None else f'{early:,}'} |"
        )
    lines.append("")
    ours = by.get("input") or by.get("delta")
    peer = by.get("llama-server") or by.get("llama-cpp-python")
    if peer is not None and ours is not None:
        fewer = 100 * (1 - ours["wire_bytes"] / peer["wire_bytes"])
        if fewer < 95:
            misses.append(
                f"HTTP ({http['system_chars']:,}-char system prompt): {fewer:.1f}% fewer "
                f"wire bytes than {peer['mode']} (goal 95%), counting the session's "
                "one-time creation request."
            )
    if "llama-server" in by and ours is not None:
        ratio = by["llama-server"]["mean_ttft_ms_turns_2_16"] / ours["mean_ttft_ms_turns_2_16"]
        if ratio < 2:
            misses.append(
                f"HTTP ({http['system_chars']:,}-char system prompt{gap}): {ours['mode']} is "
                f"{ratio:.2f}x faster than tuned llama-server (goal 2x); the decode of "
                "what is left after the end of input dominates on this CPU."
            )


def _restore(lines: list[str], data: dict[str, Any]) -> None:
    lines += [
        "## Layer-KV restore vs re-prefill",
        "",
        f"{model_named(data, None)} Command: `continuum bench restore --reps {data['reps']}`",
        "",
        *_restore_table(data["restore"]),
        "",
        "![restore](restore.png)",
        "",
    ]


def _overhead(lines: list[str], data: dict[str, Any]) -> None:
    t, mem = data["tiers"], data["session_memory"]
    lines += [
        "## The reuse layer's own cost",
        "",
        f"{model_named(data, 'Azure OpenAI')} Command: `continuum bench overhead`",
        "",
        f"- memo hit end to end: {t['memo_hit_us_median']:.0f} µs (render + tokenize "
        f"{t['render_and_tokenize_us']:.0f} µs, key {t['key_us']:.0f} µs)",
        "- prefix-trie lookup: "
        + ", ".join(f"{p['tokens']:,} tokens {p['lookup_us']:.0f} µs" for p in t["prefix_lookup"]),
    ]
    sem = data["semantic"]
    if "lookup" in sem:
        lines.append(
            "- semantic lookup without the query's embedding ("
            f"{sem['embed_ms_median']:.1f} ms): "
            + ", ".join(
                f"{x['entries']:,} entries {x['lookup_us_p50']:.0f} µs" for x in sem["lookup"]
            )
        )
    lines += [
        f"- memory per resident session ({mem['tokens_per_session']:.0f} tokens): KV "
        f"{mem['kv_bytes_per_session'] / 1e6:.1f} MB, bookkeeping "
        f"{mem['bookkeeping_bytes_per_session'] / 1e3:.0f} kB",
        "",
    ]


Section = Callable[[list[str], list[str], dict[str, Any]], None]


def _module_sections() -> tuple[tuple[str, Section], ...]:
    """Sections a bench module renders from its own results file, in the page's order
    (imported here, when a report is made, not when this module is)."""
    from continuum.bench.agents_paused_report import report_section as paused
    from continuum.bench.codex_report import report_codex
    from continuum.bench.draft_cost import report_section as draft_cost
    from continuum.bench.speculative import report_section as speculative
    from continuum.bench.speculative_batched import report_section as speculative_batched

    return (
        ("agents-paused.json", paused),
        ("draft-cost.json", draft_cost),
        ("speculative.json", speculative),
        ("speculative-sampled.json", speculative),
        ("speculative-batched.json", speculative_batched),
        ("codex.json", report_codex),
    )


def _agent_sections(lines: list[str], misses: list[str], results: Path) -> None:
    """The sections on agents at once: concurrent agents, paused agents, drafting, Codex's
    requests, one context, the fleet."""
    from continuum.bench.concurrent import RESULT_NAMES, report_concurrent

    for name in RESULT_NAMES:  # the default, then the variant
        concurrent = _load(results, name)
        if concurrent:
            report_concurrent(lines, misses, concurrent)
    for name, section in _module_sections():
        data = _load(results, name)
        if data:
            section(lines, misses, data)
    from continuum.bench.context_report import report_context

    report_context(lines, misses, results)
    fleet = _load(results, "fleet.json")
    if fleet:
        from continuum.bench.fleet import report_fleet

        report_fleet(lines, misses, fleet)


def render_report(results_dir: str | Path) -> str:
    results = Path(results_dir)
    if not results.is_dir():
        raise InvalidRequest(f"{results} is not a folder of benchmark results")
    lines = [
        "# Benchmarks",
        "",
        "Generated by `continuum bench report` from the JSON in `docs/results/`; every "
        "number below was measured by the command shown next to it, on the machine its "
        "JSON records.",
        "",
        *models_by_file(results),
    ]
    misses: list[str] = []
    _evas(lines, misses, results)
    for path in sorted(results.glob("sweep*.json"), key=lambda p: (p.stem != "sweep", p.name)):
        _sweep(lines, misses, json.loads(path.read_text()), f"{path.stem}.png")
    tiers = _load(results, "tiers.json")
    if tiers:
        _tiers(lines, misses, tiers)
    for path in sorted(results.glob("http*.json")):
        _http(lines, misses, json.loads(path.read_text()))
    agent = _load(results, "agent.json")
    if agent:
        from continuum.bench.agent import report_section

        report_section(lines, misses, agent)
    compaction = _load(results, "compaction.json")
    if compaction:
        from continuum.bench.compaction import report_section as compaction_section

        compaction_section(lines, misses, compaction)
    restore = _load(results, "restore.json")
    if restore:
        _restore(lines, restore)
    over = _load(results, "overhead.json")
    if over:
        _overhead(lines, over)
    prefill = _load(results, "prefill.json")
    if prefill:
        _prefill(lines, misses, prefill)
    semantic = _load(results, "semantic.json")
    if semantic:
        _semantic(lines, misses, semantic)
    verified = _load(results, "semantic-verified.json")
    if verified:
        from continuum.bench.semantic_verified_report import report_section

        report_section(lines, misses, verified)
    _agent_sections(lines, misses, results)
    if (results / "residency.json").exists():
        lines += [
            "## Switching sessions",
            "",
            "Command: `continuum bench residency`",
            "",
            "![residency](residency.png)",
            "",
        ]
    lines += ["## Where we lose, or a claim did not reproduce", ""]
    lines += [f"- {m}" for m in misses] or ["- Nothing: every stated goal was met."]
    return "\n".join(lines) + "\n"
