"""Stateful conversation sessions on a resident llama.cpp sequence (seed 000)."""
