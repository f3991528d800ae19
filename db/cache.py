"""The kernel cache: look up, store, list and invalidate winners.

A winner is stored only when its verdict is proved (DESIGN.md §5), together with every ranked
candidate of the search that found it. Reading one back re-checks it: the stored program JSON is
parsed and re-hashed against the key, every candidate row against its digest, and the winning
sGraph against the program's inputs and outputs. Any failure is a miss with a
CacheIntegrityWarning, never a wrong kernel.

`KernelCache` is the front ends' API; the `*_in(session, ...)` functions do the same work inside
a transaction someone else holds (the job queue stores a result and finishes its job in one).
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, joinedload

import superopt
from superopt.config import DEFAULT_BUDGET_S, SearchConfig
from superopt.db.engine import Database
from superopt.db.errors import CacheIntegrityWarning, NotFound, stored_id
from superopt.db.keys import CacheKey, signature
from superopt.db.models import Candidate, Job, JobState, Target, Winner, Workload, utcnow
from superopt.digest import canonical_json
from superopt.program import Program, ProgramError
from superopt.result import Candidate as ResultCandidate
from superopt.result import Result, SearchStats
from superopt.sgraph import SGraphError, check_matches
from superopt.targets import fingerprint as costmodel_fingerprint
from superopt.targets import target as costmodel_target


@dataclass(frozen=True)
class CacheEntry:
    """One stored winner as listed (its JSON not loaded, so not yet checked)."""

    winner_id: int
    kernel_id: int
    baseline_id: int
    job_id: int
    program_name: str
    program_hash: str
    shapes: list[list[int]]
    dtypes: list[str]
    target: str
    target_fingerprint: str
    measured: bool
    config_hash: str
    version: str
    time_us: float
    baseline_time_us: float
    created_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "created_at": self.created_at.isoformat(timespec="seconds") + "Z"}


@dataclass(frozen=True)
class Hit:
    """A winner that passed its checks, with the Result it answers (`cache_hit` set)."""

    result: Result
    summary: dict[str, Any]  # what a job answered by this hit reports as its result


class KernelCache:
    """Winners by cache key. `lookup` before searching, `store` after."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def lookup(self, program: Program, target_fingerprint: str, config: SearchConfig | None = None, *,
               budget_s: float | None = DEFAULT_BUDGET_S, max_states: int | None = None) -> Result | None:
        """The cached answer for a search of `program` with these limits (see `hit_in`; by default
        `optimize`'s), bound to its input names."""
        hit = self.hit(CacheKey.of(program, target_fingerprint, config), budget_s=budget_s, max_states=max_states)
        return hit.result.bound_to(program) if hit else None

    def hit(
        self, key: CacheKey, *, budget_s: float | None = DEFAULT_BUDGET_S, max_states: int | None = None,
    ) -> Hit | None:
        with self.db.read() as s:
            return hit_in(s, key, budget_s=budget_s, max_states=max_states)

    def store(self, result: Result, config: SearchConfig | None = None) -> dict[str, Any]:
        """Record a search done outside the queue (e.g. `superopt optimize`) as a finished job with
        its candidates, and its winner when proved. Returns the result summary (with kernel_id)."""
        config = config or SearchConfig()
        with self.db.write() as s:
            workload = workload_in(s, result.program)
            now = utcnow()
            job = Job(
                workload_id=workload.id, program_json=json.dumps(result.program.to_json()), target=result.target,
                config=config.to_json(), config_hash=config.hash(), state=JobState.succeeded.value, attempts=1,
                worker_id="in-process", progress=progress_of(result), started_at=now, finished_at=now,
            )
            s.add(job)
            s.flush()
            job.result = store_in(s, job, result)
            return job.result

    def entries(self, program_hash: str | None = None, target: str | None = None) -> list[CacheEntry]:
        """Winners, newest first; `program_hash` may be a prefix, `target` a name or a fingerprint."""
        q = _entries_query()
        if program_hash:
            q = q.where(Workload.program_hash.startswith(program_hash.lower(), autoescape=True))
        if target:
            q = q.where((Target.name == target) | (Target.fingerprint == target))
        with self.db.read() as s:
            return [_entry(w) for w in s.scalars(q.order_by(Winner.created_at.desc(), Winner.id.desc())).unique()]

    def kernel(self, kernel_id: int) -> dict[str, Any]:
        """One stored candidate with its sGraph, parameters, CUDA source, verdict and times."""
        with self.db.read() as s:
            c = s.get(Candidate, stored_id("kernel", kernel_id),
                      options=[joinedload(Candidate.target), joinedload(Candidate.job)])
            if c is None:
                raise NotFound(f"no kernel {kernel_id}")
            if _digest(c.data) != c.digest:
                raise NotFound(f"kernel {kernel_id} is damaged (its stored JSON does not match its digest)")
            winner = s.scalars(select(Winner.id).where(Winner.candidate_id == c.id)).first()
            workload = s.get(Workload, c.workload_id)
            assert workload is not None
            return {
                "id": c.id,
                "job_id": c.job_id,
                "winner": winner is not None,
                "program": {"name": workload.name, "hash": workload.program_hash},
                "target": {"name": c.target.name, "fingerprint": c.target.fingerprint, "measured": c.target.measured},
                "config_hash": c.job.config_hash,
                **json.loads(c.data),
            }

    def report(self, kernel_id: int) -> dict[str, Any]:
        """The full Result report of the winner whose kernel this is (what `cache export` writes)."""
        with self.db.read() as s:
            q = _entries_query().where(Winner.candidate_id == stored_id("kernel", kernel_id))
            w = s.scalars(q).unique().first()
            if w is None:
                raise NotFound(f"kernel {kernel_id} is not a cached winner")
            hit = _load(s, w)
            if hit is None:
                raise NotFound(f"cached winner {w.id} failed its integrity check")
            return hit.result.report()

    def invalidate(
        self, *, program_hash: str | None = None, target: str | None = None, kernel_id: int | None = None,
    ) -> int:
        """Delete matching winners (their candidates stay as history); the next request searches again."""
        ids = [e.winner_id for e in self.entries(program_hash, target) if kernel_id in (None, e.kernel_id)]
        if not ids:
            return 0
        with self.db.write() as s:
            return s.execute(delete(Winner).where(Winner.id.in_(ids))).rowcount


