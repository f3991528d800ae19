"""The kernel cache: look up, store, list and invalidate winners.

A winner is stored only when its verdict is proved (DESIGN.md §5), together with every ranked
candidate of the search that found it, its sGraphs named canonically (superopt.db.canonical_names)
and every row signed (superopt.db.integrity). Reading one back re-checks it: every row against its
MAC, the stored program JSON parsed and re-hashed against the key, the winning sGraph against the
program's inputs and outputs, and the winning kernel proved again (superopt.db.recheck); the CUDA
served is generated again from the sGraph served. Any failure is a miss with a
CacheIntegrityWarning naming the row, never a wrong kernel.

`KernelCache` is the front ends' API; the `*_in(session, ...)` functions do the same work inside
a transaction someone else holds (the job queue stores a result and finishes its job in one).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, joinedload

from superopt.config import DEFAULT_BUDGET_S, SearchConfig
from superopt.core import version as superopt_version
from superopt.core.result import Candidate as ResultCandidate
from superopt.core.result import Result, SearchStats
from superopt.db import recheck
from superopt.db.canonical_names import Order, from_canonical, order_of, to_canonical
from superopt.db.engine import Database
from superopt.db.errors import CacheIntegrityWarning, NotFound, stored_id
from superopt.db.integrity import Signer, candidate_fields, sign_job, signer_for, winner_fields
from superopt.db.keys import CacheKey, check_hash_prefix, signature
from superopt.db.models import Candidate, Job, JobState, Target, Winner, Workload, iso, utcnow
from superopt.digest import canonical_json
from superopt.limits import printable
from superopt.program import Program, ProgramError
from superopt.sgraph import SGraphError
from superopt.targets import Target as CostModelTarget
from superopt.targets import TargetError
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
    created_at: datetime | None  # None: unreadable (`models.Timestamp`)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "created_at": iso(self.created_at)}


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
        `optimize`'s), its kernels' tensors named as `program` names them."""
        key = CacheKey.of(program, target_fingerprint, config)
        hit = self.hit(key, budget_s=budget_s, max_states=max_states, program=program)
        return hit.result if hit else None

    def hit(
        self, key: CacheKey, *, budget_s: float | None = DEFAULT_BUDGET_S, max_states: int | None = None,
        program: Program | None = None,
    ) -> Hit | None:
        with self.db.read() as s:
            return hit_in(s, key, budget_s=budget_s, max_states=max_states, program=program)

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
            sign_job(s, job)  # it ended as it was recorded
            return job.result

    def entries(
        self, program_hash: str | None = None, target: str | None = None, *, program: str | None = None,
        limit: int | None = None, offset: int = 0,
    ) -> list[CacheEntry]:
        """Winners, newest first; `program_hash` may be a prefix, `target` a name or a fingerprint,
        `program` a program name; `limit` and `offset` page them (`cache ls` and `GET /cache` list
        the same rows). A winner whose rows fail their MACs is left out, with a warning: a listing
        serves its times (a page may then hold fewer than `limit`)."""
        with self.db.read() as s:
            winners = winners_in(s, program_hash, target, program=program, limit=limit, offset=offset)
            signer = signer_for(s)
            return [_entry(w) for w in winners if _signed(signer, w)]

    def kernel(self, kernel_id: int) -> dict[str, Any]:
        """One stored candidate with its sGraph (named as the program it was stored for names its
        tensors), parameters, CUDA source, verdict and times, checked as a hit's kernel is."""
        with self.db.read() as s:
            c = s.get(Candidate, stored_id("kernel", kernel_id),
                      options=[joinedload(Candidate.target), joinedload(Candidate.job)])
            if c is None:
                raise NotFound(f"no kernel {kernel_id}")
            workload = s.get(Workload, c.workload_id)
            assert workload is not None
            try:
                served = _checked_kernel(signer_for(s), c, workload)
            except _Refused as e:
                warnings.warn(f"kernel {kernel_id}: {e}; not served", CacheIntegrityWarning, stacklevel=2)
                raise NotFound(f"kernel {kernel_id} failed its integrity check: {e}") from None
            winner = s.scalars(select(Winner.id).where(Winner.candidate_id == c.id)).first()
            return {
                "id": c.id,
                "job_id": c.job_id,
                "winner": winner is not None,
                "program": {"name": workload.name, "hash": workload.program_hash},
                "target": {"name": c.target.name, "fingerprint": c.target.fingerprint, "measured": c.target.measured},
                "config_hash": c.job.config_hash,
                **served.to_json(),
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
        """Delete matching winners, those that fail their checks too (their candidates stay as
        history); the next request searches again."""
        with self.db.write() as s:
            ids = [w.id for w in winners_in(s, program_hash, target) if kernel_id in (None, w.candidate_id)]
            return s.execute(delete(Winner).where(Winner.id.in_(ids))).rowcount if ids else 0


# -- inside a transaction -----------------------------------------------------------------------


def hit_in(
    s: Session, key: CacheKey, *, budget_s: float | None, max_states: int | None, program: Program | None = None,
) -> Hit | None:
    """The winner stored for `key`, when it answers a search with these limits: one that a
    smaller budget cut short does not (`SearchStats.answers`); that search is then run. Its
    kernels' tensors are named as `program` names them (by default, the program it was stored for)."""
    q = (
        _entries_query()
        .where(Workload.program_hash == key.program_hash, Workload.shapes == key.shapes)
        .where(Workload.dtypes == key.dtypes, Target.fingerprint == key.target_fingerprint)
        .where(Winner.config_hash == key.config_hash, Winner.version == key.version)
    )
    w = s.scalars(q).unique().first()
    hit = _load(s, w, program) if w is not None else None
    return hit if hit is not None and hit.result.search.answers(budget_s, max_states) else None


def winners_in(
    s: Session, program_hash: str | None, target: str | None, *, program: str | None = None,
    limit: int | None = None, offset: int = 0,
) -> list[Winner]:
    """Winners, newest first, unchecked (`KernelCache.entries` checks them); `program_hash` may be a
    prefix, `target` a name or a fingerprint, `program` a program name."""
    q = _entries_query()
    if program_hash is not None:
        q = q.where(Workload.program_hash.startswith(check_hash_prefix(program_hash), autoescape=True))
    if target:
        q = q.where((Target.name == target) | (Target.fingerprint == target))
    if program:
        q = q.where(Workload.name == program)
    q = q.order_by(Winner.created_at.desc(), Winner.id.desc()).offset(offset).limit(limit)
    return list(s.scalars(q).unique())


def winner_problem(s: Session, w: Winner) -> str | None:
    """Why the stored winner `w` would not be served (None: it would be); what `cache verify` reports."""
    try:
        _checked_hit(s, w, None)
    except _Refused as e:
        return str(e)
    return None


def kernel_problem(s: Session, c: Candidate, workload: Workload) -> str | None:
    """Why the candidate row `c` would not be served as a kernel (None: it would be)."""
    try:
        _checked_kernel(signer_for(s), c, workload)
    except _Refused as e:
        return str(e)
    return None


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
    """Store a job's candidates, and its winner when the best one is proved, every row signed;
    return the summary the job reports (kernel_id is the best candidate's row)."""
    fp = result_fingerprint(result)
    target = target_in(s, result.target, fp, result.measured)
    workload = s.get(Workload, job.workload_id)
    assert workload is not None
    signer, order, codegen_target = signer_for(s), order_of(result.program), costmodel_target(result.target)
    stored: dict[int, str] = {}  # candidate object -> its stored JSON (best and baseline are ranked too)
    rows: dict[str, Candidate] = {}  # by digest of that JSON
    ranked: list[int] = []  # rows of the ranked candidates, in rank order

    def row(c: ResultCandidate, rank: int | None) -> Candidate:
        if id(c) not in stored:
            stored[id(c)] = canonical_json(_canonical(c, order, codegen_target).to_json())
        data = stored[id(c)]
        digest = _digest(data)
        if digest not in rows:
            cand = Candidate(
                job_id=job.id, workload_id=job.workload_id, target_id=target.id, rank=rank, data=data, digest=digest,
                time_us=c.time_us, time_source=c.time_source, estimated_us=c.estimated_us,
                proved=bool(c.verdict and c.verdict.proved), kernels=c.kernels,
            )
            s.add(cand)
            s.flush()
            cand.mac = signer.mac(candidate_fields(cand, workload, target))
            rows[digest] = cand
            if rank is not None:
                ranked.append(cand.id)
        return rows[digest]

    for i, c in enumerate(result.candidates):
        row(c, i)
    best, baseline = row(result.best, None), row(result.baseline, None)
    winner_id = None
    if result.best.verdict and result.best.verdict.proved:
        _drop_unservable(s, job, target)
        values = {
            "workload_id": job.workload_id, "target_id": target.id, "config_hash": job.config_hash,
            "version": superopt_version.__version__, "job_id": job.id, "candidate_id": best.id,
            "baseline_id": baseline.id, "ranked_ids": ranked, "time_us": result.best.time_us, "created_at": utcnow(),
        }
        stmt = _insert(s, Winner).values(**values)
        # A key (program, target, config and version) is answered by its fastest proved winner: a
        # search cut short (--force --max-states 1) replaces only a slower one, a finished search
        # an equal one too (it may answer larger budgets: `SearchStats.answers`).
        faster = Winner.time_us > stmt.excluded.time_us
        stmt = stmt.on_conflict_do_update(
            index_elements=["workload_id", "target_id", "config_hash", "version"],
            set_={k: stmt.excluded[k]
                  for k in ("job_id", "candidate_id", "baseline_id", "ranked_ids", "time_us", "created_at")},
            where=faster if result.search.budget_exhausted else faster | (Winner.time_us == stmt.excluded.time_us),
        )
        winner_id = s.execute(stmt.returning(Winner.id)).scalar()  # None: the faster one stayed
    summary = summarize(result, fp, best.id, baseline.id, cached=winner_id is not None)
    if winner_id is not None:
        w = s.get(Winner, winner_id, populate_existing=True)
        assert w is not None
        w.mac = signer.mac(winner_fields(w, summary))
    return summary


def _drop_unservable(s: Session, job: Job, target: Target) -> None:
    """Delete the winner of the job's key when it would not be served (edited, unsigned, not
    proved again): it holds its key no longer, or a forged time of 0.001 us would keep out every
    winner found after it, and every request would search again."""
    q = _entries_query().where(
        Winner.workload_id == job.workload_id, Winner.target_id == target.id,
        Winner.config_hash == job.config_hash, Winner.version == superopt_version.__version__,
    )
    w = s.scalars(q).unique().first()
    if w is not None and winner_problem(s, w) is not None:
        s.delete(w)
        s.flush()


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


@functools.cache
def _entries_query() -> Select[tuple[Winner]]:
    """Built once (a Select is immutable; building it takes longer than running it on SQLite)."""
    return (
        select(Winner)
        .join(Workload, Winner.workload_id == Workload.id)
        .join(Target, Winner.target_id == Target.id)
        .options(joinedload(Winner.workload), joinedload(Winner.target), joinedload(Winner.job),
                 joinedload(Winner.baseline))
    )


def _entry(w: Winner) -> CacheEntry:
    return CacheEntry(
        winner_id=w.id, kernel_id=w.candidate_id, baseline_id=w.baseline_id, job_id=w.job_id,
        program_name=w.workload.name, program_hash=w.workload.program_hash, shapes=json.loads(w.workload.shapes),
        dtypes=json.loads(w.workload.dtypes), target=w.target.name, target_fingerprint=w.target.fingerprint,
        measured=w.target.measured, config_hash=w.config_hash, version=w.version, time_us=w.time_us,
        baseline_time_us=w.baseline.time_us, created_at=w.created_at,
    )


class _Refused(Exception):
    """A stored row that fails a check, and why: a miss, never a wrong kernel."""


def _load(s: Session, w: Winner, asking: Program | None = None) -> Hit | None:
    """Check a stored winner and rebuild its Result for `asking` (by default the program it was
    stored for); None, with a warning naming the row, when a check fails."""
    try:
        return _checked_hit(s, w, asking)
    except _Refused as e:
        warnings.warn(f"{_what(w)}: {e}; treated as a miss", CacheIntegrityWarning, stacklevel=3)
        return None


def _checked_hit(s: Session, w: Winner, asking: Program | None) -> Hit:
    """`w`'s Result for `asking` (or its own program), or _Refused: every row it serves must pass
    its MAC, and its kernel fit the program and be proved again."""
    signer = signer_for(s)
    ranked = list(s.scalars(
        select(Candidate).where(Candidate.job_id == w.job_id, Candidate.rank.is_not(None)).order_by(Candidate.rank)
    ))
    rows = list({c.id: c for c in [*ranked, w.candidate, w.baseline]}.values())  # the kernel is ranked too
    _check_mac(signer, f"winner row {w.id}", winner_fields(w, w.job.result), w.mac)
    if [c.id for c in ranked] != w.ranked_ids:
        raise _Refused(f"its job's ranked candidates are not rows {w.ranked_ids}, those it was stored with")
    for c in rows:
        _check_mac(signer, f"candidate row {c.id}", candidate_fields(c, w.workload, w.target), c.mac)
    stored = _stored_program(w.workload)  # the key the row is filed under must be its program's
    program = asking or stored
    t = _codegen_target(w.target.name)
    order = order_of(program)
    loaded = {c.id: _served(c, order, t, program.name) for c in rows}
    best = loaded[w.candidate_id]
    if not (best.verdict and best.verdict.proved):
        raise _Refused("its kernel's stored verdict is not proved")
    _prove_again(w.candidate, program, best, t)
    summary = dict(w.job.result or {})
    stats = {k: v for k, v in summary.get("search", {}).items() if k in SearchStats.__dataclass_fields__}
    result = Result(
        program=program, target=w.target.name, measured=w.target.measured, search=SearchStats(**stats),
        best=best, baseline=loaded[w.baseline_id], floor_dram_bytes=int(summary.get("floor_dram_bytes", 0)),
        floor_time_us=float(summary.get("floor_time_us", 0.0)),
        candidates=[loaded[c.id] for c in ranked], cache_hit=True, target_fingerprint=w.target.fingerprint,
    )
    return Hit(result, {**summary, "cache_hit": True, "source_job": w.job_id})


def _checked_kernel(signer: Signer, c: Candidate, workload: Workload) -> ResultCandidate:
    """Candidate row `c` as `KernelCache.kernel` serves it (named for the program it was stored
    for), or _Refused; one whose verdict says proved is proved again first."""
    _check_mac(signer, f"candidate row {c.id}", candidate_fields(c, workload, c.target), c.mac)
    program = _stored_program(workload)
    t = _codegen_target(c.target.name)
    served = _served(c, order_of(program), t, program.name)
    if served.verdict and served.verdict.proved:
        _prove_again(c, program, served, t)
    return served


def _signed(signer: Signer, w: Winner) -> bool:
    """Whether the rows a listing serves of `w` (its own, its kernel's, its baseline's time) pass
    their MACs: a listing names the kernel id that `cache show` would then refuse."""
    try:
        _check_mac(signer, f"winner row {w.id}", winner_fields(w, w.job.result), w.mac)
        for c in (w.candidate, w.baseline):
            _check_mac(signer, f"candidate row {c.id}", candidate_fields(c, w.workload, w.target), c.mac)
    except _Refused as e:
        warnings.warn(f"{_what(w)}: {e}; not listed", CacheIntegrityWarning, stacklevel=3)
        return False
    return True


def _check_mac(signer: Signer, row: str, fields: dict[str, Any], mac: str | None) -> None:
    problem = signer.problem(fields, mac)
    if problem is not None:
        raise _Refused(f"{row} {problem}")


def _stored_program(workload: Workload) -> Program:
    try:
        program = Program.from_json(json.loads(workload.program_json))
    except (ProgramError, ValueError) as e:
        raise _Refused(f"its stored program does not load: {e}") from None
    if (program.canonical_hash(), *signature(program)) != (workload.program_hash, workload.shapes, workload.dtypes):
        raise _Refused("its stored program JSON re-hashes to a different key")
    return program


def _codegen_target(name: str) -> CostModelTarget:
    try:
        return costmodel_target(name)
    except TargetError:
        raise _Refused(f"its target {name!r} is not one this version generates code for") from None


def _canonical(c: ResultCandidate, order: Order, t: CostModelTarget) -> ResultCandidate:
    """`c` as stored: its sGraph named canonically, and its CUDA, when it has any, generated for those names."""
    sg = to_canonical(c.sgraph, order)
    code = recheck.generate_code(sg, c.params, t) if c.cuda is not None else None
    return replace(c, sgraph=sg, cuda=code[0] if code else None, launch=code[1] if code else [])


def _served(c: Candidate, order: Order, t: CostModelTarget, program_name: str) -> ResultCandidate:
    """Row `c` (its MAC checked) as served to the program of `order`, named `program_name`: its
    sGraph renamed for it, and its CUDA, when the row has any, generated again from that sGraph."""
    try:
        stored = ResultCandidate.from_json(json.loads(c.data))
    except (SGraphError, KeyError, TypeError, ValueError) as e:
        raise _Refused(f"candidate row {c.id} does not load: {e}") from None
    sg = from_canonical(stored.sgraph, order, program_name)
    if stored.cuda is None:
        return replace(stored, sgraph=sg, launch=[])
    code = recheck.served_code(_row(c), (order, sg.name), sg, stored.params, t)  # kernel names hash sg.name
    if code is None:
        raise _Refused(f"candidate row {c.id}: no CUDA can be generated again from its sGraph")
    return replace(stored, sgraph=sg, cuda=code[0], launch=code[1])


def _prove_again(c: Candidate, program: Program, served: ResultCandidate, t: CostModelTarget) -> None:
    """The proof covers the fit (`verify` checks it first): a row's MAC pins its key, so every
    program that finds it fits alike, and the fit is kept with the proof."""
    problem = recheck.reproof_problem(_row(c), program, served.sgraph, t)
    if problem is not None:
        raise _Refused(f"candidate row {c.id}: {problem}")


def _row(c: Candidate) -> recheck.Row:
    assert c.mac is not None  # its MAC was checked
    return c.id, c.mac


def _what(w: Winner) -> str:
    return printable(f"kernel cache entry {w.id} ({w.workload.name}, {w.workload.program_hash[:12]}, {w.target.name})")


def _digest(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()


def _insert(s: Session, table: type) -> Any:
    """INSERT with ON CONFLICT support for the session's backend."""
    return (postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert)(table)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
