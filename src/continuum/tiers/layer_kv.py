"""The layer KV tier: serialised KV snapshots keyed by the prefix they hold, in RAM and on disk.

A hit restores the state with no prefill; the caller then decodes only the suffix. Snapshots
(format in :mod:`continuum.backends.kv_snapshot`)
live in a RAM tier with a byte budget (LRU) and, when a directory is given, on disk under their
content hash. Every snapshot carries a header — format version, model digest, context config,
namespace, token count, prefix hash and checksums — and :func:`decode_snapshot` refuses anything
corrupt, truncated or incompatible with a :class:`SnapshotError`; the engine then drops the entry
and falls through to a cold call (counted). Nothing read back from disk is unpickled.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from continuum.backends.kv_snapshot import (
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    write_atomic,
)
from continuum.tiers.prefix_kv import PrefixMatch, RadixTrie

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    snapshot_id: str  # content hash of the encoded blob
    n_tokens: int
    nbytes: int


class LayerKVTier:
    """RAM (LRU, byte budget) + optional disk directory, indexed by a radix trie per namespace."""

    name = "layer_kv"

    def __init__(
        self,
        *,
        ram_budget_bytes: int = 256 << 20,
        directory: str | Path | None = None,
        max_entries: int = 4096,
    ) -> None:
        self.ram_budget_bytes = ram_budget_bytes
        self.directory = Path(directory) if directory is not None else None
        self._ram: OrderedDict[str, bytes] = OrderedDict()
        self._ram_bytes = 0
        self.index: RadixTrie[SnapshotRef] = RadixTrie(max_entries, on_evict=self._forget)
        self.disk_errors = 0
        self.corrupt = 0
        self.ram_evictions = 0
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def ram_bytes(self) -> int:
        return self._ram_bytes

    def _path(self, snapshot_id: str) -> Path:
        assert self.directory is not None
        return self.directory / f"{snapshot_id}.ckv"

    def put(self, namespace: str, tokens: Sequence[int], blob: bytes) -> SnapshotRef:
        sid = _b2(blob)
        ref = SnapshotRef(sid, len(tokens), len(blob))
        self._ram_put(sid, blob)
        if self.directory is not None:
            self._write(sid, blob)
        self.index.insert(namespace, tokens, ref)
        return ref

    def _write(self, sid: str, blob: bytes) -> None:
        path = self._path(sid)
        if path.exists():
            return
        try:
            write_atomic(path, blob)
        except OSError as e:  # a full disk must not lose the op or the RAM copy
            self.disk_errors += 1
            log.warning("could not write KV snapshot %s: %s (kept in RAM only)", path, e)

    def _ram_put(self, sid: str, blob: bytes) -> None:
        if sid in self._ram:
            self._ram.move_to_end(sid)
            return
        self._ram[sid] = blob
        self._ram_bytes += len(blob)
        while self._ram_bytes > self.ram_budget_bytes and self._ram:
            _, old = self._ram.popitem(last=False)
            self._ram_bytes -= len(old)
            self.ram_evictions += 1

    def lookup(self, namespace: str, tokens: Sequence[int]) -> PrefixMatch[SnapshotRef] | None:
        return self.index.longest(namespace, tokens)

    def load(self, ref: SnapshotRef) -> tuple[bytes, str] | None:
        """The blob and where it came from (``ram`` or ``disk``), or None if it is gone."""
        blob = self._ram.get(ref.snapshot_id)
        if blob is not None:
            self._ram.move_to_end(ref.snapshot_id)
            return blob, "ram"
        if self.directory is None:
            return None
        try:
            blob = self._path(ref.snapshot_id).read_bytes()
        except OSError:
            return None
        return blob, "disk"

    def drop(self, namespace: str, tokens: Sequence[int], ref: SnapshotRef) -> None:
        """Forget a snapshot found corrupt or incompatible (and delete its file)."""
        self.corrupt += 1
        self.index.remove(namespace, tokens)
        self._forget(namespace, tuple(tokens), ref)
        if self.directory is not None:
            self._path(ref.snapshot_id).unlink(missing_ok=True)

    def _forget(self, namespace: str, tokens: tuple[int, ...], ref: SnapshotRef) -> None:
        blob = self._ram.pop(ref.snapshot_id, None)
        if blob is not None:
            self._ram_bytes -= len(blob)

    def restore_index(self, namespace: str, tokens: Sequence[int], ref: SnapshotRef) -> bool:
        """Re-register a snapshot listed in saved metadata, if its file is still there."""
        if self.directory is None or not self._path(ref.snapshot_id).exists():
            return False
        self.index.insert(namespace, tokens, ref)
        return True

    def disk_bytes(self) -> int:
        if self.directory is None:
            return 0
        return sum(p.stat().st_size for p in self.directory.glob("*.ckv"))


def _b2(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


__all__ = ["LayerKVTier", "Snapshot", "SnapshotRef", "decode_snapshot", "encode_snapshot"]
