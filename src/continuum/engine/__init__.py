"""The engine: one owner of the backend and every tier (DESIGN.md §2)."""

from continuum.engine.core import Engine, EngineConfig
from continuum.engine.session import Session
from continuum.engine.stats import SessionStats

from continuum.engine.compose import EngineSettings, compose  # isort: skip

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineSettings",
    "Session",
    "SessionStats",
    "compose",
]
