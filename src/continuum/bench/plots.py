"""PNG plots of benchmark sweeps, rendered from the JSON a bench wrote (never re-measured).

``continuum bench plot --results docs/results --out docs`` draws what it finds:
``residency.json`` (park/restore vs re-prefill by resident length), ``tiers.json`` (layer-KV
restore from RAM and disk vs re-prefill by prompt length), ``sweep.json`` (TTFT vs context
size, one line per mode), ``eva*.json`` (mean TTFT per mode), ``prefill.json``, ``semantic.json``,
``fleet.json`` (throughput, TTFT and the hops by worker count), ``codex.json`` (TTFT per step
and each new session's first TTFT), ``speculative-batched.json`` (drafting's speed-up by the
number of agents at once).
matplotlib is an optional dependency (``pip install 'continuum[plots]'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from continuum.errors import InvalidRequest


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidRequest(
            "plots need matplotlib: pip install 'continuum[plots]' (or pip install matplotlib)"
        ) from None
    return plt


def check_matplotlib() -> None:
    """Raise now (:class:`InvalidRequest`) if plots cannot be drawn, before a long bench."""
    _pyplot()


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_residency(data: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    rows = data["rows"]
    x = [r["tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(x, [r["reprefill_ms"] for r in rows], "o-", label="re-prefill")
    ax.plot(x, [r["park_ms"] for r in rows], "s-", label="park (state_seq_get_data)")
    ax.plot(x, [r["restore_ms"] for r in rows], "^-", label="restore (state_seq_set_data)")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="resident tokens",
        ylabel="ms (median)",
        title=f"Switching sessions · {data['n_threads']} threads",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, out / "residency.png")


def plot_restore(data: dict[str, Any], out: Path) -> Path:
    plt = _pyplot()
    rows = data["restore"]
    x = [r["prompt_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(x, [r["reprefill_ttft_ms"] for r in rows], "o-", label="cold: prefill, TTFT")
    ax.plot(x, [r["ram_ttft_ms"] for r in rows], "s-", label="layer KV from RAM, TTFT")
    ax.plot(x, [r["disk_ttft_ms"] for r in rows], "^-", label="layer KV from disk, TTFT")
    ax.plot(
        x,
        [r["ram_lookup_restore_ms"] for r in rows],
        "s--",
        alpha=0.6,
        label="RAM: lookup + checks + restore",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="prompt tokens",
        ylabel="ms (median)",
        title="Layer-KV restore vs re-prefill (end to end through the tier)",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "restore.png")


def plot_eva(results: list[dict[str, Any]], out: Path) -> Path:
    plt = _pyplot()
    results = sorted(results, key=lambda r: r["system_prompt_tokens"] or 0)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    modes = [row["mode"] for row in results[0]["rows"] if row["mode"] != "cold"]
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        ys = [
            next(r["mean_ttft_ms_turns_2_16"] for r in res["rows"] if r["mode"] == mode)
            for res in results
        ]
        xs = [j + i * width for j in range(len(results))]
        ax.bar(xs, ys, width, label=mode)
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(results))])
    ax.set_xticklabels([f"system {r['system_prompt_tokens']} tokens" for r in results])
    ax.set(
        ylabel="mean TTFT, turns 2-16 (ms, median of runs)",
        title="eva: 16-turn conversation (cold recompute off the chart)",
    )
    ax.legend()
    return _save(fig, out / "eva.png")


def plot_semantic(data: dict[str, Any], out: Path) -> Path:
    """Paraphrase hit rate and false-hit rate against the threshold, per set, guard on/off."""
    plt = _pyplot()
    sets = data["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(5.2 * len(sets), 4), sharey=True)
    axes = axes if len(sets) > 1 else [axes]
    for ax, (name, s) in zip(axes, sets.items(), strict=True):
        xs = [r["threshold"] for r in s["sweep"]]
        for tag, style in (("raw", "--"), ("guard", "-")):
            label = "no guard" if tag == "raw" else "guard"
            ax.plot(
                xs,
                [r[f"paraphrase_hit_{tag}"] for r in s["sweep"]],
                style,
                color="tab:green",
                marker="o",
                label=f"paraphrase hit ({label})",
            )
            ax.plot(
                xs,
                [r[f"false_hit_{tag}"] for r in s["sweep"]],
                style,
                color="tab:red",
                marker="x",
                label=f"false hit ({label})",
            )
        ax.axvline(data["default_threshold"], color="grey", linewidth=0.8)
        ax.axhline(0.01, color="tab:red", linewidth=0.5, linestyle=":")
        n = sum(s["pairs"].values())
        ax.set(title=f"{name} set ({n} pairs)", xlabel="threshold (cosine >= t hits)")
    axes[0].set_ylabel("share of pairs")
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"semantic tier: {data['machine']['embedder']}, default {data['default_threshold']}"
    )
    return _save(fig, out / "semantic.png")


def plot_prefill(data: dict[str, Any], out: Path) -> Path:
    """TTFT after the end of input against message length, one line per mode."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    modes = list(dict.fromkeys(r["mode"] for r in data["rows"]))
    for mode in modes:
        rows = [r for r in data["rows"] if r["mode"] == mode]
        ax.plot(
            [r["message_tokens"] for r in rows],
            [r["ttft_ms"] for r in rows],
            marker="o",
            label=mode,
        )
    floor = [r for r in data["rows"] if r["mode"] == modes[0]]
    ax.plot(
        [r["message_tokens"] for r in floor],
        [r["floor_ms"] for r in floor],
        "k:",
        label="closing glue + 1 token",
    )
    ax.set_xscale("log")
    ax.set(
        xlabel="message length (tokens)",
        ylabel="TTFT after end of input (ms, median)",
        title=f"prefill on arrival ({data['rate_tps']:.0f} tokens/s, idle gap "
        f"{data['idle_ms']} ms)",
    )
    ax.legend()
    return _save(fig, out / "prefill.png")


