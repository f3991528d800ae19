"""Jobs: the client's Idempotency-Key with its request's digest, and the resolved target.

`idempotency_key` is unique (NULLs aside), so two submissions with one key make one job even when
they race. `target_fingerprint` is the cache identity of a running job's target, "auto" resolved
by the worker that claimed it, so that an "auto" job and an "h100" job of one program and config
are recognized as twins and only one of them searches.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-16 09:40:12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("idempotency_key", sa.String(length=200)),
    ("request_digest", sa.String(length=64)),
    ("target_fingerprint", sa.String(length=500)),
)


def upgrade() -> None:
    # Plain ADD COLUMN and CREATE INDEX: a copy-and-move of `job` would drop the table that
    # candidate and winner rows point at, which SQLite's foreign keys refuse once there are rows.
    for name, kind in COLUMNS:
        op.add_column("job", sa.Column(name, kind, nullable=True))
    op.create_index(op.f("ix_job_idempotency_key"), "job", ["idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_job_idempotency_key"), table_name="job")
    with op.batch_alter_table("job", recreate="never") as batch_op:
        for name, _kind in reversed(COLUMNS):
            batch_op.drop_column(name)
