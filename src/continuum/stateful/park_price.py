"""What parking a session costs, priced by what bringing it back costs and when it is expected
back (issue 38: agents that pause for tools).

An agent's session is idle while its tool runs (a test run, a build: seconds to minutes), then
comes back with the tool's output. When a lane is needed, the session to park is the one whose
return costs least per second of lane it frees: ``reload_ms / expected_remaining_s``
(:meth:`ParkPricing.price`) — a session that is cheap to bring back and far from coming back
goes first, one that is about to return and expensive to reload stays.

- **When it comes back** (:class:`PauseClock`): a client may say how long its tool will take
  (the ``X-Continuum-Pause`` header, seconds); without a hint, the median of the session's own
  earlier pauses; without history, ``prior_s``. Past its expected return, a pause is expected
  to last about as long again as it has lasted (pauses are heavy-tailed: a tool still running
  after its usual time is likely a long one).
- **What bringing it back costs** (:class:`ReloadCosts`): its snapshot's bytes (learned from
  earlier parks, per token) at the measured speed of a RAM park and restore when the snapshot
  RAM budget has room for it, of a disk write and read when it does not, and a prefill of its
  tokens when there is no snapshot store to hold it.
- **A time to live**: a paused session whose expected return is nearer than its reload time is
  kept resident (*protected*): parking it could only cost. A request that has waited
  ``PATIENCE_S`` for a lane no longer respects protection, so no agent loop holds a lane
  against everyone else.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from continuum.errors import InvalidRequest

PRIOR_PAUSE_S = 2.0  # a session with no pause history and no hint: the median agent tool call
PATIENCE_S = 2.0  # a request waiting this long for a lane parks protected sessions too
MAX_PAUSE_HINT_S = 86_400.0
_HISTORY = 16  # pauses remembered per session
_FLOOR_S = 0.05  # remaining times below this count as this (prices stay finite)
# priors until a park or restore has been timed (this machine: a 2-core CPU, NVMe)
RAM_MS_PER_MB = 2.0
DISK_MS_PER_MB = 12.0
PREFILL_MS_PER_TOKEN = 5.0
_SMOOTHING = 0.3


def check_pause_hint(value: object, name: str = "X-Continuum-Pause") -> float:
    """A client's pause hint in seconds: a finite number in [0, one day]; else a typed error
    naming where it came from."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0.0 <= seconds <= MAX_PAUSE_HINT_S:
        raise InvalidRequest(
            f"{name} must be the expected seconds until this conversation's next request, a "
            f"number from 0 to {MAX_PAUSE_HINT_S:g}; got {value!r}"
        )
    return seconds


@dataclass
class PauseClock:
    """When a session's last turn ended, and how long its pauses have lasted.

    Invariant: ``ended`` is set exactly while the session is paused (between a turn's end and
    the next turn's start)."""

    ended: float | None = None
    hint_s: float | None = None
    pauses: deque[float] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    _opened: bool = False  # idle since it was opened: that wait is no tool's pause

    def open(self, now: float) -> None:
        """The session was created or reopened: idle from now, not after a turn of its own."""
        self.ended, self.hint_s, self._opened = now, None, True

    def end_turn(self, now: float) -> None:
        self.ended, self.hint_s, self._opened = now, None, False

    def hint(self, seconds: float) -> None:
        """The client's word for this pause (after :meth:`end_turn`)."""
        self.hint_s = check_pause_hint(seconds)

    def start_turn(self, now: float) -> None:
        """A request of the session arrived (a turn, or the first piece of a message)."""
        if self.ended is not None and not self._opened:
            self.pauses.append(max(0.0, now - self.ended))
        self.ended, self.hint_s, self._opened = None, None, False

    def expected_s(self, prior_s: float = PRIOR_PAUSE_S) -> float:
        """How long this pause is expected to last in all."""
        if self.hint_s is not None:
            return self.hint_s
        return statistics.median(self.pauses) if self.pauses else prior_s

    def remaining_s(self, now: float, prior_s: float = PRIOR_PAUSE_S) -> float | None:
        """Seconds until the session is expected back; None while it is not paused."""
        if self.ended is None:
            return None
        elapsed, expected = now - self.ended, self.expected_s(prior_s)
        return expected - elapsed if elapsed < expected else elapsed


@dataclass
class ReloadCosts:
    """Measured costs of bringing a parked session back (moving averages, priors until the
    first measurement)."""

    bytes_per_token: float | None = None
    ram_ms_per_mb: float = RAM_MS_PER_MB
    disk_ms_per_mb: float = DISK_MS_PER_MB
    prefill_ms_per_token: Callable[[], float | None] = lambda: None

    def parked(self, tokens: int, nbytes: int, ms: float) -> None:
        """A park of ``tokens`` tokens wrote ``nbytes`` in ``ms`` (a RAM put)."""
        if tokens > 0 and nbytes > 0:
            self.bytes_per_token = _smooth(self.bytes_per_token, nbytes / tokens)
            self.ram_ms_per_mb = _smooth(self.ram_ms_per_mb, 2 * ms / (nbytes / 1e6))

    def restored(self, nbytes: int, ms: float, source: str) -> None:
        """A restore of ``nbytes`` from ``source`` ("ram" or "disk") took ``ms``."""
        if nbytes <= 0:
            return
        per_mb = 2 * ms / (nbytes / 1e6)  # a park's cost and a restore's, counted alike
        if source == "disk":
            self.disk_ms_per_mb = _smooth(self.disk_ms_per_mb, per_mb)
        else:
            self.ram_ms_per_mb = _smooth(self.ram_ms_per_mb, per_mb)

    def reload_ms(self, tokens: int, where: str) -> float:
        """Bringing back ``tokens`` tokens parked to ``where``: "ram", "disk" or "none" (no
        snapshot: its tokens are prefilled again)."""
        if where == "none":
            return tokens * (self.prefill_ms_per_token() or PREFILL_MS_PER_TOKEN)
        mb = tokens * (self.bytes_per_token or 0.0) / 1e6  # unknown before the first park: 0
        return mb * (self.disk_ms_per_mb if where == "disk" else self.ram_ms_per_mb)


@dataclass(frozen=True, slots=True)
class Price:
    """What parking one session costs: ``reload_ms`` when it returns, expected in
    ``remaining_s`` (None: it is not paused, so it is expected back at once)."""

    reload_ms: float
    remaining_s: float | None

    @property
    def per_second(self) -> float:
        """Reload cost per second of lane it frees (lowest parks first)."""
        if self.remaining_s is None:
            return float("inf")
        return self.reload_ms / max(self.remaining_s, _FLOOR_S)

    @property
    def protected(self) -> bool:
        """Expected back sooner than it could be reloaded: kept resident (its time to live)."""
        return self.remaining_s is not None and self.remaining_s * 1000.0 < self.reload_ms


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * new


__all__ = [
    "PATIENCE_S",
    "PRIOR_PAUSE_S",
    "PauseClock",
    "Price",
    "ReloadCosts",
    "check_pause_hint",
]
