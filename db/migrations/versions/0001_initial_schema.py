"""Initial schema: workload, target, job, candidate, winner.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 17:28:59
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_STATES = "'queued', 'running', 'succeeded', 'failed', 'cancelled'"


def upgrade() -> None:
    op.create_table(
        "target",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=500), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("measured", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_target")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_target_fingerprint")),
    )
    op.create_table(
        "workload",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("program_hash", sa.String(length=64), nullable=False),
        sa.Column("shapes", sa.String(length=1000), nullable=False),
        sa.Column("dtypes", sa.String(length=500), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("program_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload")),
        sa.UniqueConstraint(
            "program_hash", "shapes", "dtypes", name=op.f("uq_workload_program_hash_shapes_dtypes")
        ),
    )
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("program_json", sa.Text(), nullable=False),
        sa.Column("target", sa.String(length=100), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("budget_s", sa.Double(), nullable=True),
        sa.Column("max_states", sa.Integer(), nullable=True),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=True),
        sa.Column("cache_hit", sa.Boolean(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint(f"state IN ({JOB_STATES})", name=op.f("ck_job_state")),
        sa.ForeignKeyConstraint(["workload_id"], ["workload.id"], name=op.f("fk_job_workload_id_workload")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    with op.batch_alter_table("job") as batch_op:
        batch_op.create_index(batch_op.f("ix_job_state_id"), ["state", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_workload_id"), ["workload_id"], unique=False)
    op.create_table(
        "candidate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("time_us", sa.Double(), nullable=False),
        sa.Column("time_source", sa.String(length=16), nullable=False),
        sa.Column("estimated_us", sa.Double(), nullable=True),
        sa.Column("proved", sa.Boolean(), nullable=False),
        sa.Column("kernels", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_candidate_job_id_job")),
        sa.ForeignKeyConstraint(["target_id"], ["target.id"], name=op.f("fk_candidate_target_id_target")),
        sa.ForeignKeyConstraint(["workload_id"], ["workload.id"], name=op.f("fk_candidate_workload_id_workload")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidate")),
    )
    with op.batch_alter_table("candidate") as batch_op:
        batch_op.create_index(batch_op.f("ix_candidate_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_candidate_workload_id"), ["workload_id"], unique=False)
    op.create_table(
        "winner",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("candidate_id", sa.Integer(), nullable=False),
        sa.Column("baseline_id", sa.Integer(), nullable=False),
        sa.Column("time_us", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["baseline_id"], ["candidate.id"], name=op.f("fk_winner_baseline_id_candidate")),
        sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"], name=op.f("fk_winner_candidate_id_candidate")),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], name=op.f("fk_winner_job_id_job")),
        sa.ForeignKeyConstraint(["target_id"], ["target.id"], name=op.f("fk_winner_target_id_target")),
        sa.ForeignKeyConstraint(["workload_id"], ["workload.id"], name=op.f("fk_winner_workload_id_workload")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_winner")),
        sa.UniqueConstraint(
            "workload_id", "target_id", "config_hash", "version",
            name=op.f("uq_winner_workload_id_target_id_config_hash_version"),
        ),
    )


def downgrade() -> None:
    op.drop_table("winner")
    with op.batch_alter_table("candidate") as batch_op:
        batch_op.drop_index(batch_op.f("ix_candidate_workload_id"))
        batch_op.drop_index(batch_op.f("ix_candidate_job_id"))
    op.drop_table("candidate")
    with op.batch_alter_table("job") as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_workload_id"))
        batch_op.drop_index(batch_op.f("ix_job_state_id"))
    op.drop_table("job")
    op.drop_table("workload")
    op.drop_table("target")