_SWEEP_STYLE = {
    "stateful": ("o-", "tab:blue"),
    "delta": ("o--", "tab:blue"),
    "prefix": ("s-", "tab:orange"),
    "llama-cpp-python": ("s--", "tab:orange"),
    "llama-server": ("^--", "tab:green"),
    "cold": ("x:", "tab:red"),
}


def plot_sweep(data: dict[str, Any], path: Path) -> Path:
    """Mean TTFT (turns 2-16) against the system prompt's length, one line per mode."""
    plt = _pyplot()
    points = data["points"]
    modes = list(dict.fromkeys(r["mode"] for p in points for r in p["rows"]))
    fig, ax = plt.subplots(figsize=(8.6, 4.6))
    for mode in modes:
        xs, ys, lo, hi = [], [], [], []
        for p in points:
            row = next((r for r in p["rows"] if r["mode"] == mode), None)
            if row is None:
                continue
            xs.append(p["system_prompt_tokens"])
            ys.append(row["mean_ttft_ms_turns_2_16"])
            lo.append(row["mean_ttft_ms_turns_2_16"] - row["ttft_spread_ms"][0])
            hi.append(row["ttft_spread_ms"][1] - row["mean_ttft_ms_turns_2_16"])
        style, color = _SWEEP_STYLE.get(mode, ("o-", None))
        label = mode + (" (HTTP)" if mode in ("delta", "llama-cpp-python", "llama-server") else "")
        label += " (sampled turns)" if mode == "cold" else ""
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, color=color, capsize=3, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="system prompt (tokens)",
        ylabel="mean TTFT, turns 2-16 (ms, median of runs)",
        title=f"eva context sweep · {data['machine']['n_threads']} threads · "
        f"median of {data['config']['reps']} runs · HTTP idle gap {data['config']['idle_ms']} ms",
    )
    sizes = [p["system_prompt_tokens"] for p in points]
    ax.set_xticks(sizes, [f"{x:,}" for x in sizes])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def plot_agent(data: dict[str, Any], out: Path) -> Path:
    """Per step of the tool loop: TTFT (left) and prompt tokens evaluated (right), by mode."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = list(range(1, data["steps"] + 1))
    for row in data["rows"]:
        style, color = _SWEEP_STYLE.get(
            {"session": "stateful", "chat": "prefix"}.get(row["mode"], row["mode"]), ("o-", None)
        )
        left.plot(steps, row["ttft_ms"], style, color=color, label=row["mode"])
        right.plot(steps, row["evaluated"], style, color=color, label=row["mode"])
    right.plot(steps, data["rows"][0]["prompt"], "k:", label="prompt tokens")
    left.set(xlabel="step", ylabel="TTFT (ms, server-reported, median)")
    right.set(xlabel="step", ylabel="prompt tokens evaluated (median)")
    model = Path(data["machine"]["model_path"]).name
    fig.suptitle(
        f"agent tool loop · {model} · {data['n_threads']} threads · median of {data['reps']} runs"
    )
    left.legend()
    right.legend()
    return _save(fig, out / "agent.png")


def plot_concurrent(data: dict[str, Any], out: Path) -> Path:
    """TTFT p50 and total tokens/s against the number of agents, one line per server."""
    from continuum.bench.concurrent import result_name, share_of, spread

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for mode in dict.fromkeys(r["mode"] for r in data["rows"]):
        rows = sorted((r for r in data["rows"] if r["mode"] == mode), key=lambda r: r["clients"])
        n = [r["clients"] for r in rows]
        for ax, key in ((left, "ttft_ms_p50"), (right, "tokens_per_s")):
            mid = [r[key] for r in rows]
            lo, hi = zip(
                *(spread(data["runs"][f"{mode}/{r['clients']}"], key) for r in rows), strict=True
            )
            bars = [
                [m - a for m, a in zip(mid, lo, strict=True)],
                [b - m for m, b in zip(mid, hi, strict=True)],
            ]
            ax.errorbar(n, mid, yerr=bars, marker="o", capsize=3, label=mode)
    left.set(xlabel="agents at once", ylabel="TTFT p50 (ms)", yscale="log")
    right.set(xlabel="agents at once", ylabel="tokens/s, all agents")
    left.legend()
    share = share_of(data)
    fig.suptitle(
        f"many agents at once ({data['model']}, {data['n_threads']} threads, "
        f"--prefill-share {share})\n"
        f"median of {data['reps']} runs, bars from the lowest to the highest"
    )
    return _save(fig, out / f"{Path(result_name(share)).stem}.png")


def plot_codex(data: dict[str, Any], out: Path) -> Path:
    """Codex's requests: TTFT per step of the tool loop (left), and each session's first
    TTFT, then the sessions' next step at once (right), one colour per server."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = list(range(1, data["steps"] + 1))
    rows = data["rows"]
    width = 0.8 / max(len(rows), 1)
    labels = [f"session {i + 1}" for i in range(data["sessions"])]
    labels += ["next step, p50"] if data["sessions"] > 1 else []
    for j, row in enumerate(rows):
        style, color = _SWEEP_STYLE.get(
            {"continuum": "stateful"}.get(row["mode"], row["mode"]), ("o-", None)
        )
        left.plot(steps, row["loop"]["ttft_ms"], style, color=color, label=row["mode"])
        bars = list(row["firsts"]["ttft_ms"]) + (
            [row["together_p50_ms"]] if "together" in row else []
        )
        right.bar(
            [i + j * width for i in range(len(bars))], bars, width, color=color, label=row["mode"]
        )
    left.set(
        xlabel="step (each re-sends everything)",
        ylabel="TTFT at the client (ms, median)",
        yscale="log",
        xticks=steps,
        title="session 1's tool loop",
    )
    right.set_xticks(
        [i + width * (len(rows) - 1) / 2 for i in range(len(labels))], labels, rotation=20
    )
    right.set(
        ylabel="TTFT at the client (ms, median)",
        yscale="log",
        title="each session's first request, then all at once",
    )
    left.legend()
    right.legend()
    fig.suptitle(
        f"Codex's requests (stand-in) · {data['model']} · {data['n_threads']} threads · "
        f"median of {data['reps']} runs"
    )
    return _save(fig, out / "codex.png")


