"""The semantic history of stateful sessions, in SQLite (WAL).

This log is authoritative (DESIGN.md §3.1): resident KV is an optimisation that can be dropped
and rebuilt from it at any time. Each turn is committed in one transaction — the messages it
adds, the messages an edit superseded, its metrics and its resets — so the log is consistent
whatever fails. Superseded messages are kept (``superseded_at`` set), never deleted. A session
moved from another store (a session bundle, :meth:`HistoryStore.import_session`) is written
in one transaction too.

Generated assistant messages also store the exact token ids the model produced, with the digest
of the model that produced them, so a reopened session rebuilds the same causal sequence.

Each session row names the tenant that owns it (an indexed column), so an ownership check
reads one row. The schema is a list of numbered migrations (:mod:`continuum.store.sqlite_schema`):
a file from an older release is brought up to date when it is opened, one from a newer release
is refused with nothing in it changed.
"""

from __future__ import annotations

import array
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from continuum.errors import (
    InvalidRequest,
    SessionExists,
    SessionNotFound,
    StoreError,
    TurnConflict,
)
from continuum.messages import Message
from continuum.store.base import (
    RESET_FIELDS,
    ContinuityNote,
    HistoryLog,
    SessionId,
    SessionRecord,
    StoredMessage,
    session_owner,
)
from continuum.store.migrations import migrate
from continuum.store.sqlite_schema import MIGRATIONS


def _pack(tokens: tuple[int, ...] | None) -> bytes | None:
    return None if tokens is None else array.array("i", tokens).tobytes()


def _unpack(blob: bytes | None) -> tuple[int, ...] | None:
    if blob is None:
        return None
    a = array.array("i")
    a.frombytes(blob)
    return tuple(a)


