"""Backends: model files, chat formats and the in-process llama.cpp backend.

A backend knows nothing of tiers or sessions (DESIGN.md §2).
"""