def plot_fleet(data: dict[str, Any], path: Path) -> Path:
    """Per worker count: throughput, TTFT p50/p95, and the router and Redis hops."""
    plt = _pyplot()
    rows = data["rows"]
    n = [r["workers"] for r in rows]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(12, 3.6))
    left.plot(n, [r["tokens_per_s"] for r in rows], marker="o", label="tokens/s")
    left.plot(n, [r["turns_per_s"] for r in rows], marker="s", label="turns/s")
    left.set(xlabel="workers", ylabel="per second, all sessions", ylim=(0, None))
    mid.plot(n, [r["ttft_ms_p50"] for r in rows], marker="o", label="p50")
    mid.plot(n, [r["ttft_ms_p95"] for r in rows], marker="^", label="p95")
    mid.set(xlabel="workers", ylabel="TTFT at the client (ms)", ylim=(0, None))
    width = 0.25
    hops = (
        ("router, /health", [r["router_hop"]["health"]["hop_ms"] for r in rows]),
        ("router, session turn", [r["router_hop"]["turn"]["hop_ms"] for r in rows]),
        ("Redis vs SQLite, store calls", [r["redis_hop"].get("hop_ms", 0) for r in rows]),
    )
    for i, (label, ys) in enumerate(hops):
        right.bar([x + (i - 1) * width for x in n], ys, width, label=label)
    right.axhline(0, color="grey", linewidth=0.8)
    right.set(xlabel="workers", ylabel="added per request (ms, median)", xticks=n)
    for ax in (left, mid):
        ax.set_xticks(n)
        ax.legend(fontsize=8)
    values = [y for _, ys in hops for y in ys]
    right.set_ylim(min(0.0, min(values)) * 1.2, max(values) * 1.8)  # room for the legend
    right.legend(fontsize=8, loc="upper left")
    p = data["plan"]
    fig.suptitle(
        f"local fleet: {data['model']}, {p['threads']} thread(s) per worker, "
        f"{p['sessions']} sessions x {p['turns']} turns ({data['machine']['cores']} "
        "cores, shared)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)


def plot_agents_paused(data: dict[str, Any], out: Path) -> Path:
    """Left: every agent's job time, sorted, one line per server (median run); right: the
    first-token p50 of returning calls by where their KV came from."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    agents = max(r["agents"] for r in data["rows"])
    rows = [r for r in data["rows"] if r["agents"] == agents]
    for row in rows:
        runs = data["runs"][str(agents)][row["mode"]]
        run = sorted(runs, key=lambda r: r["jct_s_p50"])[len(runs) // 2]
        jct = sorted(c[-1]["done_s"] - c[0]["sent_s"] for c in run["agents"])
        left.plot([100 * (i + 1) / len(jct) for i in range(len(jct))], jct, label=row["mode"])
    left.set(xlabel="agents (%), by job time", ylabel="job completion time (s)")
    left.legend()
    sources = sorted({s for r in rows for s in r["ttft_by_source"]})
    width = 0.8 / max(len(rows), 1)
    for j, row in enumerate(rows):
        xs = [i + j * width for i in range(len(sources))]
        ys = [row["ttft_by_source"].get(s, {}).get("p50", 0.0) for s in sources]
        right.bar(xs, ys, width, label=row["mode"])
    right.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(sources))], sources)
    right.set(ylabel="TTFT p50 of returning calls (ms)")
    sh = data["shape"]
    fig.suptitle(
        f"{agents} agents on {data['lanes']} lanes ({Path(data['machine']['model_path']).name}, "
        f"{data['machine']['n_threads']} threads); tool pauses median {sh['pause_median_s']:g} s, "
        f"outputs {sh['result_tokens'][0]}-{sh['result_tokens'][1]} tokens"
    )
    return _save(fig, out / "agents-paused.png")


def plot_speculative_batched(data: dict[str, Any], out: Path) -> Path:
    """Drafting's speed-up against the number of agents at once: per task (each agent's own
    decode rate) and for all agents together (throughput); 1.0 is no drafting."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    sweep = sorted(data["sweep"], key=lambda p: p["agents"])
    n = [p["agents"] for p in sweep]
    for task in dict.fromkeys(row["task"] for p in sweep for row in p["rows"]):
        points = [
            (p["agents"], row["speedup"]) for p in sweep for row in p["rows"] if row["task"] == task
        ]
        ax.plot(*zip(*points, strict=True), marker="o", label=task)
    ax.plot(n, [p["all"]["speedup"] for p in sweep], marker="s", color="black", label="throughput")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set(xlabel="agents at once (one lane each)", ylabel="drafting / plain", xticks=n)
    ax.legend(fontsize=8)
    fig.suptitle(
        f"drafts from the context in batch steps ({data['model']}, {data['n_threads']} threads)"
        f"\nmedian of {data['reps']} runs, drafting and plain alternated"
    )
    return _save(fig, out / "speculative-batched.png")