# -- inside a transaction -----------------------------------------------------------------------


def hit_in(s: Session, key: CacheKey, *, budget_s: float | None, max_states: int | None) -> Hit | None:
    """The winner stored for `key`, when it answers a search with these limits: one that a
    smaller budget cut short does not (`SearchStats.answers`); that search is then run."""
    q = (
        _entries_query()
        .where(Workload.program_hash == key.program_hash, Workload.shapes == key.shapes)
        .where(Workload.dtypes == key.dtypes, Target.fingerprint == key.target_fingerprint)
        .where(Winner.config_hash == key.config_hash, Winner.version == key.version)
    )
    w = s.scalars(q).unique().first()
    hit = _load(s, w) if w is not None else None
    return hit if hit is not None and hit.result.search.answers(budget_s, max_states) else None


def workload_in(s: Session, program: Program) -> Workload:
    """The workload row of a program, created if new (safe against concurrent creators)."""
    h = program.canonical_hash()
    shapes, dtypes = signature(program)
    values = {
        "program_hash": h, "shapes": shapes, "dtypes": dtypes, "name": program.name[:200],
        "program_json": json.dumps(program.to_json()), "created_at": utcnow(),
    }
    key = ["program_hash", "shapes", "dtypes"]
    s.execute(_insert(s, Workload).values(**values).on_conflict_do_nothing(index_elements=key))
    return s.scalars(
        select(Workload).where(Workload.program_hash == h, Workload.shapes == shapes, Workload.dtypes == dtypes)
    ).one()


