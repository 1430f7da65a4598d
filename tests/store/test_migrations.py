"""Schema migrations: the framework, and the three SQLite stores on it.

``tests/data/history-v1.db`` was written by the HistoryStore of the release before migrations
(``tests/data/make_history_v1.py`` remakes it): it must open as is and go on.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from continuum.errors import InvalidRequest, MetadataError, SessionNotFound, StoreError
from continuum.store import cache_meta
from continuum.store.graph import GraphStore, NewNode
from continuum.store.migrations import (
    Migration,
    check_version,
    latest_version,
    migrate,
    schema_version,
)
from continuum.store.sqlite import (
    HistoryStore,
    SessionId,
    SessionRecord,
    StoredMessage,
)
from continuum.store.sqlite_schema import SCHEMA_VERSION

DATA = Path(__file__).parent.parent / "data"
DIGEST = "sha256:" + "ab" * 32


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def connect(path: Path | str = ":memory:") -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def tables(db: sqlite3.Connection) -> list[str]:
    rows = db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    return [r[0] for r in rows]


def schema(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as db:
        rows = db.execute(
            "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"
        ).fetchall()
    return [(n, " ".join(s.split())) for n, s in rows]


# -- the framework, on lists made here --------------------------------------------------------
def recording(log: list[int], version: int) -> Callable[[sqlite3.Connection], None]:
    def step(db: sqlite3.Connection) -> None:
        log.append(version)
        db.execute(f"CREATE TABLE t{version} (x)")

    return step


def steps(n: int, log: list[int]) -> list[Migration]:
    return [Migration(v, f"step {v}", recording(log, v)) for v in range(1, n + 1)]


def test_a_fresh_database_gets_every_migration_in_order() -> None:
    log: list[int] = []
    db = connect()
    result = migrate(db, steps(3, log), path=":memory:", what="test")
    assert log == [1, 2, 3]
    assert (result.before, result.after, result.applied) == (0, 3, ("step 1", "step 2", "step 3"))
    assert schema_version(db) == 3
    assert tables(db) == ["t1", "t2", "t3"]


def test_reopening_applies_nothing_and_an_older_file_gets_only_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    log: list[int] = []
    with closing(connect(path)) as db:
        migrate(db, steps(2, log), path=path, what="test")
    with closing(connect(path)) as db:
        again = migrate(db, steps(2, log), path=path, what="test")
        assert (again.before, again.after, again.applied) == (2, 2, ())
        later = migrate(db, steps(4, log), path=path, what="test")
        assert (later.before, later.after, later.applied) == (2, 4, ("step 3", "step 4"))
    assert log == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "versions",
    [[], [1, 3], [2, 3], [1, 1, 2], [2, 1], [0, 1]],
    ids=["empty", "gap", "no-1", "duplicate", "order", "zero"],
)
def test_a_list_that_is_not_1_to_n_is_refused(versions: list[int]) -> None:
    migrations = [Migration(v, f"m{v}", "SELECT 1") for v in versions]
    with pytest.raises(ValueError, match="migration"):
        latest_version(migrations)
    with pytest.raises(ValueError):
        migrate(connect(), migrations, path=":memory:", what="test")


def test_a_migration_needs_a_name() -> None:
    with pytest.raises(ValueError, match="no name"):
        latest_version([Migration(1, "", "SELECT 1")])


def test_a_failing_step_is_rolled_back_and_earlier_steps_are_kept() -> None:
    db = connect()
    broken = [
        Migration(1, "one", "CREATE TABLE a (x); INSERT INTO a VALUES (1);"),
        Migration(2, "two", "CREATE TABLE b (x); INSERT INTO nowhere VALUES (1);"),
    ]
    with pytest.raises(sqlite3.OperationalError, match="nowhere"):
        migrate(db, broken, path=":memory:", what="test")
    assert schema_version(db) == 1
    assert tables(db) == ["a"]  # b was created inside the failed step's transaction
    fixed = [broken[0], Migration(2, "two", "CREATE TABLE b (x);")]
    assert migrate(db, fixed, path=":memory:", what="test").applied == ("two",)
    assert tables(db) == ["a", "b"]


def test_scripts_split_on_statements_not_on_every_semicolon() -> None:
    db = connect()
    script = """
        -- a comment; with a semicolon
        CREATE TABLE t (x TEXT);
        INSERT INTO t VALUES ('a;b');
        CREATE TRIGGER t_copy AFTER INSERT ON t BEGIN
            INSERT INTO u VALUES (new.x || ';');
        END;
        CREATE TABLE u (x TEXT)
    """
    migrate(db, [Migration(1, "one", script)], path=":memory:", what="test")
    db.execute("INSERT INTO t VALUES ('c')")
    assert db.execute("SELECT x FROM t ORDER BY rowid").fetchall() == [("a;b",), ("c",)]
    assert db.execute("SELECT x FROM u").fetchall() == [("c;",)]


def test_a_callable_that_commits_is_refused() -> None:
    db = connect()

    def commits(c: sqlite3.Connection) -> None:
        c.execute("COMMIT")

    with pytest.raises(RuntimeError, match="committed its own transaction"):
        migrate(db, [Migration(1, "rogue", commits)], path=":memory:", what="test")
    assert schema_version(db) == 0


def test_an_open_transaction_is_refused() -> None:
    db = connect()
    db.execute("BEGIN")
    with pytest.raises(RuntimeError, match="no open transaction"):
        migrate(db, steps(1, []), path=":memory:", what="test")


def test_a_newer_file_is_refused_and_left_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with closing(connect(path)) as db:
        migrate(db, steps(2, []), path=path, what="test")
        db.execute("PRAGMA user_version=99")
    before = sha256(path)
    with closing(connect(path)) as db:
        with pytest.raises(StoreError) as info:
            migrate(db, steps(2, []), path=path, what="widget", option="--widgets")
        with pytest.raises(StoreError):
            check_version(db, steps(2, []), path=path, what="widget")
    message = str(info.value)
    assert info.value.path == str(path)
    assert "widget schema 99" in message and "newer continuum" in message
    assert "Upgrade continuum" in message and "--widgets" in message
    assert sha256(path) == before


# -- a process killed in the middle of a migration ----------------------------------------------
_BLOCKING_CHILD = textwrap.dedent(
    """
    import sqlite3, sys, time
    from pathlib import Path
    from continuum.store.migrations import Migration, migrate

    path, marker, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]

    def second(db):
        db.execute("INSERT INTO t VALUES ('from step 2')")
        db.execute("CREATE TABLE t2 (x)")
        marker.write_text("inside")
        time.sleep(120)

    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA journal_mode={mode}")
    migrate(db, [
        Migration(1, "one", "CREATE TABLE t (x); INSERT INTO t VALUES ('from step 1');"),
        Migration(2, "two", second),
    ], path=path, what="test")
    """
)


@pytest.mark.parametrize("mode", ["delete", "wal"])
def test_a_migration_killed_midway_leaves_the_old_version(tmp_path: Path, mode: str) -> None:
    path, marker = tmp_path / "x.db", tmp_path / "inside"
    child = subprocess.Popen(
        [sys.executable, "-c", _BLOCKING_CHILD, str(path), str(marker), mode],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            assert time.monotonic() < deadline, "the child never reached migration 2"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        if child.stderr:
            child.stderr.close()

    def second(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t VALUES ('from step 2')")
        db.execute("CREATE TABLE t2 (x)")

    with closing(connect(path)) as db:
        assert schema_version(db) == 1  # the killed step left nothing
        assert tables(db) == ["t"]
        result = migrate(
            db,
            [Migration(1, "one", "CREATE TABLE t (x);"), Migration(2, "two", second)],
            path=path,
            what="test",
        )
        assert (result.before, result.after, result.applied) == (1, 2, ("two",))
        assert db.execute("SELECT x FROM t ORDER BY rowid").fetchall() == [
            ("from step 1",),
            ("from step 2",),
        ]
        assert tables(db) == ["t", "t2"]
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- the history store ----------------------------------------------------------------------------
@pytest.fixture
def v1_history(tmp_path: Path) -> Path:
    path = tmp_path / "history.db"
    shutil.copyfile(DATA / "history-v1.db", path)
    return path


def test_the_committed_v1_file_is_what_the_old_release_wrote(v1_history: Path) -> None:
    with closing(sqlite3.connect(v1_history)) as db:
        assert schema_version(db) == 1
        columns = [r[1] for r in db.execute("PRAGMA table_info(sessions)")]
    assert "tenant" not in columns


def test_a_v1_history_opens_and_goes_on(v1_history: Path) -> None:
    with HistoryStore(v1_history) as store:
        rec = store.load_session("s-acme")
        assert (rec.tenant, rec.config["tenant"], rec.turns) == ("acme", "acme", 2)
        assert store.session_tenant("s-acme") == "acme"
        assert store.load_session("s-none").tenant == ""
        assert store.session_tenant("s-none") == ""
        msgs = store.messages("s-acme")
        assert [m.message["content"] for m in msgs] == ["u1", "a1", "u2", "a2"]
        assert [m.gen_tokens for m in msgs] == [None, (5, 6, 7), None, (8, 9)]
        assert msgs[1].gen_model == DIGEST and msgs[1].identity == "id:a1"
        assert [t["turn"] for t in store.turns("s-acme")] == [1, 2]
        assert store.turns("s-acme")[1]["metrics"] == {"prompt_tokens_evaluated": 11, "resets": []}
        new = [
            StoredMessage({"role": "user", "content": "u3"}, "id:u3"),
            StoredMessage({"role": "assistant", "content": "a3"}, "id:a3", (1, 2), DIGEST),
        ]
        turn = store.commit_turn(
            "s-acme", keep=4, new=new, finish_reason="stop", metrics={}, system="Be brief."
        )
        assert turn == 3
        assert store.load_session("s-acme").note is None  # a v1 session has no continuity note
    with HistoryStore(v1_history) as again, closing(sqlite3.connect(v1_history)) as db:
        assert [m.message["content"] for m in again.messages("s-acme")][-2:] == ["u3", "a3"]
        assert again.messages("s-acme")[-1].gen_tokens == (1, 2)
        assert schema_version(db) == SCHEMA_VERSION == 4
        assert store_note_columns(db)
        assert "sessions_tenant" in [r[1] for r in db.execute("PRAGMA index_list(sessions)")]


def store_note_columns(db: sqlite3.Connection) -> bool:
    return {"note", "note_window"} <= {r[1] for r in db.execute("PRAGMA table_info(sessions)")}


def test_a_migrated_history_has_the_schema_of_a_fresh_one(v1_history: Path, tmp_path: Path) -> None:
    HistoryStore(v1_history).close()
    HistoryStore(tmp_path / "fresh.db").close()
    assert schema(v1_history) == schema(tmp_path / "fresh.db")


def test_sessions_record_their_tenant(tmp_path: Path) -> None:
    def create(tenant: str = "", config: dict[str, object] | None = None) -> str:
        return store.create_session(
            model_digest=DIGEST,
            chat_format="gemma",
            system=None,
            continuity=None,
            config=config or {},
            tenant=tenant,
        )

    with HistoryStore(tmp_path / "h.db") as store:
        sid = create("t1", {"n_ctx": 1024})
        rec = store.load_session(sid)
        assert rec.tenant == "t1" and rec.config == {"n_ctx": 1024, "tenant": "t1"}
        assert store.session_tenant(sid) == "t1"
        legacy = create("", {"tenant": "t2"})  # as the worker writes it today
        assert store.session_tenant(legacy) == "t2"
        assert store.load_session(create()).tenant == ""
        with pytest.raises(InvalidRequest, match="pass one tenant"):
            create("t1", {"tenant": "t3"})
        with pytest.raises(SessionNotFound):
            store.session_tenant("ghost")
        assert store.delete_session(sid)
        with pytest.raises(SessionNotFound):
            store.session_tenant(sid)


def test_session_records_still_build_positionally() -> None:
    rec = SessionRecord(SessionId("s"), 1.0, DIGEST, "gemma", None, None, {}, 0)
    assert rec.tenant == ""


def test_a_newer_history_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    HistoryStore(path).close()
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version=99")
    before = sha256(path)
    with pytest.raises(StoreError) as info:
        HistoryStore(path)
    assert "newer continuum" in str(info.value) and "--store" in str(info.value)
    assert sha256(path) == before


# -- the memory graph -----------------------------------------------------------------------------
def test_a_v1_graph_opens_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    g = GraphStore(path)
    run = g.add_run("ns", "first")
    node = g.add_node(NewNode("op", "ns", run, "k", text="hello"))
    g.close()
    before = schema(path)
    with closing(sqlite3.connect(path)) as db:
        assert schema_version(db) == 1
    again = GraphStore(path)
    try:
        found = again.node(node)
        assert found is not None and found.text == "hello"
        assert again.runs("ns") == [(run, "first", pytest.approx(time.time(), abs=600))]
    finally:
        again.close()
    assert schema(path) == before


def test_a_newer_graph_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "graph.db"
    GraphStore(path).close()
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version=99")
    before = sha256(path)
    with pytest.raises(StoreError) as info:
        GraphStore(path)
    assert "newer continuum" in str(info.value) and "--graph" in str(info.value)
    assert sha256(path) == before


# -- cache metadata -------------------------------------------------------------------------------
def saved_metadata(tmp_path: Path) -> Path:
    path = tmp_path / "meta.db"
    cache_meta.save(
        path,
        cache_meta.CacheMetadata(
            meta={"backend": "llamacpp"},
            memo=[("k", 1, "text", (1, 2), "stop", 3)],
            snapshots=[("ns", (4, 5), "sid", 2, 100)],
            semantic=[(1, "p", "q", 1, "t", (6,), "stop", 1, b"\0" * 8)],
        ),
    )
    return path


def test_metadata_round_trips_in_the_current_format(tmp_path: Path) -> None:
    path = saved_metadata(tmp_path)
    with closing(sqlite3.connect(path)) as db:
        assert schema_version(db) == cache_meta.FORMAT_VERSION == 2
    data = cache_meta.CacheMetadataFile(path).load()
    assert data.meta == {"backend": "llamacpp"}  # the format version is the file's own
    assert data.memo == [("k", 1, "text", (1, 2), "stop", 3)]
    assert data.snapshots == [("ns", (4, 5), "sid", 2, 100)]
    assert data.semantic == [(1, "p", "q", 1, "t", (6,), "stop", 1, b"\0" * 8)]


def test_a_v1_metadata_file_is_read_without_being_written(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with closing(sqlite3.connect(path)) as db:
        v1 = cache_meta.MIGRATIONS[0].apply
        assert isinstance(v1, str)
        db.executescript(v1 + "PRAGMA user_version=1;")
        db.execute("INSERT INTO meta VALUES ('format_version', '1')")
        db.execute("INSERT INTO meta VALUES ('backend', ?)", (json.dumps("llamacpp"),))
        db.execute("INSERT INTO memo VALUES ('k', 1, 't', X'01000000', 'stop', 1)")
        db.commit()
    before = sha256(path)
    data = cache_meta.load(path)
    assert data.meta == {"backend": "llamacpp"}
    assert data.memo == [("k", 1, "t", (1,), "stop", 1)] and data.semantic == []
    assert sha256(path) == before


def test_a_newer_metadata_file_is_refused_untouched(tmp_path: Path) -> None:
    path = saved_metadata(tmp_path)
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version=99")
    before = sha256(path)
    with pytest.raises(MetadataError) as info:
        cache_meta.load(path)
    assert "newer continuum" in str(info.value) and "upgrade continuum" in str(info.value)
    assert info.value.path == str(path)
    assert sha256(path) == before