def plot_all(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    results, out = Path(results_dir), Path(out_dir)
    if not results.is_dir():
        raise InvalidRequest(f"{results} is not a folder of benchmark results")
    out.mkdir(parents=True, exist_ok=True)
    made = []
    if (results / "residency.json").exists():
        made.append(plot_residency(json.loads((results / "residency.json").read_text()), out))
    # bench restore (up to 8k tokens) when present, else the restore rows of bench tiers
    for name in ("restore.json", "tiers.json"):
        if (results / name).exists():
            made.append(plot_restore(json.loads((results / name).read_text()), out))
            break
    if (results / "prefill.json").exists():
        made.append(plot_prefill(json.loads((results / "prefill.json").read_text()), out))
    if (results / "semantic.json").exists():
        made.append(plot_semantic(json.loads((results / "semantic.json").read_text()), out))
    for path in sorted(results.glob("sweep*.json")):  # sweep.json, sweep-idle0.json, ...
        made.append(plot_sweep(json.loads(path.read_text()), out / f"{path.stem}.png"))
    for path in sorted(results.glob("concurrent*.json")):  # concurrent.json, -equal.json
        made.append(plot_concurrent(json.loads(path.read_text()), out))
    if (results / "fleet.json").exists():
        fleet = json.loads((results / "fleet.json").read_text())
        made.append(plot_fleet(fleet, out / "fleet.png"))
    if (results / "agent.json").exists():
        made.append(plot_agent(json.loads((results / "agent.json").read_text()), out))
    if (results / "codex.json").exists():
        made.append(plot_codex(json.loads((results / "codex.json").read_text()), out))
    if (results / "agents-paused.json").exists():
        paused = json.loads((results / "agents-paused.json").read_text())
        made.append(plot_agents_paused(paused, out))
    if (results / "speculative-batched.json").exists():
        drafts = json.loads((results / "speculative-batched.json").read_text())
        made.append(plot_speculative_batched(drafts, out))
    evas = [json.loads(p.read_text()) for p in sorted(results.glob("eva*.json"))]
    if evas:
        made.append(plot_eva(evas, out))
    return made
