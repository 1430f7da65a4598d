"""``continuum bench semantic-verified``'s tables and its section of docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

from continuum.tiers.semantic import DEFAULT_THRESHOLD

GOAL_FALSE, GOAL_FALSE_CI, GOAL_PARAPHRASE, GOAL_PATH_SHARE = 0.01, 0.02, 0.5, 0.05


def format_table(result: dict[str, Any]) -> str:
    cfg = result["config"]
    lines = [
        f"semantic-verified · {result['model']} answers · {result['embedder']} · delta "
        f"{cfg['delta']} · judged at cosine >= {cfg['floor']} after the guard",
        "",
    ]
    for name, tables in result["tables"].items():
        g = result["guard_alone"][name]
        lo, hi = g["false_hit_ci95"]
        lines.append(
            f"{name} set: guard alone at cosine >= {DEFAULT_THRESHOLD}: paraphrase "
            f"{g['paraphrase_hit']:.1%}, false {g['false_hit']:.1%} ({lo:.1%}-{hi:.1%})"
        )
        lines.append(
            f"{'judge':<32} {'judged':>6} {'ms p50':>7} {'margin':>6} {'paraphrase':>10} "
            f"{'false':>6} {'95% CI':>12}"
        )
        for judge, t in tables.items():
            ms = "-" if t["ms_p50"] is None else f"{t['ms_p50']:.0f}"
            for r in t["sweep"]:
                lo, hi = r["false_hit_ci95"]
                lines.append(
                    f"{judge:<32} {t['judged']:>6} {ms:>7} {r['margin']:>6g} "
                    f"{r['paraphrase_hit']:>10.1%} {r['false_hit']:>6.1%} {lo:>5.1%}-{hi:<6.1%}"
                )
        lines.append("")
    s = result["stream"]
    if "skipped" in s:
        lines.append(f"verified stream: skipped ({s['skipped']})")
        return "\n".join(lines)
    lines.append(
        f"verified tier (judge {s['judge']} at margin {s['margin']:g}, chosen on the "
        f"{s['chosen_on']} set's table): each pair as a then b, shuffled; the first half warms up"
    )
    cold = result["cold_answer_ms_p50"]
    for name, r in s["sets"].items():
        lo, hi = r["first_sight_false_ci95"]
        plo, phi = r["promoted_false_ci95"]
        lines.append(
            f"{name}: first sight (second half) paraphrase {r['first_sight_paraphrase_share']:.1%}"
            f", false {r['first_sight_false_share']:.1%} ({lo:.1%}-{hi:.1%}); promoted: same "
            f"{r['promoted_same_share']:.1%}, different {r['promoted_false_share']:.1%} "
            f"({plo:.1%}-{phi:.1%}); calibrated threshold "
            f"{r['tier']['verified']['threshold']}; lookup p50 {r['lookup_ms_p50']:.1f} ms = "
            f"{r['lookup_ms_p50'] / cold:.1%} of a cold answer ({cold:.0f} ms)"
        )
        if "third_wording" in r:
            lines.append(f"{name}: the third wording c after the stream: {r['third_wording']}")
    if "groups" in s:
        lines.append(groups_line(s["groups"]))
        j = s["groups"]["judged"]
        shares = ", ".join(
            f"{r['margin']:g}: {r['same_accepted']:.1%} / {r['other_accepted']:.1%}"
            for r in j["sweep"]
        )
        lines.append(
            f"groups: the judge on the pairs the stream judged ({j['same_pairs']} same meaning,"
            f" {j['other_pairs']} other), accepted same / other by margin: {shares}"
        )
    return "\n".join(lines)


def groups_line(g: dict[str, Any]) -> str:
    lo, hi = g["wrong_ci95"]
    v = g["tier"]["verified"]
    wrong = g["served_wrong_share"]
    return (
        f"groups (each line once, shuffled; measured on the second half, {g['measured']} "
        f"requests, {g['repeats']} of a meaning asked before): repeat hits "
        f"{g['repeat_hit_share']:.1%}, wrong served {g['wrong_share']:.1%} ({lo:.1%}-{hi:.1%})"
        f" = {'-' if wrong is None else f'{wrong:.1%}'} of served; answer groups fitted "
        f"{v['groups_fitted']} of {v['groups_observed']} observed, median own threshold "
        f"{_cosine(v['group_threshold_median'])}, pooled threshold {_cosine(v['threshold'])}"
    )


def _cosine(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def _command(data: dict[str, Any]) -> str:
    cfg = data["config"]
    return (
        f"continuum bench semantic-verified --judges {','.join(cfg['judges'])} --sets "
        f"{','.join(cfg['sets'])} --delta {cfg['delta']} --floor {cfg['floor']} "
        f"--answer-tokens {cfg['answer_tokens']}"
    )


def report_section(lines: list[str], misses: list[str], data: dict[str, Any]) -> None:
    """docs/benchmarks.md's section, and the goals of issue 40 it misses."""
    lines += [
        "## The semantic tier's verified mode: judges, a learned threshold, promotion",
        "",
        "Judges compared on the two held-out pair sets (a model and a prompt: the two "
        "requests, or both requests with the default model's own answers), then the tier in "
        "its verified mode (thresholds learned within delta from judgments made off the "
        "request path, pooled and per answer group, near-misses answered cold and promoted "
        "once vetted) fed a stream of the pairs, and one of the groups set (many wordings per "
        "answer, where each answer's own threshold can be learned). Rates are of all pairs of "
        "a label in the set; pairs the tier never judges count as not served.",
        "",
        f"Command: `{_command(data)}`",
        "",
        "```",
        format_table(data),
        "```",
        "",
    ]
    stream = data["stream"]
    if "skipped" in stream:
        misses.append(f"semantic verified mode: {stream['skipped']}; the tier stays off.")
        return
    cold = data["cold_answer_ms_p50"]
    g = stream.get("groups")
    if g is not None and (
        g["wrong_share"] > GOAL_FALSE
        or g["wrong_ci95"][1] > GOAL_FALSE_CI
        or g["repeat_hit_share"] < GOAL_PARAPHRASE
    ):
        misses.append(
            f"semantic verified mode (groups set): {g['repeat_hit_share']:.1%} repeat hits, "
            f"{g['wrong_share']:.1%} wrong served (95% CI up to {g['wrong_ci95'][1]:.1%}); goal "
            ">= 50% at <= 1% (CI <= 2%): the tier stays off by default."
        )
    for name, r in stream["sets"].items():
        para, false = r["first_sight_paraphrase_share"], r["first_sight_false_share"]
        hi = r["first_sight_false_ci95"][1]
        if false > GOAL_FALSE or hi > GOAL_FALSE_CI or para < GOAL_PARAPHRASE:
            misses.append(
                f"semantic verified mode ({name} set): {para:.1%} paraphrase hits at first "
                f"sight, {false:.1%} false (95% CI up to {hi:.1%}); goal >= 50% at <= 1% "
                "(CI <= 2%): the tier stays off by default."
            )
        share = r["lookup_ms_p50"] / cold
        if share > GOAL_PATH_SHARE:
            misses.append(
                f"semantic verified mode ({name} set): the request path adds {share:.1%} of a "
                "cold answer (goal <= 5%)."
            )
