"""``BackendState``: a handle to KV state, bound to the exact canonical prefix it holds.

A handle carries the prefix it was derived from — its length and chained hash — and the
namespace and model it belongs to. The engine uses it only for a token prefix whose hash it
re-derives and compares (DESIGN.md §3.5); any mismatch means the handle is not used.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from continuum.hashing import digest


def prefix_hash(namespace: str, tokens: Sequence[int]) -> str:
    """Chained block hash of a token prefix (vLLM-style, 64-token blocks, namespace folded in).
    Equal prefixes give equal hashes in every process."""
    h = digest(namespace.encode(), person=b"cont-prefix")
    for start in range(0, len(tokens), 64):
        block = ",".join(map(str, tokens[start : start + 64])).encode()
        h = digest(h.encode() + b"|" + block, person=b"cont-prefix")
    return h


class StateKind(enum.Enum):
    LIVE = "live"  # a sequence in the backend's context
    SNAPSHOT = "snapshot"  # serialised KV in RAM or on disk (layer KV)


@dataclass(frozen=True, slots=True)
class BackendState:
    kind: StateKind
    namespace: str
    model: str
    n_tokens: int
    prefix_hash: str
    seq_id: int = -1  # LIVE: the sequence holding the KV
    snapshot: str = ""  # SNAPSHOT: the layer-KV snapshot id (content hash)

    def aligned_with(self, namespace: str, model: str, tokens: Sequence[int]) -> bool:
        """True only if this handle holds exactly ``tokens`` for this namespace and model."""
        return (
            namespace == self.namespace
            and model == self.model
            and len(tokens) == self.n_tokens
            and prefix_hash(namespace, tokens) == self.prefix_hash
        )
