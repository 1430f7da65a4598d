"""The engine: one owner of the backend and every tier (DESIGN.md §2)."""

from continuum.engine.core import Engine, EngineConfig
from continuum.engine.results import OpMetrics, OpResult, SessionStats
from continuum.engine.session import Session

__all__ = ["Engine", "EngineConfig", "OpMetrics", "OpResult", "Session", "SessionStats"]
