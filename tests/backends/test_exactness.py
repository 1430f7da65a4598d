"""The exactness rules as arithmetic: which tokens of a sequence are exact after each kind of
decode, cut, copy and restore, and how much of a prompt may be reused (the rules themselves are
measured on the real model in test_llamacpp_exactness.py)."""

from __future__ import annotations

import pytest

from continuum.backends.base import MIN_BATCH
from continuum.backends.exactness import ExactLedger, exact_reuse
from continuum.engine import EngineConfig
from continuum.errors import InvalidRequest
from continuum.stateful.worker import WorkerConfig


@pytest.mark.parametrize(
    ("exact", "n_prompt", "reuse"),
    [(100, 200, 100), (200, 200, 192), (195, 200, 192), (0, 200, 0), (50, 7, 0), (8, 16, 8)],
)
def test_reuse_stops_at_the_exact_end_and_leaves_a_whole_batch(
    exact: int, n_prompt: int, reuse: int
) -> None:
    assert exact_reuse(exact, n_prompt) == reuse
    assert n_prompt - reuse >= MIN_BATCH or reuse == 0


def test_whole_batches_after_an_exact_prefix_are_exact() -> None:
    ledger = ExactLedger(streams=True)
    ledger.decoded(0, 0, 100, 100)
    ledger.decoded(0, 100, 8, 8)
    assert ledger.exact(0) == 108


def test_a_reply_stops_the_exact_prefix_until_it_is_cut_away() -> None:
    ledger = ExactLedger(streams=True)
    ledger.decoded(0, 0, 50, 50)
    for n in range(50, 60):  # a reply: one token per call
        ledger.decoded(0, n, 1, 1)
    ledger.decoded(0, 60, 30, 30)  # whole batches, but after the reply
    assert ledger.exact(0) == 50
    ledger.cut(0, 40)
    ledger.decoded(0, 40, 50, 50)
    assert ledger.exact(0) == 90


def test_a_tokens_rows_count_the_whole_call() -> None:
    """In a batch step a one-token item shares the call: 8 rows or more in all is the
    batched kernels (the passes keep small items in calls of their own)."""
    ledger = ExactLedger(streams=True)
    ledger.decoded(1, 0, 3, 12)
    ledger.decoded(2, 0, 3, 5)
    assert (ledger.exact(1), ledger.exact(2)) == (3, 0)


def test_copies_and_restores_carry_what_is_known() -> None:
    ledger = ExactLedger(streams=True)
    ledger.decoded(0, 0, 100, 100)
    ledger.copied(0, 1, 60)
    ledger.copied(0, 2, 300)
    ledger.restored(3, 40)
    assert [ledger.exact(s) for s in range(4)] == [100, 60, 100, 40]


def test_nothing_is_exact_in_a_unified_cache() -> None:
    ledger = ExactLedger(streams=False)
    ledger.decoded(0, 0, 100, 100)
    ledger.copied(0, 1, 50)
    ledger.restored(2, 40)
    assert [ledger.exact(s) for s in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_exact_settings_that_are_not_a_bool_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="exact must be True or False"):
        EngineConfig(exact=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="exact must be True or False"):
        WorkerConfig(exact=bad)  # type: ignore[arg-type]


def test_an_exact_engine_refuses_a_suffix_under_a_whole_batch() -> None:
    with pytest.raises(InvalidRequest, match="min_suffix >= 8"):
        EngineConfig(exact=True, min_suffix=4)
    assert EngineConfig(min_suffix=4).min_suffix == 4  # without exact: the caller's choice
