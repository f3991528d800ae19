"""Opening the database: which URL, how connections are set up, and sessions for reads and writes.

The URL comes from the caller (a `--db` flag), then `SUPEROPT_DB_URL`, then a SQLite file in the
user's cache directory. SQLite connections get WAL (readers never wait for the writer), a busy
timeout (writers queue instead of failing) and foreign keys, each per connection because SQLite
keeps them per connection. Every write transaction on SQLite starts with `BEGIN IMMEDIATE`, so
it holds the single write lock from its first statement: two workers can never both read a job
as queued and then both claim it, and no writer fails half-way on a lock upgrade. PostgreSQL
needs neither; claims there use `FOR UPDATE SKIP LOCKED` (see superopt.db.jobs).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from superopt.db.errors import StoreError
from superopt.paths import cache_dir

ENV_URL = "SUPEROPT_DB_URL"
BUSY_TIMEOUT_MS = 30_000


def default_path() -> Path:
    return cache_dir() / "superopt.db"


def resolve_url(url: str | None = None) -> URL:
    """The database to use: `url`, else $SUPEROPT_DB_URL, else the default SQLite file.

    Accepts SQLAlchemy URLs, `postgresql://` / `postgres://` (served by psycopg 3) and plain
    file paths (SQLite)."""
    text = url or os.environ.get(ENV_URL) or ""
    if not text:
        return make_url(f"sqlite:///{default_path()}")
    if "://" not in text:
        return make_url(f"sqlite:///{Path(text).expanduser().resolve()}")
    try:
        parsed = make_url(text)
    except exc.ArgumentError:
        raise StoreError(f"bad database URL {text!r}: expected sqlite:///FILE or postgresql://...") from None
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StoreError("an in-memory SQLite database cannot hold a queue shared by processes; give a file")
        return parsed
    raise StoreError(f"unsupported database {backend!r} in {shown(parsed)}: use SQLite or PostgreSQL")


def shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


class Database:
    """An engine plus the two kinds of session superopt uses: `read()` and `write()`."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.backend = url.get_backend_name()
        sqlite = self.backend == "sqlite"
        self.engine = _sqlite_engine(url) if sqlite else create_engine(url, pool_pre_ping=True)
        # Transactions of `writer` take SQLite's write lock up front (it is the plain engine elsewhere).
        self.writer = self.engine.execution_options(sqlite_begin="IMMEDIATE") if sqlite else self.engine
        self._reads = sessionmaker(self.engine, expire_on_commit=False)
        self._writes = sessionmaker(self.writer, expire_on_commit=False)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._reads() as s:
            yield s

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._writes.begin() as s:
            yield s

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({shown(self.url)!r})"


def _sqlite_engine(url: URL) -> Engine:
    assert url.database is not None
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _setup(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below issue BEGIN, instead of the sqlite3 module's own.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _switch_to_wal(cur)
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")

    return engine


def _switch_to_wal(cur: sqlite3.Cursor) -> None:
    """`PRAGMA journal_mode = WAL`, waiting out another process's write lock.

    The switch reads the file header and then rewrites it, and SQLite refuses that read-to-write
    upgrade at once, without its busy handler, while another connection holds the write lock:
    several processes opening a fresh file together (a service and its workers) hit it. So the
    switch is retried until the busy timeout; on a file already in WAL it is a read and passes."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def open_database(url: str | None = None, *, existing: bool = False) -> Database:
    """Open (and on first use create or upgrade) the database; a bad URL or an unreachable
    server is a StoreError naming it. `existing`: a SQLite file named by `url` must exist already
    (commands that only look up jobs or kernels: a mistyped path is not a new, empty database)."""
    from superopt.db.migrate import upgrade

    resolved = resolve_url(url)
    if existing and url and resolved.get_backend_name() == "sqlite" and not Path(str(resolved.database)).is_file():
        raise StoreError(f"no database at {resolved.database} (nothing was queued or cached there)")
    try:
        db = Database(resolved)
    except OSError as e:  # the SQLite file's directory cannot be created
        raise StoreError(f"cannot open database {shown(resolved)}: {e.strerror or e}") from None
    try:
        upgrade(db)
    except exc.DatabaseError as e:  # unreachable, refused, or not a database at all
        db.close()
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise StoreError(f"cannot open database {shown(resolved)}: {reason}") from None
    return db
