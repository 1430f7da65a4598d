"""Read a GGUF file's header and metadata without loading the model, and check it is whole.

Enough of the format (v2/v3) to list metadata, find ``tokenizer.chat_template``, and compute
where the last tensor's data ends, so a truncated download is caught with a clear message before
llama.cpp is asked to map it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from continuum.errors import ModelFileError

_MAGIC = b"GGUF"
_HINT = (
    "Point --model / CONTINUUM_MODEL at a complete .gguf file, or omit it to use the default model"
)

# ggml type id -> (elements per block, bytes per block)
_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 36),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
}
# gguf value type -> struct format (scalars)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    path: Path
    version: int
    size: int
    metadata: dict[str, Any]
    n_tensors: int
    data_end: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def chat_template(self) -> str | None:
        t = self.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None


class _Reader:
    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f = f
        self.path = path

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ModelFileError(self.path, "is truncated inside its metadata", _HINT)
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.read(struct.calcsize("<" + fmt)))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        if n > 1 << 30:
            raise ModelFileError(self.path, "has a corrupt metadata string length", _HINT)
        return self.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, *, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.unpack("I"), self.unpack("Q")
            if itype in _SCALARS and not keep:  # skip big arrays (token lists) cheaply
                self.f.seek(struct.calcsize("<" + _SCALARS[itype]) * n, 1)
                return n
            items = [self.value(itype, keep=keep) for _ in range(n)]
            return items if keep else n
        raise ModelFileError(self.path, f"has an unknown metadata value type {vtype}", _HINT)


def read_gguf(path: str | Path) -> GGUFInfo:
    """Parse header, metadata and tensor table; raise :class:`ModelFileError` if not whole."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(p, "does not exist", _HINT)
    if not p.is_file():
        raise ModelFileError(p, "is not a regular file", _HINT)
    size = p.stat().st_size
    try:
        with p.open("rb") as f:
            r = _Reader(f, p)
            if f.read(4) != _MAGIC:
                raise ModelFileError(p, "is not a GGUF file (no GGUF magic bytes)", _HINT)
            if size < 24:
                raise ModelFileError(p, "is truncated inside its header", _HINT)
            version = r.unpack("I")
            if version not in (2, 3):
                raise ModelFileError(p, f"has unsupported GGUF version {version}", _HINT)
            n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
            metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = r.string()
                vtype = r.unpack("I")
                big = key.startswith("tokenizer.ggml.")
                metadata[key] = r.value(vtype, keep=not big)
            end = 0
            for _ in range(n_tensors):
                r.string()
                n_dims = r.unpack("I")
                dims = [r.unpack("Q") for _ in range(n_dims)]
                ttype, offset = r.unpack("I"), r.unpack("Q")
                n_el = 1
                for d in dims:
                    n_el *= d
                block, nbytes = _TYPE_SIZES.get(ttype, (1, 0))
                end = max(end, offset + (n_el // block) * nbytes)
            align = metadata.get("general.alignment", 32)
            if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
                raise ModelFileError(p, f"has an invalid general.alignment {align!r}", _HINT)
            data_start = -(-f.tell() // align) * align
    except OSError as e:
        raise ModelFileError(p, f"cannot be read ({e.strerror})", _HINT) from None
    data_end = data_start + end
    if data_end > size:
        raise ModelFileError(
            p, f"is truncated: its tensors need {data_end} bytes but the file has {size}", _HINT
        )
    return GGUFInfo(p, version, size, metadata, n_tensors, data_end)
