"""The session bundle's wire format: a round trip keeps every field, the layout is pinned, and
anything truncated, damaged, malformed or from another format version is refused with a typed
error (never a crash, never a half-read bundle)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from continuum.errors import BundleCorrupt, BundleError, BundleVersion
from continuum.hashing import message_identity
from continuum.store.base import ContinuityNote, SessionId, SessionRecord, StoredMessage
from continuum.store.bundle_format import (
    DIGEST_BYTES,
    FORMAT_VERSION,
    MAGIC,
    Bundle,
    decode_bundle,
    encode_bundle,
)
from continuum.store.snapshot_format import encode_snapshot, snapshot_header

MODEL = "sha256:" + "ab" * 32
CTX = {"llama_build": "llama-cpp-python 0.3.36; llama.cpp abc", "type_k": "f16", "type_v": "f16"}


def message(role: str, content: str, gen: tuple[int, ...] | None = None) -> StoredMessage:
    m = {"role": role, "content": content}
    return StoredMessage(m, message_identity(m), gen, MODEL if gen is not None else None)


def bundle(*, kv: bool = True) -> Bundle:
    rec = SessionRecord(
        id=SessionId("s-1"),
        created_at=1700000000.5,
        model_digest=MODEL,
        chat_format="gemma",
        system="Be brief.",
        continuity=None,
        config={"n_ctx": 2048, "tenant": "acme"},
        turns=2,
        tenant="acme",
        note=ContinuityNote(1, "Priya has a dog."),
    )
    msgs = (
        message("user", "My name is Priya."),
        message("assistant", "Hello Priya!", (9, 8, 7)),
        message("user", "I have a dog."),
        message("assistant", "Nice.", (5, 1)),
    )
    turns = (
        {"turn": 1, "finish_reason": "stop", "metrics": {"prompt_tokens_evaluated": 20}},
        {"turn": 2, "finish_reason": "length", "metrics": {"prompt_tokens_evaluated": 7}},
    )
    resets = (
        {"turn": 2, "reason": "evicted", "detail": "x", "tokens_dropped": 0, "tokens_rebuilt": 3},
    )
    snap = encode_snapshot(
        namespace="acme",
        model=MODEL,
        ctx=CTX,
        tokens=[2, 5, 9, 8, 7],
        payload=b"kv" * 50,
        prefix="h",
        key="session:s-1",
    )
    return Bundle(rec, msgs, turns, resets, snap if kv else None, 1700000100.0)


def resign(blob: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """``blob`` with its header changed by ``change`` and a valid digest again: what a careless
    (or hostile) tool could send that the checksum alone would not catch."""
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8 : 8 + hlen])
    change(header)
    head = json.dumps(header).encode()
    body = MAGIC + struct.pack("<I", len(head)) + head + blob[8 + hlen : -DIGEST_BYTES]
    return body + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


@pytest.mark.parametrize("kv", [True, False])
def test_a_round_trip_keeps_every_field(kv: bool) -> None:
    b = bundle(kv=kv)
    assert decode_bundle(encode_bundle(b)) == b


def test_the_layout_is_pinned() -> None:
    b = bundle()
    blob = encode_bundle(b)
    assert blob[:4] == b"CSB1" and FORMAT_VERSION == 1
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8 : 8 + hlen])
    assert set(header) == {
        "format",
        "checksum",
        "exported_at",
        "session",
        "messages",
        "turns",
        "resets",
        "kv",
    }
    assert header["checksum"] == "blake2b-256"
    assert set(header["session"]) == {
        "id",
        "created_at",
        "model_digest",
        "chat_format",
        "system",
        "continuity",
        "config",
        "turns",
        "tenant",
        "note",
    }
    assert header["messages"][1] == {
        "message": {"role": "assistant", "content": "Hello Priya!"},
        "identity": b.messages[1].identity,
        "gen_tokens": [9, 8, 7],
        "gen_model": MODEL,
    }
    assert b.snapshot is not None
    assert header["kv"] == {"bytes": len(b.snapshot), "envelope": snapshot_header(b.snapshot)}
    assert header["kv"]["envelope"]["ctx"] == CTX  # the envelope names the build and cache types
    assert blob[8 + hlen : -DIGEST_BYTES] == b.snapshot
    assert blob[-DIGEST_BYTES:] == hashlib.blake2b(blob[:-DIGEST_BYTES], digest_size=32).digest()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"", "magic"),
        (lambda b: b"CKV1" + b[4:], "magic"),  # a snapshot file is not a bundle
        (lambda b: b[:40], "truncated"),
        (lambda b: b[:-1], "checksum"),
        (lambda b: b[:-200], "checksum"),  # cut inside the KV snapshot
        (lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], "checksum"),  # inside the header
        (lambda b: b[:-40] + bytes([b[-40] ^ 1]) + b[-39:], "checksum"),  # inside the KV
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),  # the digest itself
        (lambda b: b + b"x", "checksum"),
    ],
)
def test_truncated_or_damaged_bytes_are_refused(damage, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BundleCorrupt, match=message):
        decode_bundle(damage(encode_bundle(bundle())))


def test_another_format_version_is_refused_by_name() -> None:
    blob = resign(encode_bundle(bundle()), lambda h: h.update(format=2))
    with pytest.raises(BundleVersion) as info:
        decode_bundle(blob)
    assert info.value.version == 2 and info.value.supported == FORMAT_VERSION
    assert "format 2" in str(info.value) and "reads format 1" in str(info.value)


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(h: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = h
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_set("session.id", ""), "session.id"),
        (_set("session.turns", 3), "lists 2 turns"),
        (_set("session.tenant", "other"), "another tenant"),
        (_set("session.config", []), "session.config"),
        (_set("session.note.window", -1), "note.window"),
        (_set("session.system", 5), "session.system"),
        (_set("session.model_digest", KeyError), "missing field"),
        (_set("messages.0.message.content", "My name is Bob."), "identity hash"),
        (_set("messages.0.message.role", "wizard"), "role"),
        (_set("messages.1.gen_tokens", [1, -2]), "gen_tokens"),
        (_set("messages.1.gen_tokens", "123"), "gen_tokens"),
        (_set("turns.1.turn", 5), "numbered"),
        (_set("turns.0.turn", True), "numbered"),
        (_set("turns.0.metrics", None), "metrics"),
        (_set("resets.0.turn", 9), "names turn"),
        (_set("resets.0.tokens_rebuilt", "3"), "tokens_rebuilt"),
        (_set("kv.bytes", 1), "kv.bytes"),
        (_set("kv.envelope.n_tokens", 99), "envelope"),
        (_set("kv", None), "disagree"),
        (_set("messages", {}), "messages"),
    ],
)
def test_a_malformed_header_is_refused_even_with_a_valid_checksum(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    blob = resign(encode_bundle(bundle()), change)
    with pytest.raises(BundleCorrupt, match=message):
        decode_bundle(blob)


def test_a_header_that_is_not_json_is_refused() -> None:
    head = b"{not json"
    body = MAGIC + struct.pack("<I", len(head)) + head
    with pytest.raises(BundleCorrupt, match="not valid UTF-8 JSON"):
        decode_bundle(body + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest())


def test_a_snapshot_header_nested_too_deep_to_parse_is_a_corrupt_bundle() -> None:
    """``[[[[...`` exhausts the JSON parser's recursion (RecursionError, not ValueError): the
    import must still be refused as corrupt, never crash (a 500 on the server)."""
    head = b"[" * 100_000
    snap = b"CKV1" + struct.pack("<I", len(head)) + head
    good = encode_bundle(bundle())
    (hlen,) = struct.unpack("<I", good[4:8])
    header = json.loads(good[8 : 8 + hlen])
    header["kv"]["bytes"] = len(snap)
    h = json.dumps(header).encode()
    body = MAGIC + struct.pack("<I", len(h)) + h + snap
    with pytest.raises(BundleCorrupt, match="KV snapshot is unreadable"):
        decode_bundle(body + hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest())


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_truncation_or_flipped_byte_is_a_bundle_error(data: st.DataObject) -> None:
    """The oracle: every change to a valid bundle's bytes is refused as a BundleError (the
    digest covers every byte), and never raises anything else."""
    blob = encode_bundle(bundle(kv=data.draw(st.booleans())))
    if data.draw(st.booleans()):
        damaged = blob[: data.draw(st.integers(0, len(blob) - 1))]
    else:
        i = data.draw(st.integers(0, len(blob) - 1))
        damaged = blob[:i] + bytes([blob[i] ^ data.draw(st.integers(1, 255))]) + blob[i + 1 :]
    with pytest.raises(BundleError):
        decode_bundle(damaged)
