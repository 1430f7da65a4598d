"""Stateless ops in the sessions' lanes: one context, one step loop for every request.

An engine whose context is laid out in lanes (``WorkerConfig.parallel`` > 1 on the in-process
backend) has no sequences of its own for ops: :func:`lend` gives each op a lane for its
duration, the way llama-server gives a request a slot. The op's prompt and reply then ride in
the batch scheduler's steps beside the sessions' decodes — a long stateless prefill shares the
steps instead of stopping every session — and what it leaves in the lane stays there, the
tenant's, for the next op or session of that tenant to start from (a prefix KV candidate, or a
source a new session borrows from) until the lane is needed.

Which lane: a free one (no session), the one whose leftovers of the tenant share most with the
op's prompt first; else the least recently used session no turn holds is parked (its KV to a
snapshot, as any swap). While every lane is held the op waits, as a session turn does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from continuum.errors import SessionClosed
from continuum.stateful.kv_space import Allocation, Lane, LaneRequest, OpHold
from continuum.stateful.park_price import PATIENCE_S
from continuum.stateful.plan import common_prefix

if TYPE_CHECKING:
    from continuum.stateful.worker import Worker


@contextmanager
def lend(
    worker: Worker,
    tenant: str,
    tokens: Sequence[int],
    spill: Callable[[Lane], None] | None = None,
) -> Iterator[Lane]:
    """Hold a lane of ``worker`` for a stateless op of ``tenant`` whose prompt is ``tokens``
    (takes the worker's guard; waits while every lane is held). The lane holds only the
    tenant's tokens when it is handed over — another tenant's leftovers are cleared first —
    is the tenant's leftovers afterwards (``Lane.exact``, how many of its tokens a cold prefill
    would have decoded alike, is for the caller to set once the op is done; an op that fails
    leaves none). ``spill`` keeps leftovers the op would drop (another tenant's, or the part
    past what this op shares with them) before they go: a snapshot in layer KV."""
    found: list[Allocation] = []
    t0 = time.monotonic()

    def ready() -> bool:
        if not worker.is_open:
            raise SessionClosed("worker")
        want = LaneRequest(tenant, tokens, waited_s=time.monotonic() - t0)
        got = worker.residency.space.allocate(want)
        found[:] = [got] if got is not None else []
        return bool(found)

    with worker.guard:
        worker.guard.wait_for(ready, recheck_s=PATIENCE_S / 4)
        got = found[0]
        lane = got.lane
        lane.holder = OpHold()
        try:
            shared = common_prefix(lane.seq.tokens, list(tokens)) if lane.left_by == tenant else 0
            if spill is not None and lane.session is None and lane.exact > shared:
                spill(lane)
            if got.moves or lane.left_by != tenant:
                worker.residency.evict(lane)  # parks its session; clears others' leftovers
                lane.left_by = tenant
            lane.seq.tenant = tenant
            lane.seq.started = t0  # a stateless op is a program of its own
            yield lane
        except BaseException:
            lane.exact = 0  # what the lane holds now is not known to be a cold prefill's
            raise
        finally:
            lane.holder = None
            lane.used = time.monotonic()
            worker.guard.notify()
