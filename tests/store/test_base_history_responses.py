"""Stored responses (the Responses API's ``previous_response_id`` chains) on every
:class:`~continuum.store.base.HistoryLog` implementation: SQLite and a real redis-server. A
chain is stored as deltas and read whole, per tenant; a deleted response is a tombstone its
children continue through; retention purges a response and so breaks its descendants."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from continuum.store.base import HistoryLog
from tests.store.test_base_history import KINDS, Impl, opened


@pytest.fixture(params=KINDS)
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    yield from opened(request, tmp_path)


@pytest.fixture
def history(impl: Impl) -> HistoryLog:
    return impl.store


def _said(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_response_chain_is_stored_as_deltas_and_read_whole(impl: Impl) -> None:
    history = impl.store
    history.put_response("t", "r1", None, [_said("a"), _said("b")], {"id": "r1"})
    history.put_response("t", "r2", "r1", [_said("c")], {"id": "r2"})
    history.put_response("t", "r3", "r2", [_said("d")], {"id": "r3"})
    got = history.get_response("t", "r3")
    assert got is not None
    assert got[0] == {"id": "r3"} and [m["content"] for m in got[1]] == ["a", "b", "c", "d"]
    assert impl.added("t", "r3") == [_said("d")]  # each row holds only what it added
    assert history.get_response("other", "r3") is None  # tenants never see each other's


def test_response_chains(history: HistoryLog) -> None:
    said = [{"role": "user", "content": c} for c in "abc"]
    history.put_response("t", "r1", None, said[:2], {"id": "r1"})
    history.put_response("t", "r2", "r1", said[2:], {"id": "r2"})
    got = history.get_response("t", "r2")
    assert got is not None and got[0] == {"id": "r2"} and got[1] == said
    assert history.get_response("other", "r2") is None  # per tenant
    assert history.delete_response("t", "r1") and not history.delete_response("t", "r1")
    assert history.get_response("t", "r1") is None
    assert history.get_response("t", "r2") == got  # continues through the tombstone
    history.put_response("t", "r3", None, said, {"id": "r3"}, retention_s=-1.0)
    assert history.get_response("t", "r3") is None and history.get_response("t", "r2") is None


def test_a_deleted_response_is_gone_but_its_children_continue_through_it(
    history: HistoryLog,
) -> None:
    history.put_response("t", "r1", None, [_said("a")], {"id": "r1"})
    history.put_response("t", "r2", "r1", [_said("b")], {"id": "r2"})
    assert history.delete_response("t", "r1") and not history.delete_response("t", "r1")
    assert history.get_response("t", "r1") is None
    assert history.get_response("t", "r1", deleted_ok=True) is not None
    got = history.get_response("t", "r2")
    assert got is not None and [m["content"] for m in got[1]] == ["a", "b"]
    assert not history.delete_response("t", "nope")
    assert not history.delete_response("other", "r2")  # another tenant's is not ours to delete
    assert history.get_response("t", "r2") == got


def test_a_response_put_again_replaces_the_first(history: HistoryLog) -> None:
    history.put_response("t", "r", None, [_said("a")], {"id": "r", "v": 1})
    assert history.delete_response("t", "r")
    history.put_response("t", "r", None, [_said("b")], {"id": "r", "v": 2})
    assert history.get_response("t", "r") == ({"id": "r", "v": 2}, [_said("b")])


def test_responses_past_their_retention_are_purged_with_their_chain(impl: Impl) -> None:
    history = impl.store
    history.put_response("t", "old", None, [_said("a")], {"id": "old"})
    time.sleep(0.3)  # "old" is now 0.3 s old; "new" is written now, with a 0.1 s retention
    history.put_response("t", "new", "old", [_said("b")], {"id": "new"}, retention_s=0.1)
    assert history.get_response("t", "old") is None and impl.added("t", "old") is None
    assert impl.added("t", "new") == [_said("b")]  # kept itself, but...
    assert history.get_response("t", "new") is None  # an ancestor is gone: it cannot continue
    assert history.get_response("t", "new", deleted_ok=True) is None
