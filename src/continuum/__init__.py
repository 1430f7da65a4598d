"""continuum: stop LLM agents from paying again for work they have already done.

The public API is curated here; everything else is internal and may change.
"""

from __future__ import annotations

import logging

from continuum.backends.base import Generation
from continuum.backends.embedders import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.registry import BackendRegistry
from continuum.backends.routing import UpstreamRouting
from continuum.engine import Engine, EngineConfig, Session
from continuum.errors import (
    BackendConfigError,
    BackendError,
    BundleCorrupt,
    BundleError,
    BundleModelMismatch,
    BundleTenantMismatch,
    BundleVersion,
    ChatTemplateError,
    ContextOverflow,
    ContinuumError,
    DecodeAborted,
    Draining,
    EmbeddingError,
    InvalidMessage,
    InvalidRequest,
    KVCacheFull,
    MetadataError,
    MissingExtra,
    ModelFileError,
    Overloaded,
    SessionBusy,
    SessionClosed,
    SessionError,
    SessionExists,
    SessionNotFound,
    SessionQuotaExceeded,
    ShuttingDown,
    SnapshotError,
    StoreError,
    StoreUnavailable,
    TurnConflict,
    UnknownBackend,
    UnknownModel,
)
from continuum.metrics import Metrics, Reset, ResetReason, TierOutcome
from continuum.ops import TokenOp, ToolOp
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.results import ContextItem, Result
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker, WorkerConfig
from continuum.tiers.features import Guard
from continuum.tiers.memory_graph import MemoryGraph
from continuum.tiers.semantic import SemanticTier
from continuum.tiers.state import BackendState
from continuum.tiers.verifier import JudgeVerifier

__version__ = "0.1.0"

logging.getLogger("continuum").addHandler(logging.NullHandler())

__all__ = [
    "BackendConfigError",
    "BackendError",
    "BackendRegistry",
    "BackendState",
    "BundleCorrupt",
    "BundleError",
    "BundleModelMismatch",
    "BundleTenantMismatch",
    "BundleVersion",
    "ChatSession",
    "ChatTemplateError",
    "ContextItem",
    "ContextOverflow",
    "ContinuumError",
    "DecodeAborted",
    "Draining",
    "Embedder",
    "EmbeddingError",
    "Engine",
    "EngineConfig",
    "Generation",
    "GenerationParams",
    "Guard",
    "InvalidMessage",
    "InvalidRequest",
    "JudgeVerifier",
    "KVCacheFull",
    "LlamaConfig",
    "MemoryGraph",
    "MetadataError",
    "Metrics",
    "MissingExtra",
    "ModelFile",
    "ModelFileError",
    "OpenAIEmbedder",
    "Overloaded",
    "Reset",
    "ResetReason",
    "Result",
    "ReusePolicy",
    "SemanticTier",
    "SentenceTransformerEmbedder",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionExists",
    "SessionNotFound",
    "SessionQuotaExceeded",
    "ShuttingDown",
    "SnapshotError",
    "StoreError",
    "StoreUnavailable",
    "TierOutcome",
    "TokenOp",
    "ToolOp",
    "TurnConflict",
    "UnknownBackend",
    "UnknownModel",
    "UpstreamRouting",
    "Worker",
    "WorkerConfig",
    "resolve_model",
]
