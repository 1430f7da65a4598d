"""Persistence: the embedded SQLite history store (the authoritative semantic log)."""
