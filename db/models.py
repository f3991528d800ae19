"""The tables of the kernel cache and the job queue (DESIGN.md §8).

- `workload`: a program identity (canonical hash, input/output shapes and dtypes) with the program
  JSON it was first stored with; the JSON is re-hashed on every cache read.
- `target`: what a time was taken on (a cost-model target or a measured GPU), by fingerprint.
- `job`: one optimization request and the search history: queue state, lease, progress, result.
- `candidate`: every ranked candidate a job produced, with its verdict and times; its sGraph's
  tensors named canonically (superopt.db.canonical_names).
- `winner`: the answer of the cache, one per workload + target + search config + superopt version.

Candidate and winner rows carry a keyed MAC (superopt.db.integrity): the database is not trusted,
so a row that an editor of the database changed is noticed instead of served.

Times are naive UTC datetimes on every backend, so SQLite and PostgreSQL compare them alike.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, DateTime, ForeignKey, Index, MetaData, String, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def iso(t: datetime | None) -> str | None:
    """A stored time as the API and the dashboard write it (None: none, or unreadable: `Timestamp`)."""
    return None if t is None else t.isoformat(timespec="seconds") + "Z"


class Timestamp(TypeDecorator[datetime]):
    """A time column. SQLite stores times as text, so an editor of the database can put any text
    there: such a value reads as no time (None), where parsing it failed the whole read (a 500
    from the service, a traceback from the CLI)."""

    impl = DateTime
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        # Overridden, against TypeDecorator's advice, because `process_result_value` runs after
        # the dialect's parse: it never sees the text that failed it.
        parse = self.impl_instance.result_processor(dialect, coltype)
        if parse is None:
            return None  # the driver returns times (PostgreSQL's columns hold nothing else)

        def lenient(value: Any) -> datetime | None:
            try:
                return parse(value)
            except (ValueError, TypeError):
                return None

        return lenient


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, datetime: Timestamp}  # noqa: RUF012 - read as a class attribute


class JobState(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.succeeded, JobState.failed, JobState.cancelled)


class Workload(Base):
    __tablename__ = "workload"
    __table_args__ = (UniqueConstraint("program_hash", "shapes", "dtypes"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    program_hash: Mapped[str] = mapped_column(String(64))
    shapes: Mapped[str] = mapped_column(String(1000))  # JSON text: input then output shapes, canonical order
    dtypes: Mapped[str] = mapped_column(String(500))  # JSON text, same order
    name: Mapped[str] = mapped_column(String(200))
    program_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Target(Base):
    __tablename__ = "target"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(500), unique=True)
    name: Mapped[str] = mapped_column(String(100))
    measured: Mapped[bool]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    __tablename__ = "job"
    __table_args__ = (
        Index(None, "state", "id"),
        Index(None, "idempotency_key", unique=True),
        CheckConstraint(f"state IN ({', '.join(repr(s.value) for s in JobState)})", name="state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workload.id"), index=True)
    program_json: Mapped[str] = mapped_column(Text)  # as submitted: names are the user's
    target: Mapped[str] = mapped_column(String(100))  # as requested: a target name or "auto"
    config: Mapped[dict[str, Any]]
    config_hash: Mapped[str] = mapped_column(String(64))
    budget_s: Mapped[float | None]
    max_states: Mapped[int | None]
    force: Mapped[bool] = mapped_column(default=False)
    state: Mapped[str] = mapped_column(String(16), default=JobState.queued.value)
    progress: Mapped[dict[str, Any]] = mapped_column(default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(default=0)
    max_attempts: Mapped[int] = mapped_column(default=3)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    cache_hit: Mapped[bool] = mapped_column(default=False)
    result: Mapped[dict[str, Any] | None]
    result_mac: Mapped[str | None] = mapped_column(String(64))  # over the result (`integrity.job_fields`)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    # The client's Idempotency-Key (a retried POST /jobs answers this job), and the sha256 of the
    # request it came with (the same key with another request is refused).
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_digest: Mapped[str | None] = mapped_column(String(64))
    # The target's cache identity while the job runs ("auto" resolved by the worker that claimed
    # it), so that jobs of one program, config and resolved target never search at once.
    target_fingerprint: Mapped[str | None] = mapped_column(String(500))

    workload: Mapped[Workload] = relationship()


class Candidate(Base):
    __tablename__ = "candidate"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id"), index=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workload.id"), index=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("target.id"))
    rank: Mapped[int | None]  # position in the result's ranked list; None for best/baseline outside it
    data: Mapped[str] = mapped_column(Text)  # superopt.core.result.Candidate JSON
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of `data`: one row per distinct candidate of a job
    time_us: Mapped[float]
    time_source: Mapped[str] = mapped_column(String(16))
    estimated_us: Mapped[float | None]
    proved: Mapped[bool]
    kernels: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    mac: Mapped[str | None] = mapped_column(String(64))  # None: written before rows were signed

    job: Mapped[Job] = relationship()
    target: Mapped[Target] = relationship()


class Winner(Base):
    __tablename__ = "winner"
    __table_args__ = (UniqueConstraint("workload_id", "target_id", "config_hash", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workload.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("target.id"))
    config_hash: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(40))  # superopt version that found it
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id"))
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidate.id"))
    baseline_id: Mapped[int] = mapped_column(ForeignKey("candidate.id"))
    ranked_ids: Mapped[list[int] | None] = mapped_column(JSON)  # its job's ranked candidates, in rank order
    time_us: Mapped[float]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    mac: Mapped[str | None] = mapped_column(String(64))  # None: written before rows were signed

    workload: Mapped[Workload] = relationship()
    target: Mapped[Target] = relationship()
    job: Mapped[Job] = relationship()
    candidate: Mapped[Candidate] = relationship(foreign_keys=[candidate_id])
    baseline: Mapped[Candidate] = relationship(foreign_keys=[baseline_id])
