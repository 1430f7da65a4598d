"""The on-disk format of a KV snapshot.

File format. A snapshot carries a header — the envelope: format version, model digest,
context config, namespace, token count, prefix hash and checksums — so :func:`decode_snapshot`
can refuse anything corrupt, truncated or incompatible with a :class:`SnapshotError` before
llama.cpp is asked to load it. Nothing is pickled: a JSON header, an int32 token array and
llama.cpp's own state bytes::

    b"CKV1" | u32 header length | header (UTF-8 JSON) | n_tokens x int32 LE | payload

The context config is whatever the backend says a state depends on besides the model
(``context_config()``); for llama.cpp it names the build (``llama_build``: llama-cpp-python
release, llama.cpp commit, compiled-in features), the KV cache types (``type_k``, ``type_v``),
and the cache layout (``swa_full``, ``flash_attn``, ``kv_streams``). It must equal the loading
worker's exactly: a snapshot from another build or cache type is refused, and the session is
rebuilt from its history (``restore_failed``, DESIGN.md §3.3). Snapshots written before the
build was recorded have no ``llama_build`` and are refused the same way.
"""

from __future__ import annotations

import array
import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from continuum.errors import SnapshotError
from continuum.store.base import SnapshotEntry

MAGIC = b"CKV1"
FORMAT_VERSION = 1
SUFFIX = ".ckv"


@dataclass(frozen=True, slots=True)
class Snapshot:
    namespace: str
    tokens: tuple[int, ...]
    payload: bytes
    header: dict[str, Any]


def _b2(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def encode_snapshot(
    *,
    namespace: str,
    model: str,
    ctx: dict[str, Any],
    tokens: Sequence[int],
    payload: bytes,
    prefix: str,
    key: str | None = None,
) -> bytes:
    """The file bytes of a snapshot. ``key`` (the store's key) is recorded in the header when
    given, so a directory can be listed by key; decoding does not need it."""
    tok = array.array("i", tokens).tobytes()
    header = {
        "format": FORMAT_VERSION,
        "model": model,
        "ctx": ctx,
        "namespace": namespace,
        "n_tokens": len(tokens),
        "prefix_hash": prefix,
        "tokens_b2": _b2(tok),
        "payload_bytes": len(payload),
        "payload_b2": _b2(payload),
    }
    if key is not None:
        header["key"] = key
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(head)) + head + tok + payload


def decode_snapshot(
    blob: bytes, *, model: str, ctx: dict[str, Any], verify_payload: bool = True
) -> Snapshot:
    """Parse and verify a snapshot; raise :class:`SnapshotError` rather than load anything
    suspicious. ``verify_payload=False`` skips only the payload checksum (megabytes of KV), for
    blobs this process made and kept in RAM; header, sizes and tokens are always checked."""
    header = snapshot_header(blob)
    (hlen,) = struct.unpack("<I", blob[4:8])
    if header.get("format") != FORMAT_VERSION:
        raise SnapshotError(f"snapshot format {header.get('format')!r} is not {FORMAT_VERSION}")
    if header.get("model") != model:
        raise SnapshotError(f"snapshot is for model {header.get('model')}, not {model}")
    if header.get("ctx") != ctx:
        raise SnapshotError(f"snapshot {ctx_difference(header.get('ctx'), ctx)}")
    n, m = header.get("n_tokens"), header.get("payload_bytes")
    if not isinstance(n, int) or not isinstance(m, int) or n < 0 or m < 0:
        raise SnapshotError("snapshot header has invalid sizes")
    start = 8 + hlen
    if len(blob) != start + 4 * n + m:
        raise SnapshotError(f"snapshot is {len(blob)} bytes, its header says {start + 4 * n + m}")
    tok_bytes, payload = blob[start : start + 4 * n], blob[start + 4 * n :]
    if _b2(tok_bytes) != header.get("tokens_b2") or (
        verify_payload and _b2(payload) != header.get("payload_b2")
    ):
        raise SnapshotError("snapshot checksum mismatch: the file is corrupt")
    tokens = array.array("i")
    tokens.frombytes(tok_bytes)
    return Snapshot(str(header.get("namespace")), tuple(tokens), payload, header)


def encode_entry(key: str, entry: SnapshotEntry) -> bytes:
    """An entry's bytes, its store key recorded in the header."""
    return encode_snapshot(
        namespace=entry.namespace,
        model=entry.model,
        ctx=entry.ctx,
        tokens=entry.tokens,
        payload=entry.payload,
        prefix=entry.prefix_hash,
        key=key,
    )


def decode_entry(blob: bytes, key: str, *, model: str, ctx: dict[str, Any]) -> SnapshotEntry:
    """The entry ``blob`` holds, fully verified; :class:`SnapshotError` if it is not for
    ``model`` and ``ctx``, is corrupt, or was stored under another key."""
    snap = decode_snapshot(blob, model=model, ctx=ctx)
    if snap.header.get("key", key) != key:
        raise SnapshotError(f"it holds key {snap.header.get('key')!r}")
    return SnapshotEntry(
        namespace=snap.namespace,
        tokens=snap.tokens,
        payload=snap.payload,
        model=model,
        ctx=ctx,
        prefix_hash=str(snap.header.get("prefix_hash", "")),
    )


def ctx_difference(found: object, expected: dict[str, Any]) -> str:
    """How a snapshot's context config differs from this worker's, in words ("was written by
    another llama.cpp build (...)", "context config differs: type_k 'q8_0', here 'f16'")."""
    if not isinstance(found, dict):
        return f"records no context config (this worker's is {expected})"
    if found.get("llama_build") != expected.get("llama_build"):
        theirs = found.get("llama_build", "an older continuum that did not record it")
        return (
            f"was written by another llama.cpp build ({theirs}); this worker runs "
            f"{expected.get('llama_build', 'an unrecorded build')}"
        )
    diffs = [
        f"{k} {found.get(k, '(none)')!r}, here {expected.get(k, '(none)')!r}"
        for k in sorted(set(found) | set(expected))
        if found.get(k) != expected.get(k)
    ]
    return "context config differs: " + "; ".join(diffs)


def snapshot_header(blob: bytes) -> dict[str, Any]:
    """A snapshot's header (its envelope), parsed but not checked against any worker;
    :class:`SnapshotError` if there is none to read."""
    if len(blob) < 8 or blob[:4] != MAGIC:
        raise SnapshotError("not a continuum KV snapshot (bad magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    if 8 + hlen > len(blob):
        raise SnapshotError("snapshot truncated inside its header; the file is corrupt")
    try:
        header = json.loads(blob[8 : 8 + hlen])
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep to parse
        raise SnapshotError("snapshot header is not valid JSON; the file is corrupt") from None
    if not isinstance(header, dict):
        raise SnapshotError("snapshot header is not a JSON object; the file is corrupt")
    return header


def write_atomic(path: Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` via a temporary file and a rename (never a torn file).
    Raises OSError (e.g. a full disk) with the temporary file removed."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def file_name(key: str) -> str:
    """The file a key is stored in: a digest, so any key string is a safe file name."""
    return (
        hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest() + SUFFIX
    )
