"""continuum: stop LLM agents from paying again for work they have already done.

The public API is curated here; everything else is internal and may change.
"""

from __future__ import annotations

import logging

from continuum.backends.llamacpp import LlamaConfig
from continuum.backends.models import ModelFile, resolve_model
from continuum.errors import (
    BackendError,
    ChatTemplateError,
    ContextOverflow,
    ContinuumError,
    InvalidMessage,
    InvalidRequest,
    ModelFileError,
    SessionBusy,
    SessionClosed,
    SessionError,
    SessionNotFound,
    StoreError,
)
from continuum.metrics import Reset, ResetReason, TurnMetrics
from continuum.stateful.params import GenerationParams, TurnResult
from continuum.stateful.session import ChatSession
from continuum.stateful.worker import Worker, WorkerConfig

__version__ = "0.1.0"

logging.getLogger("continuum").addHandler(logging.NullHandler())

__all__ = [
    "BackendError",
    "ChatSession",
    "ChatTemplateError",
    "ContextOverflow",
    "ContinuumError",
    "GenerationParams",
    "InvalidMessage",
    "InvalidRequest",
    "LlamaConfig",
    "ModelFile",
    "ModelFileError",
    "Reset",
    "ResetReason",
    "SessionBusy",
    "SessionClosed",
    "SessionError",
    "SessionNotFound",
    "StoreError",
    "TurnMetrics",
    "TurnResult",
    "Worker",
    "WorkerConfig",
    "resolve_model",
]
