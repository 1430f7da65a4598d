"""The wire format of a session bundle: one stored session, moved from one worker to another.

A bundle is self-describing and checksummed. It carries what the history log holds of the
session now — its record (system prompt, continuity, config, chat format, model digest,
tenant, continuity note), its current messages with their identity hashes and the token ids the
model generated, its turns (finish reason, metrics) and resets — and, when one could be taken,
its KV snapshot as a snapshot file (:mod:`continuum.store.snapshot_format`), whose header is
the snapshot's envelope (model digest, llama.cpp build, cache types, context config, tokens,
checksums). Nothing is pickled::

    b"CSB1" | u32 LE header length | header (UTF-8 JSON) | snapshot (kv.bytes bytes) | digest

    digest   blake2b-256 (32 bytes) of every byte before it
    header   {"format": 1, "checksum": "blake2b-256", "exported_at": <unix time>,
              "session":  {"id", "created_at", "model_digest", "chat_format", "system",
                           "continuity", "config", "turns", "tenant",
                           "note": null | {"window", "text"}},
              "messages": [{"message", "identity", "gen_tokens": null | [int], "gen_model"}],
              "turns":    [{"turn": 1.., "finish_reason", "metrics"}],
              "resets":   [{"turn", "reason", "detail", "tokens_dropped", "tokens_rebuilt"}],
              "kv":       null | {"bytes": <snapshot length>, "envelope": <snapshot header>}}

:func:`decode_bundle` checks everything it can without a worker — magic, sizes, the digest,
the format version, every field's type, each message's identity hash against its content, turn
numbering — and raises :class:`~continuum.errors.BundleCorrupt` or
:class:`~continuum.errors.BundleVersion` before anything is written. Whether the session and its
snapshot suit a worker (model, build, context) is the importer's question
(:mod:`continuum.stateful.bundle`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from continuum.errors import BundleCorrupt, BundleVersion, ContinuumError, SnapshotError
from continuum.hashing import message_identity
from continuum.messages import normalize_message
from continuum.store.base import (
    RESET_FIELDS,
    ContinuityNote,
    SessionId,
    SessionRecord,
    StoredMessage,
)
from continuum.store.snapshot_format import snapshot_header

MAGIC = b"CSB1"
FORMAT_VERSION = 1
DIGEST_BYTES = 32
MEDIA_TYPE = "application/vnd.continuum.session-bundle"


@dataclass(frozen=True, slots=True)
class Bundle:
    """One session as a bundle holds it. ``snapshot`` is a whole snapshot file (None: the
    bundle carries no KV, and an importer rebuilds the session from its history)."""

    record: SessionRecord
    messages: tuple[StoredMessage, ...]
    turns: tuple[dict[str, Any], ...]
    resets: tuple[dict[str, Any], ...]
    snapshot: bytes | None = None
    exported_at: float = 0.0


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def encode_bundle(bundle: Bundle) -> bytes:
    """The bytes of ``bundle`` (see the module docstring)."""
    rec, snap = bundle.record, bundle.snapshot
    note = None if rec.note is None else {"window": rec.note.window, "text": rec.note.text}
    header = {
        "format": FORMAT_VERSION,
        "checksum": "blake2b-256",
        "exported_at": bundle.exported_at,
        "session": {
            "id": rec.id,
            "created_at": rec.created_at,
            "model_digest": rec.model_digest,
            "chat_format": rec.chat_format,
            "system": rec.system,
            "continuity": rec.continuity,
            "config": rec.config,
            "turns": rec.turns,
            "tenant": rec.tenant,
            "note": note,
        },
        "messages": [
            {
                "message": m.message,
                "identity": m.identity,
                "gen_model": m.gen_model,
                "gen_tokens": None if m.gen_tokens is None else list(m.gen_tokens),
            }
            for m in bundle.messages
        ],
        "turns": [dict(t) for t in bundle.turns],
        "resets": [dict(r) for r in bundle.resets],
        "kv": None if snap is None else {"bytes": len(snap), "envelope": snapshot_header(snap)},
    }
    head = json.dumps(header, sort_keys=True).encode("utf-8")
    body = MAGIC + struct.pack("<I", len(head)) + head + (snap or b"")
    return body + _digest(body)


def decode_bundle(blob: bytes) -> Bundle:
    """Parse and verify a bundle (see the module docstring); :class:`BundleCorrupt` or
    :class:`BundleVersion` rather than return anything half-checked."""
    if len(blob) < 8 + DIGEST_BYTES or blob[:4] != MAGIC:
        raise BundleCorrupt("it is not a continuum session bundle (no CSB1 magic)")
    (hlen,) = struct.unpack("<I", blob[4:8])
    if 8 + hlen + DIGEST_BYTES > len(blob):
        raise BundleCorrupt(f"it is truncated ({len(blob)} bytes; its header alone says more)")
    body, digest = blob[:-DIGEST_BYTES], blob[-DIGEST_BYTES:]
    if _digest(body) != digest:
        raise BundleCorrupt("its checksum does not match: it was damaged or truncated")
    try:
        header = json.loads(body[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BundleCorrupt("its header is not valid UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise BundleCorrupt("its header is not a JSON object")
    if header.get("format") != FORMAT_VERSION:
        raise BundleVersion(header.get("format"), FORMAT_VERSION)
    snapshot = body[8 + hlen :] or None
    try:
        return _parse(header, snapshot)
    except (KeyError, TypeError, ValueError, ContinuumError) as e:
        if isinstance(e, BundleCorrupt):
            raise
        raise BundleCorrupt(f"its header is malformed ({_why(e)})") from None


def _why(e: BaseException) -> str:
    return f"missing field {e}" if isinstance(e, KeyError) else str(e)


def _parse(h: dict[str, Any], snapshot: bytes | None) -> Bundle:
    s = _obj(h["session"], "session")
    note = s["note"]
    rec = SessionRecord(
        id=SessionId(_text(s["id"], "session.id", empty=False)),
        created_at=float(_num(s["created_at"], "session.created_at")),
        model_digest=_text(s["model_digest"], "session.model_digest", empty=False),
        chat_format=_text(s["chat_format"], "session.chat_format"),
        system=_opt(s["system"], _text, "session.system"),
        continuity=_opt(s["continuity"], _text, "session.continuity"),
        config=_obj(s["config"], "session.config"),
        turns=_count(s["turns"], "session.turns"),
        tenant=_text(s["tenant"], "session.tenant"),
        note=None
        if note is None
        else ContinuityNote(
            _count(_obj(note, "session.note")["window"], "note.window"),
            _text(note["text"], "note.text"),
        ),
    )
    if rec.config.get("tenant", rec.tenant) != rec.tenant:
        raise BundleCorrupt("session.config names another tenant than session.tenant")
    messages = tuple(_message(i, m) for i, m in enumerate(_list(h["messages"], "messages")))
    turns = tuple(_turn(i, t) for i, t in enumerate(_list(h["turns"], "turns")))
    if len(turns) != rec.turns:
        raise BundleCorrupt(f"session.turns is {rec.turns} but it lists {len(turns)} turns")
    resets = tuple(_reset(r, rec.turns) for r in _list(h["resets"], "resets"))
    _check_kv(h["kv"], snapshot)
    exported_at = _num(h["exported_at"], "exported_at")
    return Bundle(rec, messages, turns, resets, snapshot, exported_at)


def _message(i: int, raw: object) -> StoredMessage:
    m = _obj(raw, f"messages[{i}]")
    message = _obj(m["message"], f"messages[{i}].message")
    normalize_message(i, message)  # InvalidMessage: not a message this server would store
    identity = _text(m["identity"], f"messages[{i}].identity")
    if message_identity(message) != identity:
        raise BundleCorrupt(f"message {i}'s identity hash does not match its content")
    gen = m["gen_tokens"]
    if gen is not None and not (
        isinstance(gen, list) and all(_is_int(t) and 0 <= t < 2**31 for t in gen)
    ):
        raise BundleCorrupt(f"messages[{i}].gen_tokens is not a list of token ids")
    return StoredMessage(
        message,
        identity,
        None if gen is None else tuple(gen),
        _opt(m["gen_model"], _text, f"messages[{i}].gen_model"),
    )


def _turn(i: int, raw: object) -> dict[str, Any]:
    t = _obj(raw, f"turns[{i}]")
    if t["turn"] != i + 1 or not _is_int(t["turn"]):
        raise BundleCorrupt(f"turns[{i}] is turn {t['turn']!r}; turns are numbered 1, 2, ...")
    finish = _text(t["finish_reason"], f"turns[{i}].finish_reason")
    return {"turn": i + 1, "finish_reason": finish, "metrics": _obj(t["metrics"], "metrics")}


def _reset(raw: object, turns: int) -> dict[str, Any]:
    r = _obj(raw, "resets[]")
    turn = r["turn"]
    if not _is_int(turn) or not 0 <= turn <= turns:
        raise BundleCorrupt(f"a reset names turn {turn!r}, not one of the session's")
    out: dict[str, Any] = {"turn": turn}
    for name in RESET_FIELDS:
        value = r[name]
        ok = isinstance(value, str) if name in ("reason", "detail") else _is_int(value)
        if not ok:
            raise BundleCorrupt(f"a reset's {name} is {type(value).__name__}")
        out[name] = value
    return out


def _check_kv(kv: object, snapshot: bytes | None) -> None:
    """The header's ``kv`` describes exactly the snapshot bytes that follow it."""
    if kv is None and snapshot is None:
        return
    if kv is None or snapshot is None:
        raise BundleCorrupt("its header and its KV snapshot bytes disagree")
    info = _obj(kv, "kv")
    if info["bytes"] != len(snapshot):
        raise BundleCorrupt(f"kv.bytes is {info['bytes']!r}, the snapshot is {len(snapshot)}")
    try:
        envelope = snapshot_header(snapshot)
    except SnapshotError as e:
        raise BundleCorrupt(f"its KV snapshot is unreadable ({e})") from None
    if info["envelope"] != envelope:
        raise BundleCorrupt("kv.envelope is not the header of the snapshot it carries")


# -- field checks ---------------------------------------------------------------------------------
def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _obj(v: object, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BundleCorrupt(f"{where} is not a JSON object")
    return v


def _list(v: object, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise BundleCorrupt(f"{where} is not a JSON array")
    return v


def _text(v: object, where: str, *, empty: bool = True) -> str:
    if not isinstance(v, str) or (not empty and not v):
        raise BundleCorrupt(f"{where} is not a{'' if empty else ' non-empty'} string")
    return v


def _num(v: object, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise BundleCorrupt(f"{where} is not a number")
    return float(v)


def _count(v: object, where: str) -> int:
    if not _is_int(v) or not isinstance(v, int) or v < 0:
        raise BundleCorrupt(f"{where} is not a count (an integer >= 0)")
    return v


def _opt(v: object, check: Callable[[object, str], str], where: str) -> str | None:
    return None if v is None else check(v, where)


__all__ = ["FORMAT_VERSION", "MAGIC", "MEDIA_TYPE", "Bundle", "decode_bundle", "encode_bundle"]
