"""The semantic history of stateful sessions, in Redis: the :class:`HistoryLog` a fleet shares.

The same contract as :class:`~continuum.store.sqlite.HistoryStore` (DESIGN.md §3.1): the log is
authoritative, each turn is committed whole or not at all, superseded messages are kept (in
their own list, stamped with the time), and generated messages keep their token ids. Any worker
of a fleet can reopen any session from it.

Layout, under the target's prefix ``P`` (one key per list, the session id in ``{}`` so a
session's keys share a Cluster hash slot)::

    P:session:{id}       hash   created_at model_digest chat_format system continuity config
                                tenant note turns      (system/continuity/note as JSON)
    P:messages:{id}      list   the current history, one JSON record per message, in order
    P:superseded:{id}    list   "<unix time> <record>" for every message an edit replaced
    P:turns:{id}         list   {"finish_reason", "metrics"} per turn (turn n at index n-1)
    P:resets:{id}        list   "<turn> <reset JSON>"
    P:tenant:<tenant>    set    the tenant's session ids (count_sessions)
    P:response:<member>  hash   parent added body created_at deleted     (Responses API)
    P:responses          zset   members scored by created_at (retention)

A turn is one Lua script: it checks the session exists and, with ``expected_turn``, that no
other worker committed since (compare-and-swap on the turn count), then supersedes, appends and
logs in one step. Redis runs a script atomically, and with AOF (``appendfsync always``) a
script's writes are on disk before the reply.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from continuum.errors import InvalidRequest, SessionExists, SessionNotFound, TurnConflict
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
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_schema import ready

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'created_at', ARGV[2], 'model_digest', ARGV[3],
  'chat_format', ARGV[4], 'system', ARGV[5], 'continuity', ARGV[6], 'config', ARGV[7],
  'tenant', ARGV[8], 'note', 'null', 'turns', 0)
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""
# KEYS: session messages superseded turns resets
# ARGV: expected keep now system note turn_record n_new messages... resets...
_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2, 0} end
local turns = tonumber(redis.call('HGET', KEYS[1], 'turns'))
local expected = tonumber(ARGV[1])
if expected >= 0 and expected ~= turns then return {-1, turns} end
local turn = turns + 1
local keep = tonumber(ARGV[2])
local n = redis.call('LLEN', KEYS[2])
if keep < n then
  for _, v in ipairs(redis.call('LRANGE', KEYS[2], keep, -1)) do
    redis.call('RPUSH', KEYS[3], ARGV[3] .. ' ' .. v)
  end
  if keep == 0 then redis.call('DEL', KEYS[2]) else redis.call('LTRIM', KEYS[2], 0, keep - 1) end
end
local n_new = tonumber(ARGV[7])
for i = 8, 7 + n_new do redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = 8 + n_new, #ARGV do redis.call('RPUSH', KEYS[5], turn .. ' ' .. ARGV[i]) end
redis.call('RPUSH', KEYS[4], ARGV[6])
redis.call('HSET', KEYS[1], 'turns', turn, 'system', ARGV[4], 'note', ARGV[5])
return {turn, turns}
"""
# KEYS: session messages superseded turns resets tenant-set
# ARGV: id created_at model_digest chat_format system continuity config tenant note n_turns
#       n_messages messages... turns... resets...
_IMPORT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'created_at', ARGV[2], 'model_digest', ARGV[3],
  'chat_format', ARGV[4], 'system', ARGV[5], 'continuity', ARGV[6], 'config', ARGV[7],
  'tenant', ARGV[8], 'note', ARGV[9], 'turns', ARGV[10])
local n_turns, n_msgs = tonumber(ARGV[10]), tonumber(ARGV[11])
for i = 12, 11 + n_msgs do redis.call('RPUSH', KEYS[2], ARGV[i]) end
for i = 12 + n_msgs, 11 + n_msgs + n_turns do redis.call('RPUSH', KEYS[4], ARGV[i]) end
for i = 12 + n_msgs + n_turns, #ARGV do redis.call('RPUSH', KEYS[5], ARGV[i]) end
redis.call('SADD', KEYS[6], ARGV[1])
return 1
"""
# KEYS: session messages superseded turns resets; ARGV: id, tenant key prefix
_DELETE = """
local tenant = redis.call('HGET', KEYS[1], 'tenant')
if not tenant then return 0 end
redis.call('SREM', ARGV[2] .. tenant, ARGV[1])
redis.call('DEL', unpack(KEYS))
return 1
"""
# KEYS: response, responses; ARGV: member parent added body now cutoff response-key-prefix
_PUT_RESPONSE = """
redis.call('HSET', KEYS[1], 'parent', ARGV[2], 'added', ARGV[3], 'body', ARGV[4],
  'created_at', ARGV[5], 'deleted', 0)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
