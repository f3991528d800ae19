"""Schema migrations applied on first use: open a database and it is at the current revision.

Several processes may open a fresh database at once (a service and two workers), so the upgrade
runs under a lock: PostgreSQL's transaction-level advisory lock, or SQLite's write lock taken by
`BEGIN IMMEDIATE`. The revision is checked again under the lock, so only the first one migrates.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import text

from superopt.core.version import __version__
from superopt.db.engine import Database
from superopt.db.errors import StoreError

HERE = Path(__file__).resolve().parent
ADVISORY_LOCK = 0x5355_5045_524F_5054  # "SUPEROPT": one lock id for every superopt migration


def alembic_config() -> Config:
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except CommandError:  # not among this version's migrations
        return False


def upgrade(db: Database) -> None:
    """Bring the schema to the head revision (a no-op, one read, when it is there already).
    StoreError for a revision this version does not know (the database was written by a newer
    superopt): nothing is changed."""
    head = head_revision()
    current = current_revision(db)
    if current == head:
        return
    if current is not None and not _known(current):
        raise StoreError(f"the database's schema is at revision {current!r}, which superopt {__version__} does not "
                         "know (written by a newer superopt?); nothing was changed")
    cfg = alembic_config()
    with db.writer.connect() as conn:
        if db.backend == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": ADVISORY_LOCK})
        else:
            conn.exec_driver_sql("SELECT 1")  # starts BEGIN IMMEDIATE: the write lock is ours
        if MigrationContext.configure(conn).get_current_revision() != head:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        conn.commit()
