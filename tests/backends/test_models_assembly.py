"""Assembling a model from its chunks: verified against its SHA-256 (a mismatch is refused and
nothing is kept), with progress on stderr when the caller gives none."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from continuum.backends.models import _assemble
from continuum.errors import ModelFileError


def _chunks(tmp_path: Path) -> tuple[list[Path], str]:
    parts = [bytes([i]) * (3 << 20) for i in range(3)]  # 9 MB in three chunk files
    paths = []
    for i, data in enumerate(parts):
        paths.append(tmp_path / f"part{i}.bin")
        paths[-1].write_bytes(data)
    return paths, hashlib.sha256(b"".join(parts)).hexdigest()


def test_assembly_without_a_callers_progress_reports_lines_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTINUUM_CACHE", str(tmp_path / "cache"))  # its digest is kept there
    chunks, digest = _chunks(tmp_path)
    target = _assemble(tmp_path / "out" / "m.gguf", chunks, digest, "reinstall", None)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == digest
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("assembling m.gguf: ")
    assert lines[-1].startswith("assembling m.gguf: 100% (9 of 9 MB, ")


def test_a_callers_progress_replaces_the_lines_and_a_mismatch_keeps_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunks, _ = _chunks(tmp_path)
    seen: list[tuple[str, int, int]] = []
    target = tmp_path / "out" / "m.gguf"
    with pytest.raises(ModelFileError, match="refused"):
        _assemble(target, chunks, "0" * 64, "reinstall", lambda *a: seen.append(a))
    assert seen[-1] == ("assembling m.gguf", 9 << 20, 9 << 20)
    assert capsys.readouterr().err == ""
    assert not target.exists() and not list(target.parent.glob("*.part"))
