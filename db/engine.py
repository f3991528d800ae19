"""Opening the database: which URL, how connections are set up, and sessions for reads and writes.

The URL comes from the caller (a `--db` flag), then `SUPEROPT_DB_URL`, then a SQLite file in the
user's cache directory. SQLite connections get WAL (readers never wait for the writer), a busy
timeout (writers queue instead of failing) and foreign keys, each per connection because SQLite
keeps them per connection. Every write transaction on SQLite starts with `BEGIN IMMEDIATE`, so
it holds the single write lock from its first statement: two workers can never both read a job
as queued and then both claim it, and no writer fails half-way on a lock upgrade. PostgreSQL
needs neither; claims there use `FOR UPDATE SKIP LOCKED` (see superopt.db.jobs).

The database may go away (a PostgreSQL restart, a failover): `unavailable` tells such errors from
wrong statements, and `Retry` repeats a call through them with bounded, jittered exponential
backoff, so that a worker waits for the database instead of exiting.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, exc, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from superopt.db.errors import StoreError
from superopt.paths import cache_dir

ENV_URL = "SUPEROPT_DB_URL"
BUSY_TIMEOUT_MS = 30_000
# Seconds to wait for a PostgreSQL connection: a server behind a dropped route would otherwise
# hold a worker's call, or an HTTP request, for as long as TCP keeps trying.
CONNECT_TIMEOUT_S = 5
T = TypeVar("T")


def default_path() -> Path:
    return cache_dir() / "superopt.db"


def resolve_url(url: str | None = None) -> URL:
    """The database to use: `url`, else $SUPEROPT_DB_URL, else the default SQLite file.

    Accepts SQLAlchemy URLs, `postgresql://` / `postgres://` (served by psycopg 3) and plain
    file paths (SQLite)."""
    text = url or os.environ.get(ENV_URL) or ""
    if "\x00" in text or "%00" in text:
        raise StoreError("bad database URL: it holds a NUL byte, which no file name or server name has")
    if not text:
        return make_url(f"sqlite:///{default_path()}")
    if "://" not in text:
        return make_url(f"sqlite:///{Path(text).expanduser().resolve()}")
    try:
        parsed = make_url(text)
    except (exc.ArgumentError, ValueError):  # no scheme, or a port that is no number
        hidden = re.sub(r"//[^@/]*@", "//***@", text)  # the password, if any
        raise StoreError(f"bad database URL {hidden!r}: expected sqlite:///FILE or postgresql://...") from None
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StoreError("an in-memory SQLite database cannot hold a queue shared by processes; give a file")
        if parsed.database.startswith("file:") or parsed.query:
            # SQLite URI filenames (uri=true) and options: the file they name is not `database`,
            # where the key file is looked for, and mode=memory would hold the queue in memory.
            raise StoreError(f"SQLite URL options are not supported in {shown(parsed)}: give sqlite:///FILE or a path")
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
        self.engine = _sqlite_engine(url) if sqlite else _postgres_engine(url)
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

    def ping(self) -> None:
        """One round trip (`SELECT 1`); raises what `unavailable` recognizes when the database is
        unreachable. A fresh connection is taken, so a health check says what a request would meet."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({shown(self.url)!r})"


# The sqlite3 module raises OperationalError for wrong statements too ("no such table", syntax);
# these are the messages of a database that may answer later.
SQLITE_TRANSIENT = ("database is locked", "database table is locked", "unable to open database file",
                    "disk i/o error")


def unavailable(e: BaseException) -> bool:
    """Whether `e` says the database could not be reached or could not answer in time (server
    down or restarting, connection refused or cut, pool exhausted, SQLite locked past its busy
    timeout), rather than that a statement was wrong: only the former passes by trying again."""
    if isinstance(e, exc.DBAPIError) and e.connection_invalidated:
        return True
    if isinstance(e, exc.OperationalError) and isinstance(e.orig, sqlite3.Error):
        return any(message in str(e.orig).lower() for message in SQLITE_TRANSIENT)
    return isinstance(e, exc.OperationalError | exc.InterfaceError | exc.TimeoutError)


def read_only(e: BaseException) -> bool:
    """Whether `e` says the database refuses writes (an SQLite file opened read-only or made
    immutable, a PostgreSQL read-only transaction or standby): a setting of the database, not a
    wrong statement, which front ends say in one line rather than as a crash."""
    orig = getattr(e, "orig", None)
    if isinstance(orig, sqlite3.Error):
        return "readonly database" in str(orig).lower()
    return getattr(orig, "sqlstate", None) == "25006" or getattr(orig, "pgcode", None) == "25006"


def reason(e: BaseException) -> str:
    """The first line of the driver's message: what an operator needs, without the SQL."""
    orig = getattr(e, "orig", None) or e
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


class DatabaseUnavailable(StoreError):
    """The database stayed unreachable for a whole retry window (or a stop was asked meanwhile)."""


