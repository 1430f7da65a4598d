"""``continuum bench agents-paused``: more agents than lanes, each pausing for its tools; and
``continuum bench park-return``: what one return from a parked snapshot costs. Registered on
the group in :mod:`continuum.cli.bench`.

The trace's shape is one object (:class:`~continuum.bench.agent_trace.TraceShape`): its options
are gathered into it as they are parsed, and the command receives the shape, not each field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from continuum.cli.common import (
    emit,
    json_opt,
    llama_server_opt,
    model_opt,
    out_opt,
    parse_modes,
    parse_sizes,
    reps_opt,
    stderr_progress,
    threads_opt,
)
from continuum.errors import InvalidRequest

_SHAPE = "agents_paused_shape"


def _pair(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(",")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise click.BadParameter(f"give LOW,HIGH as integers, got {text!r}") from None


def _gather(name: str, convert: Callable[[Any], Any]) -> Callable[..., None]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        ctx.meta.setdefault(_SHAPE, {})[name] = convert(value)

    return callback


def _shape_opt(flag: str, field: str, convert: Callable[[Any], Any], **kw: Any) -> Any:
    """One option of the trace shape: parsed into ``ctx.meta``, not passed to the command."""
    return click.option(
        flag, show_default=True, expose_value=False, callback=_gather(field, convert), **kw
    )


def shape_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The trace shape's options, gathered into ``ctx.meta`` (see :func:`_shape`)."""
    opts = [
        _shape_opt(
            "--steps",
            "steps",
            _pair,
            default="6,11",
            help="Model calls an agent makes, LOW,HIGH (uniform).",
        ),
        _shape_opt(
            "--result-tokens",
            "result_tokens",
            _pair,
            default="200,2000",
            help="Tokens of a tool output, LOW,HIGH (uniform, about).",
        ),
        _shape_opt(
            "--pause-median",
            "pause_median_s",
            float,
            type=float,
            default=2.0,
            help="Median tool pause in seconds (log-normal).",
        ),
        _shape_opt(
            "--pause-p90",
            "pause_p90_s",
            float,
            type=float,
            default=20.0,
            help="10% of tool pauses are longer than this (seconds).",
        ),
        _shape_opt(
            "--stagger",
            "stagger_s",
            float,
            type=float,
            default=10.0,
            help="Agents arrive evenly over this many seconds.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _shape() -> Any:
    from continuum.bench.agent_trace import TraceShape

    try:
        return TraceShape(**click.get_current_context().meta.get(_SHAPE, {}))
    except InvalidRequest as e:
        raise click.BadParameter(str(e)) from None


@click.command("agents-paused")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--agents",
    default="16",
    show_default=True,
    help="Numbers of agents, comma-separated (each count is a run per server).",
)
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@shape_options
@click.option(
    "--cache-ram",
    type=click.IntRange(-1),
    default=8192,
    show_default=True,
    help="llama-server's --cache-ram in MiB (its default; -1: no limit).",
)
@click.option(
    "--snapshot-ram",
    type=click.IntRange(0),
    default=512,
    show_default=True,
    help="continuum serve's --snapshot-ram in MiB (its default): parked sessions past it go "
    "to disk.",
)
@click.option(
    "--modes",
    default="",
    help="Comma-separated: continuum, continuum-las, continuum-age, continuum-arrival, "
    "continuum-lru, continuum-stateless, llama-server (default: continuum, "
    "continuum-stateless, and llama-server when its path is given).",
)
@llama_server_opt
@json_opt
@out_opt
def bench_agents_paused(**opts: Any) -> None:
    """More agents than lanes, each a tool loop that pauses while its tools run: job
    completion time, TTFT by where the KV came from, and how much KV survived the pauses,
    continuum serve vs llama-server with --cache-ram (each server alone)."""
    from continuum.bench.agents_paused import PausedPlan, format_table, run_agents_paused

    plan = PausedPlan(
        model=opts["model"],
        agents=parse_sizes(opts["agents"], least=1),
        reps=opts["reps"],
        threads=opts["threads"],
        max_tokens=opts["max_tokens"],
        shape=_shape(),
        seed=opts["seed"],
        llama_server=opts["llama_server"],
        cache_ram_mb=opts["cache_ram"],
        snapshot_ram_mb=opts["snapshot_ram"],
        modes=parse_modes(opts["modes"]),
    )
    try:
        plan.chosen()
    except InvalidRequest as e:
        raise click.BadParameter(str(e)) from None
    with stderr_progress() as progress:
        result = run_agents_paused(plan, progress)
    emit(result, "agents-paused.json", opts["out"], opts["as_json"], format_table)


@click.command("park-return")
@model_opt
@threads_opt
@reps_opt
@click.option(
    "--sizes",
    default="200,1000,2000",
    show_default=True,
    help="Tokens of the returning call's tool output, comma-separated.",
)
@click.option(
    "--history",
    type=click.IntRange(0),
    default=2000,
    show_default=True,
    help="Tokens of the earlier tool output in the transcript before the return.",
)
@click.option(
    "--pause",
    type=click.FloatRange(0, 600),
    default=2.0,
    show_default=True,
    help="Seconds the agent's tool runs between its reply and its return.",
)
@json_opt
@out_opt
def bench_park_return(**opts: Any) -> None:
    """A returning agent's first token when its KV stayed resident, waited in a RAM snapshot,
    or is prefilled again (one lane, each way on a session of its own)."""
    from continuum.bench.park_return import ReturnPlan, format_table, run_park_return

    plan = ReturnPlan(
        model=opts["model"],
        sizes=parse_sizes(opts["sizes"], least=1),
        history=opts["history"],
        pause_s=opts["pause"],
        reps=opts["reps"],
        threads=opts["threads"],
    )
    try:
        plan.check()
    except InvalidRequest as e:
        raise click.BadParameter(str(e)) from None
    with stderr_progress() as progress:
        result = run_park_return(plan, progress)
    emit(result, "park-return.json", opts["out"], opts["as_json"], format_table)
