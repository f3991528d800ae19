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
from sqlalchemy import text

from superopt.db.engine import Database

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


def upgrade(db: Database) -> None:
    """Bring the schema to the head revision (a no-op, one read, when it is there already)."""
    head = head_revision()
    if current_revision(db) == head:
        return
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