if ARGV[6] ~= '' then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[6])) do
    redis.call('DEL', ARGV[7] .. m)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[6])
end
"""
_DELETE_RESPONSE = """
if redis.call('HGET', KEYS[1], 'deleted') ~= '0' then return 0 end
redis.call('HSET', KEYS[1], 'deleted', 1)
return 1
"""
_SESSION_FIELDS = (
    "created_at", "model_digest", "chat_format", "system", "continuity", "config", "tenant",
    "note", "turns",
)  # fmt: skip


def _record(m: StoredMessage) -> str:
    gen = None if m.gen_tokens is None else list(m.gen_tokens)
    return json.dumps(
        {"message": m.message, "identity": m.identity, "gen_tokens": gen, "gen_model": m.gen_model}
    )


def _stored(raw: bytes) -> StoredMessage:
    r = json.loads(raw)
    gen = r["gen_tokens"]
    return StoredMessage(
        r["message"], r["identity"], None if gen is None else tuple(gen), r["gen_model"]
    )


class RedisHistoryStore:
    """The history log in one Redis (a :class:`RedisTarget`); safe to share between threads
    and between processes."""

    def __init__(self, target: RedisTarget | str, *, owns_target: bool | None = None) -> None:
        self.target = target if isinstance(target, RedisTarget) else RedisTarget(target)
        self._owns = not isinstance(target, RedisTarget) if owns_target is None else owns_target
        self.path = self.target.url  # what errors name (a SQLite store names its file)
        try:
            ready(self.target)
        except BaseException:
            if self._owns:
                self.target.close()
            raise

    def close(self) -> None:
        if self._owns:
            self.target.close()

    def __enter__(self) -> RedisHistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _keys(self, sid: str) -> list[str]:
        k = self.target.key
        return [
            k(what, "{" + sid + "}")
            for what in ("session", "messages", "superseded", "turns", "resets")
        ]

    # -- sessions -------------------------------------------------------------------------------
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
        """As :meth:`HistoryStore.create_session <continuum.store.sqlite.HistoryStore>`."""
        tenant, config = session_owner(config, tenant)
        sid = SessionId(session_id or uuid.uuid4().hex)
        created = self.target.run(
            "create",
            _CREATE,
            [self._keys(sid)[0], self.target.key("tenant", tenant)],
            [
                sid,
                repr(time.time()),
                model_digest,
                chat_format,
                json.dumps(system),
                json.dumps(continuity),
                json.dumps(config, sort_keys=True),
                tenant,
            ],
        )
        if not created:
            raise SessionExists(sid)
        return sid

    def load_session(self, session_id: str) -> SessionRecord:
        values = self.target.call(
            self.target.client.hmget, self._keys(session_id)[0], _SESSION_FIELDS
        )
        if values[0] is None:
            raise SessionNotFound(session_id)
        row = dict(zip(_SESSION_FIELDS, values, strict=True))
        note = json.loads(row["note"])
        return SessionRecord(
            id=SessionId(session_id),
            created_at=float(row["created_at"]),
            model_digest=row["model_digest"].decode(),
            chat_format=row["chat_format"].decode(),
            system=json.loads(row["system"]),
            continuity=json.loads(row["continuity"]),
            config=json.loads(row["config"]),
            turns=int(row["turns"]),
            tenant=row["tenant"].decode(),
            note=None if note is None else ContinuityNote(int(note[0]), str(note[1])),
        )

    def session_tenant(self, session_id: str) -> str:
        tenant = self.target.call(self.target.client.hget, self._keys(session_id)[0], "tenant")
        if tenant is None:
            raise SessionNotFound(session_id)
        return bytes(tenant).decode()

    def count_sessions(self, tenant: str) -> int:
        return int(self.target.call(self.target.client.scard, self.target.key("tenant", tenant)))

    def delete_session(self, session_id: str) -> bool:
        """Delete a session and everything logged for it; False if there was none."""
        tenant_prefix = self.target.key("tenant", "")
        done = self.target.run(
            "delete", _DELETE, self._keys(session_id), [session_id, tenant_prefix]
        )
        return bool(done)

    def messages(self, session_id: str) -> list[StoredMessage]:
        """The session's current (not superseded) history, in order."""
        raw = self.target.call(self.target.client.lrange, self._keys(session_id)[1], 0, -1)
        return [_stored(r) for r in raw]

    def turns(self, session_id: str) -> list[dict[str, Any]]:
        raw = self.target.call(self.target.client.lrange, self._keys(session_id)[3], 0, -1)
        return [{"turn": i + 1, **json.loads(r)} for i, r in enumerate(raw)]

    def resets(self, session_id: str) -> list[dict[str, Any]]:
        raw = self.target.call(self.target.client.lrange, self._keys(session_id)[4], 0, -1)
        out = []
        for r in raw:
            turn, body = bytes(r).split(b" ", 1)
            out.append({"turn": int(turn), **json.loads(body)})
        return out

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
        """As :meth:`HistoryStore.commit_turn <continuum.store.sqlite.HistoryStore>`, in one
        Lua script: a session another worker committed to since ``expected_turn`` is a
        :class:`TurnConflict` and nothing is written."""
        if keep < 0:
            raise InvalidRequest(f"keep must be >= 0, not {keep}")
        resets = [json.dumps({k: r[k] for k in RESET_FIELDS}) for r in metrics.get("resets", [])]
        args: list[Any] = [
            -1 if expected_turn is None else expected_turn,
            keep,
            repr(time.time()),
            json.dumps(system),
            json.dumps(None if note is None else [note.window, note.text]),
            json.dumps({"finish_reason": finish_reason, "metrics": metrics}),
            len(new),
            *(_record(m) for m in new),
            *resets,
        ]
        turn, found = self.target.run("commit", _COMMIT, self._keys(session_id), args)
        if turn == -2:
            raise SessionNotFound(session_id)
        if turn == -1:
            assert expected_turn is not None
            raise TurnConflict(session_id, expected_turn, int(found))
        return int(turn)

    def import_session(
        self,
        record: SessionRecord,
        messages: Sequence[StoredMessage],
        turns: Sequence[dict[str, Any]],
        resets: Sequence[dict[str, Any]],
    ) -> None:
        """As :meth:`HistoryStore.import_session <continuum.store.sqlite.HistoryStore>`, in
        one Lua script (all of it or nothing; :class:`SessionExists` if the id is taken)."""
        tenant, config = session_owner(record.config, record.tenant)
        note = record.note
        ordered = sorted(turns, key=lambda t: int(t["turn"]))
        args: list[Any] = [
            record.id,
            repr(float(record.created_at)),
            record.model_digest,
            record.chat_format,
            json.dumps(record.system),
            json.dumps(record.continuity),
            json.dumps(config, sort_keys=True),
            tenant,
            json.dumps(None if note is None else [note.window, note.text]),
            len(ordered),
            len(messages),
            *(_record(m) for m in messages),
            *(
                json.dumps({"finish_reason": t["finish_reason"], "metrics": t["metrics"]})
                for t in ordered
            ),
            *(f"{int(r['turn'])} " + json.dumps({k: r[k] for k in RESET_FIELDS}) for r in resets),
        ]
        keys = [*self._keys(record.id), self.target.key("tenant", tenant)]
        if not self.target.run("import", _IMPORT, keys, args):
            raise SessionExists(record.id)

    # -- stored responses ----------------------------------------------------------------------
    def _response_key(self, tenant: str, response_id: str) -> tuple[str, str]:
        member = json.dumps([tenant, response_id])
        return self.target.key("response", member), member

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
        """As :meth:`HistoryStore.put_response <continuum.store.sqlite.HistoryStore>`."""
        now = time.time()
        key, member = self._response_key(tenant, response_id)
        cutoff = "" if retention_s is None else repr(now - retention_s)
        self.target.run(
            "put_response",
            _PUT_RESPONSE,
            [key, self.target.key("responses")],
            [
                member,
                json.dumps(parent),
                json.dumps(list(added)),
                json.dumps(body),
                repr(now),
                cutoff,
                self.target.key("response", ""),
            ],
        )

    def get_response(
        self, tenant: str, response_id: str, *, deleted_ok: bool = False
    ) -> tuple[dict[str, Any], list[Message]] | None:
        """As :meth:`HistoryStore.get_response <continuum.store.sqlite.HistoryStore>`: the
        chain is walked parent by parent."""
        parts: list[list[Message]] = []
        body: dict[str, Any] | None = None
        rid: str | None = response_id
        while rid is not None:
            key, _ = self._response_key(tenant, rid)
            parent, added, raw, deleted = self.target.call(
                self.target.client.hmget, key, ("parent", "added", "body", "deleted")
            )
            if raw is None or (body is None and deleted != b"0" and not deleted_ok):
                return None
            if body is None:
                body = json.loads(raw)
            parts.append(json.loads(added))
            rid = json.loads(parent)
        assert body is not None
        return body, [m for part in reversed(parts) for m in part]

    def delete_response(self, tenant: str, response_id: str) -> bool:
        key, _ = self._response_key(tenant, response_id)
        return bool(self.target.run("delete_response", _DELETE_RESPONSE, [key], []))


if TYPE_CHECKING:  # mypy checks the store against the protocol, signatures included

    def _conforms(store: RedisHistoryStore) -> HistoryLog:
        return store


__all__ = ["RedisHistoryStore"]
