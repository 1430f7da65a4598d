"""The names seed 003's snippet imports: ``from continuum._native import ReusePolicy, Session,
BackendRegistry``. The same objects as ``continuum``'s public API."""

from continuum.backends.registry import BackendRegistry
from continuum.engine import Session
from continuum.policy import ReusePolicy

__all__ = ["BackendRegistry", "ReusePolicy", "Session"]
