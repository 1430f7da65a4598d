"""KV snapshots: the one store that parks sessions and holds layer KV (file format in
:mod:`continuum.store.snapshot_format`).

The store. :class:`FileSnapshotStore` keeps :class:`SnapshotEntry` values by string key:

* RAM: an LRU of entries as the backend gave them (not encoded), within ``ram_budget_bytes``
  (payload bytes + 4 per token). An entry pushed out is written to disk first (write-back,
  counted) when a directory is configured; otherwise it is dropped (the history log is
  authoritative, so a dropped snapshot costs a rebuild, never data).
* Disk: one file per key, ``<blake2b(key)>.ckv``, written atomically (temporary file, fsync,
  rename). After every write, least recently used files are deleted while the directory's
  ``.ckv`` bytes exceed ``disk_budget_bytes`` — never the file just written, unless it alone is
  over the budget (then it is not kept: a disk error, logged). Use order lives in memory, seeded
  from file mtimes at start; a disk read touches the file's mtime so the order survives a
  restart. Stray ``*.tmp`` files of an interrupted write are swept at start.
* A failed write (a full disk) keeps the RAM copy; it is counted and logged, never raised.
* ``get`` checks model and context on every hit; a disk read is decoded and fully verified
  (checksums included). An entry that fails is deleted and :class:`SnapshotError` names its key.
  A RAM hit skips the payload checksum: this process made it.

One store owns its directory; two processes sharing one would each budget it blind.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from continuum.errors import SnapshotError
from continuum.store.base import SnapshotEntry, SnapshotHit, SnapshotStats, SnapshotStore
from continuum.store.snapshot_format import (
    FORMAT_VERSION,
    MAGIC,
    SUFFIX,
    Snapshot,
    ctx_difference,
    decode_entry,
    decode_snapshot,
    encode_entry,
    encode_snapshot,
    file_name,
    write_atomic,
)

log = logging.getLogger(__name__)

_COUNTERS = (
    "ram_evictions", "disk_writes", "disk_evictions", "disk_errors", "tmp_swept", "rejected",
)  # fmt: skip


@dataclass(slots=True)
class _Resident:
    entry: SnapshotEntry
    on_disk: bool  # a file with exactly this entry exists (no write-back needed)


@dataclass(slots=True)
class _DiskFile:
    nbytes: int
    key: str | None  # None until this process learns it (a file found at start)


class FileSnapshotStore:
    """KV snapshots in a RAM LRU with write-back to an optional, budgeted directory.

    Invariants (under ``_lock``):
      * ``_ram`` is in use order, least recent first; ``_ram_bytes`` is the sum of its
        entries' ``nbytes`` and is at most ``ram_budget_bytes`` between calls.
      * ``_disk`` maps file names to the ``.ckv`` files in the directory, least recent first;
        ``_disk_bytes`` is the sum of their sizes and is at most ``disk_budget_bytes``
        between calls.
      * ``_Resident.on_disk`` is True only while the entry's file is in ``_disk``.
    """

    def __init__(
        self,
        *,
        ram_budget_bytes: int = 256 << 20,
        directory: str | Path | None = None,
        disk_budget_bytes: int | None = None,
        on_evict: Callable[[str, SnapshotEntry], None] | None = None,
    ) -> None:
        """``on_evict``, with no directory: called with every entry that leaves RAM (budget
        or :meth:`release_ram`), so a store further out can keep it (write-back)."""
        if ram_budget_bytes < 0 or (disk_budget_bytes is not None and disk_budget_bytes < 0):
            raise ValueError("snapshot budgets are byte counts (>= 0)")
        self.ram_budget_bytes = ram_budget_bytes
        self.disk_budget_bytes = disk_budget_bytes
        self.directory = Path(directory) if directory is not None else None
        self.on_evict = on_evict if self.directory is None else None
        self._lock = threading.RLock()
        self._ram: OrderedDict[str, _Resident] = OrderedDict()
        self._ram_bytes = 0
        self._disk: OrderedDict[str, _DiskFile] = OrderedDict()
        self._disk_bytes = 0
        self._counts = dict.fromkeys(_COUNTERS, 0)  # per instance: SnapshotStats' counters
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._scan(self.directory)

    # -- the public contract --------------------------------------------------------------------
    def put(self, key: str, entry: SnapshotEntry, *, durable: bool = False) -> None:
        """Keep ``entry`` under ``key`` (replacing any older one); ``durable`` also writes its
        file now. A failed write keeps the RAM copy (counted, logged)."""
        with self._lock:
            old = self._ram.get(key)
            if old is not None and (old.entry is entry or old.entry == entry):
                self._ram.move_to_end(key)  # the same state again: its file is still good
                if durable and not old.on_disk and self.directory is not None:
                    old.on_disk = self._write(key, entry)
                return
            self._drop_ram(key)
            self._drop_file(file_name(key))  # an older entry's file must not come back
            resident = _Resident(entry, on_disk=False)
            self._ram[key] = resident
            self._ram_bytes += entry.nbytes
            if durable and self.directory is not None:
                resident.on_disk = self._write(key, entry)
            self._evict_ram()

    def get(self, key: str, *, model: str, ctx: dict[str, Any]) -> SnapshotHit | None:
        """The entry under ``key`` and where it came from; None if there is none.
        :class:`SnapshotError` (naming the key; the entry is deleted) if it is for another model
        or context, or its file is corrupt or truncated."""
        with self._lock:
            resident = self._ram.get(key)
            if resident is not None:
                problem = _mismatch(resident.entry, model, ctx)
                if problem is not None:
                    self._reject(key, problem)
                self._ram.move_to_end(key)
                return SnapshotHit(resident.entry, "ram")
            entry = self._read(key, model, ctx)
            if entry is None:
                return None
            self._ram[key] = _Resident(entry, on_disk=True)
            self._ram_bytes += entry.nbytes
            self._evict_ram()
            return SnapshotHit(entry, "disk")

    def peek(self, key: str) -> SnapshotEntry | None:
        """The RAM entry under ``key``, unchecked and without touching the use order."""
        with self._lock:
            resident = self._ram.get(key)
            return None if resident is None else resident.entry

    def delete(self, key: str) -> bool:
        """Forget ``key`` in RAM and on disk; False if it was in neither."""
        with self._lock:
            return self._drop_ram(key) | self._drop_file(file_name(key))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._lock:
            return key in self._ram or file_name(key) in self._disk

    def flush(self, key: str) -> bool:
        """Write ``key``'s RAM entry to disk if it is not there yet; True if it is on disk."""
        with self._lock:
            resident = self._ram.get(key)
            if resident is None:
                return file_name(key) in self._disk
            if not resident.on_disk and self.directory is not None:
                resident.on_disk = self._write(key, resident.entry)
            return resident.on_disk

    def flush_all(self) -> int:
        """Write every RAM-only entry to disk (at close, say); the number now on disk."""
        with self._lock:
            return sum(self.flush(key) for key in list(self._ram))

    def release_ram(self, key: str | None = None) -> int:
        """Give up the RAM copy of ``key`` (every key: None), writing back what is not on disk
        yet, as the budget would; the next ``get`` reads the file. Returns entries released."""
        with self._lock:
            keys = list(self._ram) if key is None else [key] if key in self._ram else []
            for k in keys:
                resident = self._ram.pop(k)
                self._ram_bytes -= resident.entry.nbytes
                self._write_back(k, resident)
            return len(keys)

    def drop_page_cache(self) -> int:
        """Ask the OS to forget its cached pages of every snapshot file (flushed first;
        ``posix_fadvise(DONTNEED)``), so that the next read comes from the disk itself and
        not from RAM the kernel kept: how a restore "from disk" is measured honestly. Returns
        the files advised; 0 where the OS has no such call."""
        if self.directory is None or not hasattr(os, "posix_fadvise"):
            return 0
        with self._lock:
            names = list(self._disk)
        done = 0
        for name in names:
            try:
                fd = os.open(self.directory / name, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                done += 1
            finally:
                os.close(fd)
        return done

    def keys(self) -> list[str]:
        """Every key held, in RAM or on disk (files found at start are asked for their key)."""
        with self._lock:
            out = list(self._ram)
            seen = set(out)
            for name, info in self._disk.items():
                if info.key is None and self.directory is not None:
                    info.key = _header_key(self.directory / name)
                if info.key is not None and info.key not in seen:
                    out.append(info.key)
            return out

    def stats(self) -> SnapshotStats:
        with self._lock:
            return SnapshotStats(
                ram_bytes=self._ram_bytes,
                ram_entries=len(self._ram),
                disk_bytes=self._disk_bytes,
                disk_files=len(self._disk),
                **self._counts,
            )

    # -- RAM --------------------------------------------------------------------------------------
    def _evict_ram(self) -> None:
        while self._ram_bytes > self.ram_budget_bytes and self._ram:
            key, old = self._ram.popitem(last=False)
            self._ram_bytes -= old.entry.nbytes
            self._counts["ram_evictions"] += 1
            self._write_back(key, old)

    def _write_back(self, key: str, resident: _Resident) -> None:
        """Keep an entry leaving RAM further out; a failure is counted and logged."""
        if resident.on_disk:
            return
        if self.directory is not None:
            self._write(key, resident.entry)
        elif self.on_evict is not None:
            self.on_evict(key, resident.entry)

    def _drop_ram(self, key: str) -> bool:
        old = self._ram.pop(key, None)
        if old is None:
            return False
        self._ram_bytes -= old.entry.nbytes
        return True

    # -- disk -------------------------------------------------------------------------------------
    def _scan(self, directory: Path) -> None:
        """Sweep interrupted writes and seed the use order from mtimes (oldest first)."""
        for tmp in directory.glob("*.tmp"):
            try:
                tmp.unlink()
                self._counts["tmp_swept"] += 1
            except OSError as e:
                log.warning("could not remove stray snapshot temporary file %s: %s", tmp, e)
        found: list[tuple[float, str, int]] = []
        for path in directory.glob(f"*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue  # gone meanwhile
            found.append((st.st_mtime, path.name, st.st_size))
        for _, name, size in sorted(found):
            self._disk[name] = _DiskFile(size, None)
            self._disk_bytes += size
        self._evict_disk(keep=None)

    def _write(self, key: str, entry: SnapshotEntry) -> bool:
        """Write ``entry``'s file and keep the directory in budget; False if it is not kept."""
        assert self.directory is not None
        name = file_name(key)
        path = self.directory / name
        blob = encode_entry(key, entry)
        budget = self.disk_budget_bytes
        if budget is not None and len(blob) > budget:
            self._counts["disk_errors"] += 1
            log.warning(
                "KV snapshot %r is %d bytes, over the whole disk budget of %d; not written",
                key,
                len(blob),
                budget,
            )
            return False
        try:
            write_atomic(path, blob)
        except OSError as e:  # a full disk must not lose the RAM copy or fail the caller
            self._counts["disk_errors"] += 1
            log.warning("could not write KV snapshot %r to %s: %s (kept in RAM)", key, path, e)
            return False
        self._forget_file(name)
        self._disk[name] = _DiskFile(len(blob), key)
        self._disk_bytes += len(blob)
        self._counts["disk_writes"] += 1
        self._evict_disk(keep=name)
        return True

    def _evict_disk(self, keep: str | None) -> None:
        budget = self.disk_budget_bytes
        if budget is None:
            return
        for name in list(self._disk):
            if self._disk_bytes <= budget:
                return
            if name == keep:
                continue
            info = self._disk[name]
            self._drop_file(name)
            self._counts["disk_evictions"] += 1
            log.info(
                "deleted KV snapshot %s (%d bytes) to stay in the disk budget", name, info.nbytes
            )

    def _read(self, key: str, model: str, ctx: dict[str, Any]) -> SnapshotEntry | None:
        if self.directory is None:
            return None
        name = file_name(key)
        path = self.directory / name
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self._forget_file(name)
            return None
        except OSError as e:
            raise SnapshotError(f"KV snapshot {key!r} ({path}) cannot be read: {e}") from None
        try:
            entry = decode_entry(blob, key, model=model, ctx=ctx)
        except SnapshotError as e:
            self._reject(key, str(e))
        if name not in self._disk:  # written since the scan, by someone else
            self._disk[name] = _DiskFile(len(blob), key)
            self._disk_bytes += len(blob)
        self._disk[name].key = key
        self._disk.move_to_end(name)
        with contextlib.suppress(OSError):  # best effort: only the order after a restart
            os.utime(path)  # so the use order outlives this process
        return entry

    def _reject(self, key: str, problem: str) -> NoReturn:
        """Delete everything held under ``key`` and raise the error that names it."""
        self._drop_ram(key)
        self._drop_file(file_name(key))
        self._counts["rejected"] += 1
        raise SnapshotError(f"KV snapshot {key!r} rejected and deleted: {problem}")

    def _drop_file(self, name: str) -> bool:
        """Delete a file and forget it; False if there was none."""
        if self.directory is None:
            return False
        known = self._forget_file(name)
        try:
            (self.directory / name).unlink()
        except FileNotFoundError:
            return known
        except OSError as e:
            log.warning("could not delete KV snapshot %s: %s", name, e)
        return True

    def _forget_file(self, name: str) -> bool:
        info = self._disk.pop(name, None)
        if info is None:
            return False
        self._disk_bytes -= info.nbytes
        if info.key is not None and (resident := self._ram.get(info.key)) is not None:
            resident.on_disk = False
        return True


def _mismatch(entry: SnapshotEntry, model: str, ctx: dict[str, Any]) -> str | None:
    if entry.model != model:
        return f"it is for model {entry.model}, not {model}"
    if entry.ctx != ctx:
        return f"it {ctx_difference(entry.ctx, ctx)}"
    return None


def _header_key(path: Path) -> str | None:
    """The key recorded in a snapshot file's header; None if it has none or is unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8 or head[:4] != MAGIC:
                return None
            header = json.loads(f.read(struct.unpack("<I", head[4:8])[0]))
    except (OSError, ValueError):
        return None
    key = header.get("key") if isinstance(header, dict) else None
    return key if isinstance(key, str) else None


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: FileSnapshotStore) -> SnapshotStore:
        return store


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "FileSnapshotStore",
    "Snapshot",
    "SnapshotEntry",
    "SnapshotHit",
    "SnapshotStats",
    "decode_snapshot",
    "encode_snapshot",
    "file_name",
    "write_atomic",
]