@dataclass
class Retry:
    """Repeats a database call while the database is unavailable: exponential backoff from
    `first_s`, capped at `max_s`, with jitter (each wait is drawn from its upper half, so that
    workers that lost the database together do not come back in step), for at most `window_s`
    seconds in all; then DatabaseUnavailable. Every failed try and the recovery are logged.

    The cap bounds how long after the database returns a caller notices; the window bounds how
    long a caller waits before it gives up (a worker then exits, for its supervisor to see)."""

    window_s: float = 600.0
    first_s: float = 0.25
    max_s: float = 5.0
    log: Callable[[str], None] = lambda _line: None
    stop: threading.Event = field(default_factory=threading.Event)

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row."""
        ceiling = min(self.max_s, self.first_s * 2 ** (failures - 1))
        return random.uniform(ceiling / 2, ceiling)

    def __call__(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, tried again after each failure that `unavailable` recognizes."""
        start = time.monotonic()
        failures = 0
        while True:
            try:
                result = call()
            except exc.SQLAlchemyError as e:
                if not unavailable(e):
                    raise
                failures += 1
                self._wait_after(what, e, failures, time.monotonic() - start)
                continue
            if failures:
                self.log(f"database reachable again ({what}) after {time.monotonic() - start:.1f} s")
            return result

    def _wait_after(self, what: str, e: exc.SQLAlchemyError, failures: int, waited: float) -> None:
        """Sleep before the next try, or raise DatabaseUnavailable when the window is spent or a
        stop was asked. A stop cuts a sleep short for one more try: a job's end may yet be written."""
        wait = min(self.delay(failures), self.window_s - waited)
        if wait <= 0:
            raise DatabaseUnavailable(f"database unreachable for {waited:.1f} s ({what}): {reason(e)}") from e
        if self.stop.is_set():
            raise DatabaseUnavailable(f"stopped while the database was unreachable ({what})") from e
        self.log(f"database unreachable ({what}, try {failures}): {reason(e)}; next try in {wait:.1f} s")
        self.stop.wait(wait)


def _postgres_engine(url: URL) -> Engine:
    """Connections checked before use (a restarted server left the pooled ones dead) and opened
    within CONNECT_TIMEOUT_S unless the URL says otherwise."""
    timeout = {} if "connect_timeout" in url.query else {"connect_timeout": CONNECT_TIMEOUT_S}
    return create_engine(url, pool_pre_ping=True, connect_args=timeout)


def _sqlite_engine(url: URL) -> Engine:
    assert url.database is not None
    Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
    path = url.database
    opened: list[tuple[int, int]] = []  # the file the pool's connections hold (device, inode)

    @event.listens_for(engine, "connect")
    def _setup(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below issue BEGIN, instead of the sqlite3 module's own.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _switch_to_wal(cur)
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()
        if not opened:
            opened.append(_file_id(path))

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # A file deleted (or replaced) under an open pool: its connections would go on using the
        # unlinked file, where a job queued is seen by no worker; unreachable until it is back.
        if opened and _file_id(path) != opened[0]:
            raise exc.OperationalError(None, None, sqlite3.OperationalError(
                f"unable to open database file: {path} was deleted or replaced while in use"))
        conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")

    return engine


def _file_id(path: str) -> tuple[int, int]:
    """The file at `path` (device, inode); (-1, -1) when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return st.st_dev, st.st_ino


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
    server is a StoreError naming it. `existing`: the SQLite file must exist already (commands
    that only look up jobs or kernels: a mistyped path is not a new, empty database, and a
    lookup on a fresh machine leaves no file behind)."""
    from superopt.db.migrate import upgrade

    resolved = resolve_url(url)
    if existing and resolved.get_backend_name() == "sqlite" and not Path(str(resolved.database)).is_file():
        raise StoreError(f"no database at {resolved.database} (nothing was queued or cached there)")
    try:
        db = Database(resolved)
    except OSError as e:  # the SQLite file's directory cannot be created
        raise StoreError(f"cannot open database {shown(resolved)}: {e.strerror or e}") from None
    try:
        upgrade(db)
        missing = _missing_tables(db)
    except exc.DatabaseError as e:  # unreachable, refused, or not a database at all
        db.close()
        reason = str(e.orig).strip().splitlines()[0] if e.orig else str(e)
        raise StoreError(f"cannot open database {shown(resolved)}: {reason}") from None
    except StoreError:
        db.close()
        raise
    if missing:
        db.close()
        raise StoreError(f"database {shown(resolved)} lacks its table(s) {', '.join(missing)} (damaged, or its "
                         "schema version edited)")
    return db


def _missing_tables(db: Database) -> list[str]:
    """The tables of the schema the database lacks (after its upgrade: none, unless one was dropped)."""
    from superopt.db.models import Base

    return sorted(set(Base.metadata.tables) - set(inspect(db.engine).get_table_names()))