class HistoryStore:
    """One SQLite database of sessions; safe to share between threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            # migrate before switching to WAL: a file from a newer continuum is refused before
            # anything (the journal mode included) is written to it
            migrate(db, MIGRATIONS, path=self.path, what="history")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, OSError, StoreError) as e:
            if db is not None:
                db.close()
            if isinstance(e, StoreError):
                raise
            raise StoreError(
                self.path, f"cannot open ({e}); check the path is a writable SQLite file"
            ) from None
        self._db = db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_session(
        self,
        *,
        model_digest: str,
        chat_format: str,
        system: str | None,
        continuity: str | None,
        config: dict[str, Any],
        session_id: str | None = None,
        tenant: str = "",
    ) -> SessionId:
        """Create a session owned by ``tenant``. The tenant is also kept in ``config`` (as
        sessions were before it had a column); a ``config["tenant"]`` alone is taken as the
        tenant, and one that disagrees with ``tenant`` is refused."""
        tenant, config = session_owner(config, tenant)
        sid = SessionId(session_id or uuid.uuid4().hex)
        with self._lock, self._tx():
            taken = self._db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone()
            if taken is not None:
                raise SessionExists(sid)
            self._db.execute(
                "INSERT INTO sessions (id, created_at, model_digest, chat_format, system,"
                " continuity, config, tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    time.time(),
                    model_digest,
                    chat_format,
                    system,
                    continuity,
                    json.dumps(config, sort_keys=True),
                    tenant,
                ),
            )
        return sid

    def load_session(self, session_id: str) -> SessionRecord:
        with self._lock:
            row = self._db.execute(
                "SELECT id, created_at, model_digest, chat_format, system, continuity, config,"
                " (SELECT COUNT(*) FROM turns WHERE session_id = sessions.id), tenant,"
                " note, note_window FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        return SessionRecord(
            id=SessionId(row[0]),
            created_at=row[1],
            model_digest=row[2],
            chat_format=row[3],
            system=row[4],
            continuity=row[5],
            config=json.loads(row[6]),
            turns=row[7],
            tenant=row[8],
            note=None if row[9] is None else ContinuityNote(int(row[10]), row[9]),
        )

    def session_tenant(self, session_id: str) -> str:
        """The tenant that owns the session (one indexed row: no messages are read);
        :class:`SessionNotFound` if there is none."""
        with self._lock:
            row = self._db.execute(
                "SELECT tenant FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        return str(row[0])

    def count_sessions(self, tenant: str) -> int:
        """How many sessions the tenant has stored (the indexed tenant column)."""
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM sessions WHERE tenant = ?", (tenant,))
            return int(row.fetchone()[0])

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything logged for it; False if there was none."""
        with self._lock, self._tx():
            for table in ("resets", "turns", "messages"):
                self._db.execute(f"DELETE FROM {table} WHERE session_id = ?", (session_id,))
            cur = self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        return cur.rowcount > 0

    def messages(self, session_id: str) -> list[StoredMessage]:
        """The session's current (not superseded) history, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT body, identity, gen_tokens, gen_model FROM messages"
                " WHERE session_id = ? AND superseded_at IS NULL ORDER BY position",
                (session_id,),
            ).fetchall()
        return [StoredMessage(json.loads(b), i, _unpack(t), m) for b, i, t, m in rows]

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT turn, finish_reason, metrics FROM turns WHERE session_id = ? ORDER BY turn",
                (session_id,),
            ).fetchall()
        return [{"turn": t, "finish_reason": f, "metrics": json.loads(m)} for t, f, m in rows]

    def resets(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT turn, {', '.join(RESET_FIELDS)} FROM resets"
                " WHERE session_id = ? ORDER BY id",
                (session_id,),
            ).fetchall()
        keys = ("turn", *RESET_FIELDS)
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def commit_turn(
        self,
        session_id: str,
        *,
        keep: int,
        new: list[StoredMessage],
        finish_reason: str,
        metrics: dict[str, Any],
        system: str | None,
        note: ContinuityNote | None = None,
        expected_turn: int | None = None,
    ) -> int:
        """Atomically: supersede history from position ``keep``, append ``new``, log the turn
        and record the system prompt and continuity note the turn ran with. With
        ``expected_turn`` (the last turn the caller saw), a session another process has
        committed to since is a :class:`TurnConflict` and nothing is written. A ``keep`` past
        the history keeps all of it; an unknown session is :class:`SessionNotFound`."""
        if keep < 0:
            raise InvalidRequest(f"keep must be >= 0, not {keep}")
        now = time.time()
        with self._lock, self._tx():
            if (
                self._db.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
                is None
            ):
                raise SessionNotFound(session_id)
            (active,) = self._db.execute(
                "SELECT COUNT(*) FROM messages WHERE session_id = ? AND superseded_at IS NULL",
                (session_id,),
            ).fetchone()
            keep = min(keep, active)  # positions stay 0..n-1, with no gap
            (turn,) = self._db.execute(
                "SELECT COALESCE(MAX(turn), 0) + 1 FROM turns WHERE session_id = ?", (session_id,)
            ).fetchone()
            if expected_turn is not None and turn - 1 != expected_turn:
                raise TurnConflict(session_id, expected_turn, turn - 1)
            self._db.execute(
                "UPDATE sessions SET system = ?, note = ?, note_window = ? WHERE id = ?",
                (
                    system,
                    None if note is None else note.text,
                    None if note is None else note.window,
                    session_id,
                ),
            )
            self._db.execute(
                "UPDATE messages SET superseded_at = ? WHERE session_id = ?"
                " AND superseded_at IS NULL AND position >= ?",
                (now, session_id, keep),
            )
            self._add_messages(session_id, keep, new, turn, now)
            self._db.execute(
                "INSERT INTO turns VALUES (?, ?, ?, ?, ?)",
                (session_id, turn, now, finish_reason, json.dumps(metrics)),
            )
            resets = [{**r, "turn": turn} for r in metrics.get("resets", [])]
            self._add_resets(session_id, resets, now)
        return int(turn)

    def import_session(
        self,
        record: SessionRecord,
        messages: Sequence[StoredMessage],
        turns: Sequence[dict[str, Any]],
        resets: Sequence[dict[str, Any]],
    ) -> None:
        """Write a session moved from another store in one transaction (nothing on any
        failure; :class:`SessionExists` if the id is taken). Its messages are logged as of turn
        0: a bundle carries the current history, not which turn added each message."""
        tenant, config = session_owner(record.config, record.tenant)
        note = record.note
        text, window = (None, None) if note is None else (note.text, note.window)
        sid, now = record.id, time.time()
        with self._lock, self._tx():
            if self._db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                raise SessionExists(sid)
            self._db.execute(
                "INSERT INTO sessions (id, created_at, model_digest, chat_format, system,"
                " continuity, config, tenant, note, note_window) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    sid,
                    record.created_at,
                    record.model_digest,
                    record.chat_format,
                    record.system,
                    record.continuity,
                    json.dumps(config, sort_keys=True),
                    tenant,
                    text,
                    window,
                ),
            )
            self._add_messages(sid, 0, messages, 0, now)
            rows = [
                (sid, t["turn"], now, t["finish_reason"], json.dumps(t["metrics"])) for t in turns
            ]
            self._db.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?)", rows)
            self._add_resets(sid, resets, now)

    def _add_messages(
        self, sid: str, start: int, msgs: Sequence[StoredMessage], turn: int, now: float
    ) -> None:
        self._db.executemany(
            "INSERT INTO messages (session_id, position, body, identity, gen_tokens,"
            " gen_model, turn, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    sid,
                    start + i,
                    json.dumps(m.message),
                    m.identity,
                    _pack(m.gen_tokens),
                    m.gen_model,
                    turn,
                    now,
                )
                for i, m in enumerate(msgs)
            ],
        )

    def _add_resets(self, sid: str, resets: Sequence[dict[str, Any]], now: float) -> None:
        """Log ``resets``, each with its ``turn``."""
        self._db.executemany(
            "INSERT INTO resets (session_id, turn, reason, detail, tokens_dropped,"
            " tokens_rebuilt, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    sid,
                    r["turn"],
                    r["reason"],
                    r["detail"],
                    r["tokens_dropped"],
                    r["tokens_rebuilt"],
                    now,
                )
                for r in resets
            ],
        )

    # -- stored responses --------------------------------------------------------------------
    def put_response(
        self,
        tenant: str,
        response_id: str,
        parent: str | None,
        added: Sequence[Message],
        body: dict[str, Any],
        *,
        retention_s: float | None = None,
    ) -> None:
        """Store a response: its object and the messages it added to ``parent``'s chain.
        Responses older than ``retention_s`` are purged (their descendants then cannot be
        continued past them)."""
        now = time.time()
        with self._lock, self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO responses (tenant, id, parent, added, body, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (tenant, response_id, parent, json.dumps(list(added)), json.dumps(body), now),
            )
            if retention_s is not None:
                self._db.execute("DELETE FROM responses WHERE created_at < ?", (now - retention_s,))

    def get_response(
        self, tenant: str, response_id: str, *, deleted_ok: bool = False
    ) -> tuple[dict[str, Any], list[Message]] | None:
        """A stored response's object and its whole chain (its ancestors' messages, then its
        own); None if it, or an ancestor, is not stored (or it was deleted, unless
        ``deleted_ok``: a child continuing through it)."""
        parts: list[list[Message]] = []
        body: dict[str, Any] | None = None
        rid: str | None = response_id
        with self._lock:
            while rid is not None:
                row = self._db.execute(
                    "SELECT parent, added, body, deleted FROM responses"
                    " WHERE tenant = ? AND id = ?",
                    (tenant, rid),
                ).fetchone()
                if row is None or (body is None and row[3] and not deleted_ok):
                    return None
                if body is None:
                    body = json.loads(row[2])
                parts.append(json.loads(row[1]))
                rid = row[0]
        assert body is not None
        return body, [m for part in reversed(parts) for m in part]

    def delete_response(self, tenant: str, response_id: str) -> bool:
        """Mark a response deleted (a tombstone its children continue through); False if it
        was not stored, or already deleted."""
        with self._lock, self._tx():
            cur = self._db.execute(
                "UPDATE responses SET deleted = 1 WHERE tenant = ? AND id = ? AND deleted = 0",
                (tenant, response_id),
            )
        return cur.rowcount > 0

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self.path)


class _Transaction:
    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self._path = path

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as e:
                self._db.execute("ROLLBACK")
                raise StoreError(self._path, f"commit failed ({e}); nothing was written") from None
        else:
            self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StoreError(self._path, f"write failed ({exc}); nothing was written") from exc


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: HistoryStore) -> HistoryLog:
        return store


__all__ = [
    "ContinuityNote",
    "HistoryStore",
    "SessionId",
    "SessionRecord",
    "StoredMessage",
]