def target_in(s: Session, name: str, fingerprint: str, measured: bool) -> Target:
    values = {"fingerprint": fingerprint, "name": name[:100], "measured": measured, "created_at": utcnow()}
    s.execute(_insert(s, Target).values(**values).on_conflict_do_nothing(index_elements=["fingerprint"]))
    return s.scalars(select(Target).where(Target.fingerprint == fingerprint)).one()


def result_fingerprint(result: Result) -> str:
    """The target fingerprint a result is keyed by: its own, or its cost-model target's."""
    if result.target_fingerprint:
        return result.target_fingerprint
    if result.measured:
        raise ValueError("a measured result without a target fingerprint cannot be cached")
    return costmodel_fingerprint(costmodel_target(result.target))


def store_in(s: Session, job: Job, result: Result) -> dict[str, Any]:
    """Store a job's candidates, and its winner when the best one is proved; return the summary
    the job reports (kernel_id is the best candidate's row)."""
    fp = result_fingerprint(result)
    target = target_in(s, result.target, fp, result.measured)
    ids: dict[str, int] = {}

    def row(c: ResultCandidate, rank: int | None) -> int:
        data = canonical_json(c.to_json())
        digest = _digest(data)
        if digest not in ids:
            cand = Candidate(
                job_id=job.id, workload_id=job.workload_id, target_id=target.id, rank=rank, data=data, digest=digest,
                time_us=c.time_us, time_source=c.time_source, estimated_us=c.estimated_us,
                proved=bool(c.verdict and c.verdict.proved), kernels=c.kernels,
            )
            s.add(cand)
            s.flush()
            ids[digest] = cand.id
        return ids[digest]

    for i, c in enumerate(result.candidates):
        row(c, i)
    best_id, baseline_id = row(result.best, None), row(result.baseline, None)
    cached = False
    if result.best.verdict and result.best.verdict.proved:
        values = {
            "workload_id": job.workload_id, "target_id": target.id, "config_hash": job.config_hash,
            "version": superopt.__version__, "job_id": job.id, "candidate_id": best_id, "baseline_id": baseline_id,
            "time_us": result.best.time_us, "created_at": utcnow(),
        }
        stmt = _insert(s, Winner).values(**values)
        # A key (program, target, config and version) is answered by its fastest proved winner: a
        # search cut short (--force --max-states 1) replaces only a slower one, a finished search
        # an equal one too (it may answer larger budgets: `SearchStats.answers`).
        faster = Winner.time_us > stmt.excluded.time_us
        stmt = stmt.on_conflict_do_update(
            index_elements=["workload_id", "target_id", "config_hash", "version"],
            set_={k: stmt.excluded[k] for k in ("job_id", "candidate_id", "baseline_id", "time_us", "created_at")},
            where=faster if result.search.budget_exhausted else faster | (Winner.time_us == stmt.excluded.time_us),
        )
        cached = s.execute(stmt.returning(Winner.id)).first() is not None  # no row: the faster one stayed
    return summarize(result, fp, best_id, baseline_id, cached=cached)


def summarize(result: Result, fingerprint: str, kernel_id: int, baseline_id: int, *, cached: bool) -> dict[str, Any]:
    return {
        "kernel_id": kernel_id,
        "baseline_id": baseline_id,
        "cache_hit": result.cache_hit,
        "cached": cached,
        "proved": bool(result.best.verdict and result.best.verdict.proved),
        "program": {"name": result.program.name, "hash": result.program.canonical_hash()},
        "target": {"name": result.target, "fingerprint": fingerprint, "measured": result.measured},
        "time_us": result.best.time_us,
        "time_source": result.best.time_source,
        "baseline_time_us": result.baseline.time_us,
        "speedup": _finite(result.speedup),
        "floor_dram_bytes": result.floor_dram_bytes,
        "floor_time_us": result.floor_time_us,
        "kernels": result.best.kernels,
        "search": {k: _finite(v) if isinstance(v, float) else v for k, v in result.search.to_json().items()},
    }


