"""The job queue: `queued → running → succeeded | failed | cancelled`.

A worker claims the oldest queued job and holds it under a lease that its heartbeat renews. Every
later write of that worker names its claim (job, worker, attempt), so a worker that lost its job
(its lease expired and another worker took it, or a user cancelled it) can no longer touch it:
each job finishes exactly once. A job whose lease has expired returns to the queue, up to
`max_attempts` claims, then fails: a worker that cannot reach the database to renew or to end its
job (an outage) loses it to the next worker that claims once the database is back, so no job
stays `running` past its lease while any worker is alive.

A job whose answer is cached is answered at submission, no worker needed. There "auto" means what
it meant to the worker that last resolved it (its GPU, else h100 estimates), or before any did,
what it means on the submitting host: a service without a GPU in front of workers with GPUs does
not answer their jobs from h100 estimates. Twins (one program, search config and target) never
search at once: the later waits and is then a cache hit. "auto" is resolved first, as the claiming
worker resolves it, so an "auto" job and an "h100" job are twins on a worker without a GPU. A submission
with an idempotency key that was used before answers the job it made (a client retrying a POST
whose answer it lost), provided the request is the same.

Claims lock rows with `FOR UPDATE SKIP LOCKED` on PostgreSQL, so workers never wait on each other;
on SQLite the whole claim runs under the write lock (`BEGIN IMMEDIATE`, see superopt.db.engine).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, case, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session, aliased, joinedload

from superopt.canonical import input_names
from superopt.config import DEFAULT_BUDGET_S, DEFAULT_TARGET, LEASE_S, SearchConfig
from superopt.core.result import Result
from superopt.db.cache import Hit, hit_in, progress_of, store_in, workload_in
from superopt.db.engine import Database
from superopt.db.errors import Conflict, NotFound, RequestError, stored_id
from superopt.db.integrity import job_fields, sign_job, signer_for
from superopt.db.keys import CacheKey
from superopt.db.models import Job, JobState, iso, utcnow
from superopt.program import Program
from superopt.targets import TARGETS, fingerprint
from superopt.targets import target as costmodel_target

log = logging.getLogger(__name__)

AUTO_FALLBACK = "h100"  # what "auto" means without a GPU (the optimizer's rule: local GPU, else h100 estimates)


def resolve_fingerprint(target: str) -> str:
    """The cache identity of a job's target on this host: a named cost-model target, or for "auto"
    the local GPU when there is one, else the fallback cost-model target."""
    if target != "auto":
        return fingerprint(costmodel_target(target))
    return _auto_fingerprint()


@functools.cache
def _auto_fingerprint() -> str:
    """Looked up once per process: the GPU a worker drives does not change under it."""
    from superopt.runtime import GpuUnavailable, device_fingerprint, fingerprint_text

    try:
        return fingerprint_text(device_fingerprint())
    except GpuUnavailable:
        return fingerprint(costmodel_target(AUTO_FALLBACK))


@dataclass(frozen=True)
class JobView:
    """A job as front ends show it."""

    id: int
    state: JobState
    program_name: str
    program_hash: str
    target: str
    config_hash: str
    budget_s: float | None
    max_states: int | None
    force: bool
    progress: dict[str, Any]
    error: str | None
    attempts: int
    worker_id: str | None
    cache_hit: bool
    result: dict[str, Any] | None
    created_at: datetime | None  # None: unreadable (`models.Timestamp`)
    started_at: datetime | None
    finished_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state.value, "progress": self.progress, "error": self.error,
            "result": self.result, "program": {"name": self.program_name, "hash": self.program_hash},
            "target": self.target, "config_hash": self.config_hash, "budget_s": self.budget_s,
            "max_states": self.max_states, "force": self.force, "attempts": self.attempts,
            "worker_id": self.worker_id, "cache_hit": self.cache_hit, "created_at": iso(self.created_at),
            "started_at": iso(self.started_at), "finished_at": iso(self.finished_at),
        }


@dataclass(frozen=True)
class Claim:
    """A job a worker holds: what to run, and the fence (worker, attempt) its writes must match."""

    job_id: int
    worker_id: str
    attempt: int
    program: Program
    target: str
    config: SearchConfig
    budget_s: float | None
    max_states: int | None
    force: bool


class JobQueue:
    def __init__(self, db: Database, lease_s: float = LEASE_S) -> None:
        self.db = db
        self.lease_s = lease_s

    # -- front ends ----------------------------------------------------------------------------
    def submit(
        self, program: Program, *, target: str = DEFAULT_TARGET, config: SearchConfig | None = None,
        budget_s: float | None = DEFAULT_BUDGET_S, max_states: int | None = None, force: bool = False,
        max_attempts: int = 3, idempotency_key: str | None = None,
    ) -> JobView:
        """Queue a job; one whose answer is cached finishes at once (unless `force`), "auto" as
        the workers resolved it (`_workers_auto`). A queued "auto" job is resolved by the worker
        that claims it, which checks the cache again then.

        With an `idempotency_key` used before, the job it made is answered instead of a new one
        (a RequestError when the request differs), also when two submissions with it race."""
        config = config or SearchConfig()
        digest = None
        if idempotency_key is not None:
            digest = _request_digest(program, target, config, budget_s, max_states, force, max_attempts)
            earlier = self._keyed(idempotency_key, digest)
            if earlier is not None:
                return earlier
        hit = None
        if not force:
            with self.db.read() as s:
                resolved = _workers_auto(s) if target == "auto" else resolve_fingerprint(target)
                key = CacheKey.of(program, resolved, config)
                hit = hit_in(s, key, budget_s=budget_s, max_states=max_states)
        try:
            with self.db.write() as s:
                job = Job(
                    workload_id=workload_in(s, program).id, program_json=json.dumps(program.to_json()),
                    target=target, config=config.to_json(), config_hash=config.hash(), budget_s=budget_s,
                    max_states=max_states, force=force, max_attempts=max_attempts, progress={},
                    idempotency_key=idempotency_key, request_digest=digest,
                )
                s.add(job)
                s.flush()  # its id, which its result's MAC covers
                if hit is not None:
                    _answer(s, job, hit)
                return _view(s, job)
        except IntegrityError:
            # A concurrent submission with the same key inserted first: answer its job.
            raced = self._keyed(idempotency_key, digest) if idempotency_key is not None else None
            if raced is None:
                raise
            return raced

    def _keyed(self, idempotency_key: str, digest: str | None) -> JobView | None:
        """The job an earlier submission with this key made (None: none did); a RequestError
        naming that job when its request was another."""
        with self.db.read() as s:
            q = select(Job).where(Job.idempotency_key == idempotency_key).options(joinedload(Job.workload))
            job = s.scalars(q).first()
            if job is None:
                return None
            if job.request_digest != digest:
                raise RequestError("idempotency-key", f"already used for job {job.id} with a different request; "
                                                      "a new request needs a new key")
            return _view(s, job)

    def get(self, job_id: int) -> JobView:
        with self.db.read() as s:
            return _view(s, _job(s, job_id))

    def get_many(self, ids: Collection[int]) -> list[JobView]:
        with self.db.read() as s:
            jobs = s.scalars(select(Job).where(Job.id.in_(list(ids))).options(joinedload(Job.workload)))
            return [_view(s, j) for j in sorted(jobs, key=lambda j: j.id)]

    def cancel(self, job_id: int) -> JobView:
        """Cancel a queued or running job (a running one's worker notices at its next heartbeat)."""
        with self.db.write() as s:
            job = _job(s, job_id, lock=True)
            if JobState(job.state).terminal:
                raise Conflict(f"job {job_id} has already finished ({job.state})")
            _end(s, job, JobState.cancelled)
            return _view(s, job)

    # -- workers -------------------------------------------------------------------------------
    def claim(self, worker_id: str, only: Collection[int] | None = None) -> Claim | None:
        """Take the oldest queued job (among `only`, if given), after returning expired ones to the
        queue. A job whose twin (same program, resolved target and configuration) is running
        waits unless it is forced: once the twin's winner is stored it is a cache hit, where two
        workers would each search and the later store replace the earlier's winner."""
        if not self._claimable(only):
            return None  # an idle worker only reads: it never queues for the write lock
        with self.db.write() as s:
            self._requeue_expired(s)
            twin = aliased(Job)
            # A twin claimed by a worker of a version before target_fingerprint: resolved as here.
            twin_target = func.coalesce(twin.target_fingerprint, _resolved(twin.target))
            twin_running = exists().where(
                twin.state == JobState.running.value, twin.workload_id == Job.workload_id,
                twin_target == _resolved(Job.target), twin.config_hash == Job.config_hash)
            q = (select(Job).where(Job.state == JobState.queued.value, or_(Job.force, ~twin_running))
                 .order_by(Job.id).limit(1))
            if only is not None:
                q = q.where(Job.id.in_(list(only)))
            while (job := s.scalars(q.with_for_update(skip_locked=True)).first()) is not None:
                now = utcnow()
                job.state = JobState.running.value
                job.worker_id = worker_id
                job.attempts += 1
                job.lease_expires_at = now + timedelta(seconds=self.lease_s)
                job.target_fingerprint = resolve_fingerprint(job.target)
                job.started_at = now
                job.progress = {"phase": "claimed"}
                try:
                    program = Program.from_json(json.loads(job.program_json))
                    config = SearchConfig(**{k: v for k, v in job.config.items()
                                             if k in SearchConfig.__dataclass_fields__})
                except (ValueError, TypeError, AttributeError) as e:
                    # Not this worker's to retry (its limits are lower than the submitter's, or the
                    # row was edited): failed with why, so that the jobs behind it still run.
                    log.warning("job %s: its program cannot be read here (%s); failed", job.id, e)
                    job.error = f"the queued program cannot be read here: {e}"
                    _end(s, job, JobState.failed)
                    s.flush()
                    continue
                return Claim(job.id, worker_id, job.attempts, program, job.target, config, job.budget_s,
                             job.max_states, job.force)
            return None

    def requeue_expired(self) -> int:
        """Return running jobs whose lease expired to the queue (or fail them after max_attempts)."""
        with self.db.write() as s:
            return self._requeue_expired(s)

    def heartbeat(self, claim: Claim, progress: dict[str, Any] | None = None) -> bool:
        """Renew the lease (and record progress); False when the job is no longer this claim's."""
        values: dict[str, Any] = {"lease_expires_at": utcnow() + timedelta(seconds=self.lease_s)}
        if progress is not None:
            values["progress"] = _json_safe(progress)
        with self.db.write() as s:
            return s.execute(update(Job).where(*_fence(claim)).values(**values)).rowcount == 1

    def finish(self, claim: Claim, result: Result) -> JobView | None:
        """Store the result's candidates and winner and mark the job succeeded, in one transaction;
        None (and nothing written) when the job is no longer this claim's."""
        with self.db.write() as s:
            job = _owned(s, claim)
            if job is None:
                return None
            job.result = store_in(s, job, result)
            job.progress = progress_of(result)
            _end(s, job, JobState.succeeded)  # signed as it ends, its result with it
            return _view(s, job)

    def finish_cached(self, claim: Claim, hit: Hit) -> JobView | None:
        """Mark the job succeeded as answered by a cache hit."""
        with self.db.write() as s:
            job = _owned(s, claim)
            if job is None:
                return None
            _answer(s, job, hit)
            return _view(s, job)

    def fail(self, claim: Claim, error: str) -> JobView | None:
        with self.db.write() as s:
            job = _owned(s, claim)
            if job is None:
                return None
            job.error = error
            _end(s, job, JobState.failed)
            return _view(s, job)

    def release(self, claim: Claim) -> bool:
        """Give a job back to the queue at once (a worker stopping), without waiting for its lease."""
        with self.db.write() as s:
            return s.execute(update(Job).where(*_fence(claim)).values(**_queued())).rowcount == 1

    def _claimable(self, only: Collection[int] | None) -> bool:
        """Whether a claim could find work: a queued job, or a running one whose lease expired."""
        queued = Job.state == JobState.queued.value
        if only is not None:
            queued &= Job.id.in_(list(only))
        expired = (Job.state == JobState.running.value) & (Job.lease_expires_at < utcnow())
        with self.db.read() as s:
            return s.scalars(select(Job.id).where(queued | expired).limit(1)).first() is not None

    def _requeue_expired(self, s: Session) -> int:
        q = select(Job).where(Job.state == JobState.running.value, Job.lease_expires_at < utcnow())
        n = 0
        for job in s.scalars(q.with_for_update(skip_locked=True)):
            n += 1
            if job.attempts >= job.max_attempts:
                job.error = (f"gave up after {job.attempts} attempts: the worker running it "
                             f"({job.worker_id}) stopped renewing its lease")
                _end(s, job, JobState.failed)
            else:
                for column, value in _queued().items():
                    setattr(job, column, value)
        return n


def _queued() -> dict[str, Any]:
    """A job given back to the queue: no worker, lease or resolved target ("auto" may resolve
    otherwise on the next worker)."""
    return {"state": JobState.queued.value, "worker_id": None, "lease_expires_at": None, "target_fingerprint": None,
            "progress": {}}


def _resolved(target: InstrumentedAttribute[str]) -> ColumnElement[str]:
    """A job's target column as its cache identity on this host ("auto" as this worker resolves it)."""
    names = {name: fingerprint(t) for name, t in TARGETS.items()}
    return case({**names, "auto": resolve_fingerprint("auto")}, value=target, else_=target)


def _request_digest(program: Program, target: str, config: SearchConfig, budget_s: float | None,
                    max_states: int | None, force: bool, max_attempts: int) -> str:
    """What makes two submissions the same request (key order and JSON spacing aside)."""
    request = {"program": program.to_json(), "target": target, "config": config.to_json(), "budget_s": budget_s,
               "max_states": max_states, "force": force, "max_attempts": max_attempts}
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def _workers_auto(s: Session) -> str:
    """What "auto" meant to the worker that last claimed an "auto" job, else what it means here:
    the service that answers a job from the cache need not run where the workers' GPUs are. Not
    a cost-model target of another revision of the model (`targets.MODEL_REVISION`): its winners
    were ranked by a model that is no more."""
    q = (select(Job.target_fingerprint).where(Job.target == "auto", Job.target_fingerprint.is_not(None))
         .order_by(Job.id.desc()).limit(1))
    claimed = s.scalars(q).first()
    if claimed is None or (claimed.startswith("costmodel:") and claimed not in map(fingerprint, TARGETS.values())):
        return resolve_fingerprint("auto")
    return claimed


def _fence(claim: Claim) -> tuple[Any, ...]:
    return (
        Job.id == claim.job_id, Job.worker_id == claim.worker_id, Job.attempts == claim.attempt,
        Job.state == JobState.running.value,
    )


def _owned(s: Session, claim: Claim) -> Job | None:
    return s.scalars(select(Job).where(*_fence(claim)).with_for_update()).first()


def _job(s: Session, job_id: int, lock: bool = False) -> Job:
    q = select(Job).where(Job.id == stored_id("job", job_id)).options(joinedload(Job.workload))
    job = s.scalars(q.with_for_update(of=Job) if lock else q).first()
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def _answer(s: Session, job: Job, hit: Hit) -> None:
    """The job answered by a cache hit; `input_names` maps the cached kernel's input names to the
    job program's where they differ (one canonical hash, other names)."""
    now = utcnow()
    job.cache_hit = True
    names = input_names(hit.result.program, Program.from_json(json.loads(job.program_json)))
    job.result = {**hit.summary, **({"input_names": names} if names else {})}
    job.progress = {"phase": "cache hit"}
    job.started_at = job.started_at or now
    _end(s, job, JobState.succeeded)


def _end(s: Session, job: Job, state: JobState) -> None:
    """The job ended in `state`: signed as it ended (`integrity.job_fields`)."""
    job.state = state.value
    job.lease_expires_at = None
    job.finished_at = utcnow()
    sign_job(s, job)


# The states a job ends in, as stored (a state column edited to text no state has is none of them).
ENDED = frozenset(state.value for state in JobState if state.terminal)


def served_ending(s: Session, job: Job) -> tuple[dict[str, Any] | None, str | None]:
    """A job's result and error as they are served (by the API and the dashboard alike): when how
    it ended fails its MAC (its state, error or result edited in the database, or written before
    they were signed), both are withheld, and the error says why."""
    result, error = job.result, job.error
    ended = job.state in ENDED or result is not None
    if ended and (problem := signer_for(s).problem(job_fields(job), job.result_mac)) is not None:
        log.warning("job %s: how it ended %s; its error and result are withheld", job.id, problem)
        result, error = None, f"how the job ended {problem}; its stored error and result are withheld"
    return result, error


def _view(s: Session, job: Job) -> JobView:
    """The job as it is served (`served_ending`)."""
    result, error = served_ending(s, job)
    return JobView(
        id=job.id, state=JobState(job.state), program_name=job.workload.name, program_hash=job.workload.program_hash,
        target=job.target, config_hash=job.config_hash, budget_s=job.budget_s, max_states=job.max_states,
        force=job.force, progress=job.progress if isinstance(job.progress, dict) else {}, error=error,
        attempts=job.attempts, worker_id=job.worker_id, cache_hit=job.cache_hit, result=result,
        created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
    )


def _json_safe(d: dict[str, Any]) -> dict[str, Any]:
    """Progress as JSON every backend accepts (no NaN or infinities)."""
    return {str(k): (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in d.items()}
