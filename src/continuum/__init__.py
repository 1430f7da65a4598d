"""continuum: stop LLM agents from paying again for work they have already done.

The public API is curated here; everything else is internal and may change.
"""

from __future__ import annotations

import logging

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, resolve_model
from continuum.backends.registry import BackendRegistry, Generation
from continuum.engine import EngineConfig, OpMetrics, OpResult, Session
from continuum.errors import (
    BackendError,
    ChatTemplateError,
    ContextOverflow,
    ContinuumError,
    InvalidMessage,
    InvalidRequest,
    KVCacheFull,
    MetadataError,
    ModelFileError,
    Overloaded,
    SessionBusy,
    SessionClosed,
    SessionError,
    SessionNotFound,
    SnapshotError,
    StoreError,
    UnknownBackend,
    UnknownModel,
)
from continuum.metrics import Reset, ResetReason, TurnMetrics
from continuum.ops import TokenOp, ToolOp
from continuum.params import GenerationParams
from continuum.policy import ReusePolicy
from continuum.stateful.params import TurnResult
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker, WorkerConfig
from continuum.tiers.state import BackendState

__version__ = "0.1.0"

logging.getLogger("continuum").addHandler(logging.NullHandler())

__all__ = [
    "BackendError",
    "BackendRegistry",
    "BackendState",
    "ChatSession",
    "ChatTemplateError",
    "ContextOverflow",
    "ContinuumError",
    "EngineConfig",
    "Generation",
    "GenerationParams",
    "InvalidMessage",
    "InvalidRequest",
    "KVCacheFull",
    "LlamaConfig",
    "MetadataError",
    "ModelFile",
    "ModelFileError",
    "OpMetrics",
    "OpResult",
    "Overloaded",
    "Reset",
    "ResetReason",
    "ReusePolicy",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionNotFound",
    "SnapshotError",
    "StoreError",
    "TokenOp",
    "ToolOp",
    "TurnMetrics",
    "TurnResult",
    "UnknownBackend",
    "UnknownModel",
    "Worker",
    "WorkerConfig",
    "resolve_model",
]
