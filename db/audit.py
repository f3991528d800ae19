"""`superopt cache verify`: every row of the kernel cache checked as serving it would check it.

A lookup checks the rows it serves when it serves them; an audit checks them all at once, so that
an operator learns of a forged or damaged row before anyone asks for it (or, after a key was
changed, which rows no longer pass). Per winner: the MACs of every row a hit serves, its program
and its kernel proved again (`winner_problem`). Per candidate: its MAC and, when its verdict says
proved, its proof made again (`kernel_problem`); and its stored CUDA, when it has any, byte-equal
with the CUDA its sGraph generates now. Per job with a result: the result's MAC.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import joinedload

from superopt.core.result import Candidate as ResultCandidate
from superopt.db.cache import kernel_problem, winner_problem, winners_in
from superopt.db.engine import Database
from superopt.db.integrity import job_fields, signer_for
from superopt.db.models import Candidate, Job, JobState, Workload
from superopt.db.recheck import generate_code
from superopt.targets import target as costmodel_target


@dataclass(frozen=True)
class BadRow:
    table: str  # "winner", "candidate" or "job"
    id: int
    program: str  # the name and hash prefix of the program it was stored for
    problems: list[str]


@dataclass(frozen=True)
class Audit:
    checked: int  # rows
    bad: list[BadRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "bad": [asdict(b) for b in self.bad]}


def audit(db: Database) -> Audit:
    bad: list[BadRow] = []
    with db.read() as s:
        winners = winners_in(s, None, None)
        for w in sorted(winners, key=lambda w: w.id):
            if (problem := winner_problem(s, w)) is not None:
                bad.append(BadRow("winner", w.id, _program(w.workload), [problem]))
        workloads = {wl.id: wl for wl in s.scalars(select(Workload))}
        candidates = list(s.scalars(select(Candidate).options(joinedload(Candidate.target)).order_by(Candidate.id)))
        for c in candidates:
            wl = workloads[c.workload_id]
            problems = [p for p in (kernel_problem(s, c, wl), _code_problem(c)) if p is not None]
            if problems:
                bad.append(BadRow("candidate", c.id, _program(wl), problems))
        signer = signer_for(s)
        ended = [state.value for state in JobState if state.terminal]
        jobs = list(s.scalars(select(Job).where(Job.result.is_not(None) | Job.state.in_(ended)).order_by(Job.id)))
        for j in jobs:
            if (problem := signer.problem(job_fields(j), j.result_mac)) is not None:
                bad.append(BadRow("job", j.id, _program(workloads[j.workload_id]), [f"how it ended {problem}"]))
    return Audit(len(winners) + len(candidates) + len(jobs), bad)


def _code_problem(c: Candidate) -> str | None:
    """Why the row's CUDA is not what its sGraph generates (None: it is, or the row holds none)."""
    try:
        stored = ResultCandidate.from_json(json.loads(c.data))
        t = costmodel_target(c.target.name)
    except (KeyError, TypeError, ValueError):
        return None  # a row that does not load: `kernel_problem` says so
    if stored.cuda is None:
        return None
    code = generate_code(stored.sgraph, stored.params, t)
    if code is None:
        return "no CUDA can be generated again from its sGraph"
    if code != (stored.cuda, stored.launch):
        return "its CUDA source or launch parameters differ from those its sGraph generates"
    return None


def _program(wl: Workload) -> str:
    return f"{wl.name} {wl.program_hash[:12]}"
