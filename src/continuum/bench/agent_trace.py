"""The seeded trace of ``continuum bench agents-paused``: many agents, each a tool loop with
pauses while its tools run.

Every server sees the same trace (one seed). An agent arrives at ``start_s`` (arrivals are
staggered evenly over ``stagger_s``), makes ``len(steps)`` model calls, and between two calls
waits while its tool runs (``pause_s``), then sends the tool's output (``result_tokens`` tokens
of a test log or a file) with the whole transcript. The shape follows the published agent
traces: 6-11 model calls a task (BFCL averages 6.3 turns, SWE-Bench 10.9); tool pauses drawn
from a log-normal distribution (by default a median of 2 s with 10% of pauses over 20 s);
tool outputs of 200-2,000 tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from continuum.errors import InvalidRequest

Z90 = 1.2815515655446004  # the standard normal's 90th percentile


@dataclass(frozen=True, slots=True)
class Step:
    """One model call of an agent: the tool output it sends (``result_tokens``: 0 for the first
    call, which sends the task) and, after its reply, how long the next tool runs
    (``pause_s``: 0 after the last call)."""

    result_tokens: int
    pause_s: float


@dataclass(frozen=True, slots=True)
class AgentTrace:
    agent: int
    start_s: float
    steps: tuple[Step, ...]

    @property
    def paused_s(self) -> float:
        return sum(s.pause_s for s in self.steps)


@dataclass(frozen=True, slots=True)
class TraceShape:
    """The distributions a trace is drawn from (see the module docstring)."""

    steps: tuple[int, int] = (6, 11)
    result_tokens: tuple[int, int] = (200, 2000)
    pause_median_s: float = 2.0
    pause_p90_s: float = 20.0  # 10% of pauses are longer
    stagger_s: float = 10.0

    def __post_init__(self) -> None:
        lo, hi = self.steps
        if not 1 <= lo <= hi:
            raise InvalidRequest(f"steps must be 1 <= low <= high, got {self.steps}")
        lo, hi = self.result_tokens
        if not 1 <= lo <= hi:
            raise InvalidRequest(
                f"result_tokens must be 1 <= low <= high, got {self.result_tokens}"
            )
        if not 0 < self.pause_median_s <= self.pause_p90_s:
            raise InvalidRequest(
                "pauses need 0 < median <= 90th percentile, got "
                f"{self.pause_median_s} and {self.pause_p90_s}"
            )
        if self.stagger_s < 0:
            raise InvalidRequest(f"stagger_s must be >= 0, got {self.stagger_s}")

    @property
    def sigma(self) -> float:
        return math.log(self.pause_p90_s / self.pause_median_s) / Z90


def make_trace(agents: int, shape: TraceShape | None = None, seed: int = 0) -> list[AgentTrace]:
    """``agents`` agents' plans, the same for every call with the same arguments."""
    if agents < 1:
        raise InvalidRequest(f"agents must be >= 1, got {agents}")
    shape = shape or TraceShape()
    mu = math.log(shape.pause_median_s)
    out = []
    for i in range(agents):
        rng = random.Random(f"{seed}/{i}")  # an agent's plan does not depend on the others
        n = rng.randint(*shape.steps)
        steps = []
        for k in range(n):
            result = rng.randint(*shape.result_tokens) if k else 0
            pause = rng.lognormvariate(mu, shape.sigma) if k < n - 1 else 0.0
            steps.append(Step(result, round(pause, 3)))
        start = shape.stagger_s * i / agents
        out.append(AgentTrace(i, round(start, 3), tuple(steps)))
    return out


_LOG_LINE = "tests/agent_{a}/test_module_{s}.py::test_case_{i} {verdict} [{pct:3d}%]"
_FILE_LINE = "    total_{i} = compute_{s}(items[{i}], rate={r}.{i:02d})  # line {i} of step {s}"


def tool_output(agent: int, step: int, tokens: int) -> str:
    """A deterministic tool output of about ``tokens`` tokens: a test log on even steps (about
    24 tokens a line), a source file on odd ones (about 31). The exact count depends on the
    tokenizer; the bench reports the server's own prompt counts."""
    if step % 2 == 0:
        lines = max(1, round(tokens / 24))
        out = [f"$ pytest tests/agent_{agent} -q  # step {step}"]
        for i in range(lines):
            verdict = "FAILED" if (i * 7 + step + agent) % 13 == 0 else "PASSED"
            pct = (100 * (i + 1)) // lines
            out.append(_LOG_LINE.format(a=agent, s=step, i=i, verdict=verdict, pct=pct))
        return "\n".join(out)
    lines = max(1, round(tokens / 31))
    out = [f"# src/agent_{agent}/module_{step}.py", f"def compute_{step}(item, rate):"]
    out += [_FILE_LINE.format(i=i, s=step, r=agent % 10) for i in range(lines)]
    return "\n".join(out)


__all__ = ["AgentTrace", "Step", "TraceShape", "make_trace", "tool_output"]
