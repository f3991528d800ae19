"""Jobs: a keyed MAC over each job's result, as kernel cache rows have (0002).

GET /jobs/{id} and `superopt status` serve a job's result summary (its times, speedup, whether
the winner is proved, the kernel row it names); the column lets a reader refuse one that was
edited in the database. Results written before it have none and are withheld as unsigned.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06 05:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job", sa.Column("result_mac", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", recreate="never") as batch_op:
        batch_op.drop_column("result_mac")
