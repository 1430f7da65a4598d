"""The snapshot envelope's compatibility check: a snapshot written by another llama.cpp build,
by a continuum that did not record the build, or with other KV cache types is refused before
llama.cpp sees it, with a message that says which (the file and RAM paths alike)."""

from __future__ import annotations

import struct

import pytest

from continuum.errors import SnapshotError
from continuum.store.base import SnapshotEntry
from continuum.store.snapshot_format import (
    ctx_difference,
    decode_snapshot,
    encode_snapshot,
    snapshot_header,
)
from continuum.store.snapshots import FileSnapshotStore

MODEL = "sha256:" + "cd" * 32
HERE = {"llama_build": "llama-cpp-python 0.3.36; llama.cpp 0c1e570", "type_k": "f16",
        "type_v": "f16", "kv_streams": 1}  # fmt: skip
OTHER_BUILD = {**HERE, "llama_build": "llama-cpp-python 0.3.20; llama.cpp 1a2b3c4"}
OLDER = {k: v for k, v in HERE.items() if k != "llama_build"}  # written before builds were kept
OTHER_CACHE = {**HERE, "type_k": "q8_0"}


def snapshot(ctx: dict[str, object]) -> bytes:
    return encode_snapshot(
        namespace="n",
        model=MODEL,
        ctx=ctx,
        tokens=[1, 2, 3],
        payload=b"kv",
        prefix="h",
        key="session:x",
    )


@pytest.mark.parametrize(
    ("ctx", "says"),
    [
        (OTHER_BUILD, ["another llama.cpp build", "1a2b3c4", "0c1e570"]),
        (OLDER, ["another llama.cpp build", "did not record it", "0c1e570"]),
        (OTHER_CACHE, ["context config differs", "type_k 'q8_0', here 'f16'"]),
    ],
)
def test_an_incompatible_snapshot_is_refused_saying_why(
    ctx: dict[str, object], says: list[str]
) -> None:
    with pytest.raises(SnapshotError) as info:
        decode_snapshot(snapshot(ctx), model=MODEL, ctx=HERE)
    assert all(s in str(info.value) for s in says), str(info.value)
    store = FileSnapshotStore()  # a RAM entry is held to the same check
    store.put("k", SnapshotEntry("n", (1, 2, 3), b"kv", MODEL, ctx, "h"))
    with pytest.raises(SnapshotError) as ram:
        store.get("k", model=MODEL, ctx=HERE)
    assert all(s in str(ram.value) for s in says) and "k" not in store


def test_this_builds_snapshot_loads() -> None:
    snap = decode_snapshot(snapshot(HERE), model=MODEL, ctx=HERE)
    assert snap.tokens == (1, 2, 3) and snap.header["ctx"] == HERE


def test_ctx_difference_lists_every_key_that_differs() -> None:
    found = {**HERE, "type_k": "q4_0", "type_v": "q4_0", "extra": 1}
    text = ctx_difference(found, HERE)
    assert "type_k 'q4_0', here 'f16'" in text and "type_v 'q4_0', here 'f16'" in text
    assert "extra 1, here '(none)'" in text and "kv_streams" not in text
    assert "records no context config" in ctx_difference(None, HERE)


def test_the_header_is_read_without_a_worker_or_refused() -> None:
    blob = snapshot(OTHER_BUILD)
    assert snapshot_header(blob)["ctx"] == OTHER_BUILD  # readable, though it would not load
    for bad, says in (
        (b"nope", "bad magic"),
        (blob[:12], "truncated"),
        (blob[:4] + blob[5:], "truncated"),  # a length byte lost: the header "runs" past the end
        (b"CKV1\x02\x00\x00\x00[]", "not a JSON object"),
        (b"CKV1\x03\x00\x00\x00{x}", "not valid JSON"),
    ):
        with pytest.raises(SnapshotError, match=says):
            snapshot_header(bad)


def deeply_nested(depth: int = 100_000) -> bytes:
    """A snapshot whose header is ``[[[[...``: too deep for the JSON parser's recursion."""
    head = b"[" * depth
    return b"CKV1" + struct.pack("<I", len(head)) + head


def test_a_header_nested_too_deep_to_parse_is_a_corrupt_snapshot() -> None:
    for read in (snapshot_header, lambda b: decode_snapshot(b, model=MODEL, ctx=HERE)):
        with pytest.raises(SnapshotError, match="not valid JSON; the file is corrupt"):
            read(deeply_nested())
