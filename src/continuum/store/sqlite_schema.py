"""The history log's SQLite schema, as numbered migrations (:mod:`continuum.store.migrations`).

A file from an older release is brought up to date when it is opened; one from a newer release
is refused with nothing in it changed. A new table or column is one more migration at the end,
never an edit of an earlier one: files in the field were written by them.
"""

from __future__ import annotations

from continuum.store.migrations import Migration, latest_version

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    model_digest TEXT NOT NULL,
    chat_format TEXT NOT NULL,
    system TEXT,
    continuity TEXT,
    config TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    position INTEGER NOT NULL,
    body TEXT NOT NULL,
    identity TEXT NOT NULL,
    gen_tokens BLOB,
    gen_model TEXT,
    turn INTEGER NOT NULL,
    created_at REAL NOT NULL,
    superseded_at REAL
);
CREATE INDEX IF NOT EXISTS messages_active ON messages(session_id, superseded_at, position);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    turn INTEGER NOT NULL,
    created_at REAL NOT NULL,
    finish_reason TEXT NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (session_id, turn)
);
CREATE TABLE IF NOT EXISTS resets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    turn INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    tokens_dropped INTEGER NOT NULL,
    tokens_rebuilt INTEGER NOT NULL,
    created_at REAL NOT NULL
);
"""
# The tenant that owns a session, as a column, so an ownership check reads one indexed row.
# Sessions written before it carried the tenant only inside their config JSON.
_TENANT_COLUMN = """
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
UPDATE sessions SET tenant = COALESCE(json_extract(config, '$.tenant'), '');
CREATE INDEX sessions_tenant ON sessions(tenant);
"""
# A compacted session's continuity note (the summary of the messages before ``note_window``).
_NOTE_COLUMNS = """
ALTER TABLE sessions ADD COLUMN note TEXT;
ALTER TABLE sessions ADD COLUMN note_window INTEGER;
"""
# Stored Responses (``previous_response_id``): each row keeps the messages its response added
# to its parent's chain, so a chain of N responses is stored in O(N), not O(N^2). A deleted
# response is a tombstone: GET answers 404, but a child still continues through it.
_RESPONSES = """
CREATE TABLE responses (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    parent TEXT,
    added TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX responses_created ON responses(created_at);
"""
MIGRATIONS = (
    Migration(1, "sessions, messages, turns and resets", _SCHEMA_V1),
    Migration(2, "sessions.tenant column", _TENANT_COLUMN),
    Migration(3, "sessions.note and note_window columns", _NOTE_COLUMNS),
    Migration(4, "responses table", _RESPONSES),
)
SCHEMA_VERSION = latest_version(MIGRATIONS)


__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]
