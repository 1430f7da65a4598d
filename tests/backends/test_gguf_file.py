"""Model files: the default model's identity, and a clear ModelFileError for every bad file."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from continuum.backends.gguf_file import read_gguf
from continuum.backends.models import ModelFile, cache_dir, resolve_model
from continuum.errors import ModelFileError

DEFAULT_DIGEST = "sha256:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
WHAT_TO_DO = "Point --model / CONTINUUM_MODEL at a complete .gguf file"


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private digest cache. Only for tests that resolve explicit paths: the default alias
    would re-assemble its 250 MB GGUF into an empty cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CONTINUUM_CACHE", str(cache))
    monkeypatch.delenv("CONTINUUM_MODEL", raising=False)
    return cache


@pytest.fixture(scope="module")
def default_model() -> ModelFile:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CONTINUUM_MODEL", raising=False)
        return resolve_model()


def _gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_tiny_gguf(path: Path, name: str, *extra_kv: bytes) -> None:
    """A whole GGUF v3 file with two string metadata entries (plus ``extra_kv``), no tensors."""
    kv = b"".join(
        _gguf_string(k) + struct.pack("<I", 8) + _gguf_string(v)
        for k, v in (("general.architecture", "tiny"), ("general.name", name))
    )
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2 + len(extra_kv)) + kv + b"".join(extra_kv)
    path.write_bytes(body + b"\0" * (-len(body) % 32))  # tensor data starts aligned


def copy_prefix(src: Path, dst: Path, n_bytes: int) -> None:
    with src.open("rb") as fin, dst.open("wb") as fout:
        remaining = n_bytes
        while remaining:
            block = fin.read(min(remaining, 1 << 20))
            assert block, "source shorter than requested prefix"
            fout.write(block)
            remaining -= len(block)


def assert_clear_error(err: ModelFileError, path: Path, problem: str) -> None:
    message = str(err)
    assert err.path == str(path)
    assert str(path) in message
    assert problem in err.problem
    assert WHAT_TO_DO in message
    assert "\n" not in message


# -- the default model ----------------------------------------------------------------------
def test_default_model_resolves(default_model: ModelFile) -> None:
    assert isinstance(default_model, ModelFile)
    assert default_model.path.is_file()
    assert default_model.digest == DEFAULT_DIGEST
    assert default_model.info.architecture == "gemma3"
    assert default_model.info.chat_template is None
    assert default_model.info.version in (2, 3)
    assert default_model.info.n_tensors > 0
    assert default_model.info.size == default_model.path.stat().st_size
    assert default_model.info.data_end <= default_model.info.size


def test_default_alias_is_the_default(default_model: ModelFile) -> None:
    assert resolve_model("gemma3-270m").path == default_model.path


def test_smollm_alias_has_its_own_template(tmp_cache: Path) -> None:
    mf = resolve_model("smollm2-135m")
    assert mf.info.architecture == "llama"
    assert mf.info.chat_template is not None
    assert "<|im_start|>" in mf.info.chat_template
    assert mf.digest.startswith("sha256:") and mf.digest != DEFAULT_DIGEST


def test_continuum_model_env_is_honoured(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smollm = resolve_model("smollm2-135m")
    monkeypatch.setenv("CONTINUUM_MODEL", str(smollm.path))
    chosen = resolve_model(None)
    assert chosen.path == smollm.path
    assert chosen.digest == smollm.digest
    assert chosen.info.architecture == "llama"


# -- digests ----------------------------------------------------------------------------------
def test_digest_is_sha256_and_cached_under_continuum_cache(tmp_cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, "one")
    mf = resolve_model(model)
    assert cache_dir() == tmp_cache
    assert mf.digest == "sha256:" + hashlib.sha256(model.read_bytes()).hexdigest()
    assert mf.name == "one"
    cached = json.loads((tmp_cache / "digests.json").read_text())
    assert mf.digest.removeprefix("sha256:") in cached.values()


def test_replaced_file_gets_a_fresh_digest(tmp_cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    write_tiny_gguf(model, "one")
    first = resolve_model(model).digest
    replacement = tmp_path / "next.gguf"
    write_tiny_gguf(replacement, "two")
    os.replace(replacement, model)
    second = resolve_model(model)
    assert second.digest == "sha256:" + hashlib.sha256(model.read_bytes()).hexdigest()
    assert second.digest != first
    assert second.name == "two"


# -- bad files ------------------------------------------------------------------------------
def test_missing_file(tmp_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileError) as info:
        resolve_model(path)
    assert_clear_error(info.value, path, "does not exist")


def test_directory(tmp_cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "a-dir.gguf"
    path.mkdir()
    with pytest.raises(ModelFileError) as info:
        resolve_model(path)
    assert_clear_error(info.value, path, "is not a regular file")


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"hello, I am not a model\n" * 10, id="text"),
        pytest.param(b"GGU", id="short"),
    ],
)
def test_not_gguf(tmp_cache: Path, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError) as info:
        resolve_model(path)
    assert_clear_error(info.value, path, "is not a GGUF file")


def test_bad_version(tmp_path: Path) -> None:
    path = tmp_path / "v99.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 99, 0, 0) + b"\0" * 32)
    with pytest.raises(ModelFileError) as info:
        read_gguf(path)
    assert_clear_error(info.value, path, "unsupported GGUF version 99")


def test_tiny_gguf_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "one")
    info = read_gguf(path)
    assert (info.version, info.n_tensors, info.architecture) == (3, 0, "tiny")
    assert info.metadata["general.name"] == "one"


@pytest.mark.parametrize(
    "alignment",
    [
        pytest.param(struct.pack("<I", 4) + struct.pack("<I", 0), id="zero"),
        pytest.param(struct.pack("<I", 8) + _gguf_string("abc"), id="string"),
    ],
)
def test_corrupt_alignment(tmp_path: Path, alignment: bytes) -> None:
    path = tmp_path / "aligned.gguf"
    write_tiny_gguf(path, "one", _gguf_string("general.alignment") + alignment)
    with pytest.raises(ModelFileError) as info:
        read_gguf(path)
    assert_clear_error(info.value, path, "alignment")


def test_truncated_model(default_model: ModelFile, tmp_path: Path) -> None:
    path = tmp_path / "truncated.gguf"
    copy_prefix(default_model.path, path, 40 * 1024 * 1024)
    with pytest.raises(ModelFileError) as info:
        read_gguf(path)
    assert_clear_error(info.value, path, "is truncated")
    assert str(40 * 1024 * 1024) in str(info.value)  # says how big the file is


def test_truncated_inside_metadata(default_model: ModelFile, tmp_path: Path) -> None:
    path = tmp_path / "head.gguf"
    copy_prefix(default_model.path, path, 1000)
    with pytest.raises(ModelFileError) as info:
        read_gguf(path)
    assert_clear_error(info.value, path, "truncated inside its metadata")


def test_truncated_copy_of_smollm(tmp_cache: Path, tmp_path: Path) -> None:
    src = resolve_model("smollm2-135m").path
    path = tmp_path / "smollm-part.gguf"
    copy_prefix(src, path, src.stat().st_size - 1)
    with pytest.raises(ModelFileError) as info:
        resolve_model(path)
    assert_clear_error(info.value, path, "is truncated")
