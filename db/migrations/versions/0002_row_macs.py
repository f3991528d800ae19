"""Keyed MACs on candidate and winner rows (superopt.db.integrity); a winner names its ranked rows.

Rows written before have no MAC (NULL) and are never served: the next search of their key stores
signed ones in their place.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-14 10:12:31
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("candidate") as batch_op:
        batch_op.add_column(sa.Column("mac", sa.String(length=64), nullable=True))
    with op.batch_alter_table("winner") as batch_op:
        batch_op.add_column(sa.Column("ranked_ids", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("mac", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # In place (SQLite 3.35 drops a column itself): a copy-and-move of `candidate` would drop the
    # table that `winner` rows point at, which SQLite's foreign keys refuse once there are rows.
    with op.batch_alter_table("winner", recreate="never") as batch_op:
        batch_op.drop_column("mac")
        batch_op.drop_column("ranked_ids")
    with op.batch_alter_table("candidate", recreate="never") as batch_op:
        batch_op.drop_column("mac")