def progress_of(result: Result) -> dict[str, Any]:
    st = result.search
    return {"states": st.states, "pruned": st.pruned, "verified": st.verified,
            "best_time_us": _finite(result.best.time_us), "phase": "done"}


# -- helpers ------------------------------------------------------------------------------------


def _entries_query() -> Select[tuple[Winner]]:
    return (
        select(Winner)
        .join(Workload, Winner.workload_id == Workload.id)
        .join(Target, Winner.target_id == Target.id)
        .options(joinedload(Winner.workload), joinedload(Winner.target), joinedload(Winner.baseline))
    )


def _entry(w: Winner) -> CacheEntry:
    return CacheEntry(
        winner_id=w.id, kernel_id=w.candidate_id, baseline_id=w.baseline_id, job_id=w.job_id,
        program_name=w.workload.name, program_hash=w.workload.program_hash, shapes=json.loads(w.workload.shapes),
        dtypes=json.loads(w.workload.dtypes), target=w.target.name, target_fingerprint=w.target.fingerprint,
        measured=w.target.measured, config_hash=w.config_hash, version=w.version, time_us=w.time_us,
        baseline_time_us=w.baseline.time_us, created_at=w.created_at,
    )


def _load(s: Session, w: Winner) -> Hit | None:
    """Check a stored winner and rebuild its Result; None (with a warning) when a check fails."""
    what = f"kernel cache entry {w.id} ({w.workload.name}, {w.workload.program_hash[:12]}, {w.target.name})"
    try:
        program = Program.from_json(json.loads(w.workload.program_json))
    except (ProgramError, ValueError) as e:
        return _miss(what, f"its stored program does not load: {e}")
    stored_key = (w.workload.program_hash, w.workload.shapes, w.workload.dtypes)
    if (program.canonical_hash(), *signature(program)) != stored_key:
        return _miss(what, "its stored program JSON re-hashes to a different key")
    ranked = list(s.scalars(
        select(Candidate).where(Candidate.job_id == w.job_id, Candidate.rank.is_not(None)).order_by(Candidate.rank)
    ))
    loaded: dict[int, ResultCandidate] = {}
    for c in [*ranked, w.candidate, w.baseline]:
        if _digest(c.data) != c.digest:
            return _miss(what, f"candidate row {c.id} does not match its digest")
        try:
            loaded[c.id] = ResultCandidate.from_json(json.loads(c.data))
        except (SGraphError, KeyError, TypeError, ValueError) as e:
            return _miss(what, f"candidate row {c.id} does not load: {e}")
    best = loaded[w.candidate_id]
    try:
        check_matches(best.sgraph, program)
    except SGraphError as e:
        return _miss(what, f"its kernel does not fit the program: {e}")
    if not (best.verdict and best.verdict.proved):
        return _miss(what, "its kernel's stored verdict is not proved")
    summary = dict(w.job.result or {})
    stats = {k: v for k, v in summary.get("search", {}).items() if k in SearchStats.__dataclass_fields__}
    result = Result(
        program=program, target=w.target.name, measured=w.target.measured, search=SearchStats(**stats),
        best=best, baseline=loaded[w.baseline_id], floor_dram_bytes=int(summary.get("floor_dram_bytes", 0)),
        floor_time_us=float(summary.get("floor_time_us", 0.0)),
        candidates=[loaded[c.id] for c in ranked], cache_hit=True, target_fingerprint=w.target.fingerprint,
    )
    return Hit(result, {**summary, "cache_hit": True, "source_job": w.job_id})


def _miss(what: str, reason: str) -> Hit | None:
    """A failed check: a warning, and no hit."""
    warnings.warn(f"{what}: {reason}; treated as a miss", CacheIntegrityWarning, stacklevel=3)
    return None


def _digest(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()


def _insert(s: Session, table: type) -> Any:
    """INSERT with ON CONFLICT support for the session's backend."""
    return (postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert)(table)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
