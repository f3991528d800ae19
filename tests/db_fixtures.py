"""Test equipment for the cache, queue, service and batch tests.

- `database_url(kind, tmp_path)`: a fresh SQLite file, or a fresh schema on the PostgreSQL server
  named by SUPEROPT_TEST_PG_URL (skipped with that reason when it is unset).
- Stand-in optimizers: until the search lands, a workload's hand-written reference sGraph stands
  in as the search result (cheapest valid parameters, cost-model times, the verifier's verdict,
  the unfused baseline).
  `optimize` is instant; `slow_optimize` reports progress for SUPEROPT_TEST_DELAY_S seconds first
  (workers load them with `--optimizer db_fixtures:slow_optimize`, tests/ on PYTHONPATH).
- `resign(db)`: sign every row again with the database's key, as a holder of the key could.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from superopt import workloads
from superopt.assignments import enumerate_assignments
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.core.result import Candidate, Result, SearchStats, Verdict
from superopt.costmodel import estimate, floor
from superopt.db.engine import Database
from superopt.db.integrity import candidate_fields, job_fields, signer_for, winner_fields
from superopt.db.models import Candidate as CandidateRow
from superopt.db.models import Job, Winner, Workload
from superopt.instantiate import instantiate
from superopt.program import Program
from superopt.sgraph import SGraph, renamed
from superopt.targets import target
from superopt.worker import resolve_fingerprint

PG_ENV = "SUPEROPT_TEST_PG_URL"
DELAY_ENV = "SUPEROPT_TEST_DELAY_S"
REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def database_url(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'superopt.db'}"
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set: no PostgreSQL server to test against")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    plain = make_url(base).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield make_url(plain).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False
        )
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def resign(db: Database) -> None:
    """Sign every candidate, winner and job result again with the database's key: rows edited by an
    insider who holds the key, which only the checks after the MACs can refuse."""
    with db.write() as s:
        signer = signer_for(s)
        for c in s.scalars(select(CandidateRow)):
            c.mac = signer.mac(candidate_fields(c, s.get_one(Workload, c.workload_id), c.target))
        for w in s.scalars(select(Winner)):
            w.mac = signer.mac(winner_fields(w, w.job.result))
        for j in s.scalars(select(Job).where(Job.result_mac.is_not(None))):
            j.result_mac = signer.mac(job_fields(j))


_VERDICTS: dict[tuple[str, str], Verdict] = {}


def verdict_of(program: Program, sg: SGraph, target_name: str) -> Verdict:
    """The verifier's verdict on a reference sGraph, computed once per program and target."""
    from superopt.verifier.verify import verify

    key = (program.canonical_hash(), target_name)
    if key not in _VERDICTS:
        _VERDICTS[key] = verify(program, sg, target=target(target_name))
    return _VERDICTS[key]


def _candidate(sg: SGraph, target_name: str, verdict: Verdict | None) -> Candidate:
    t = target(target_name)
    best: tuple[float, dict[str, int], Any] | None = None
    for params in enumerate_assignments(sg, t, limit=64):
        est = estimate(instantiate(sg, params, t))
        if best is None or est.time_us < best[0]:
            best = (est.time_us, params, est)
    assert best is not None, f"no valid parameters for {sg.name} on {target_name}"
    time_us, params, est = best
    return Candidate(sg, params, time_us, "estimated", est.dram_bytes, est.flops, verdict, estimated_us=time_us)


def standin_result(program: Program, target_name: str = "h100", *, proved: bool = True) -> Result:
    """Estimated on the named target (h100 for "auto"), keyed as a worker keys the job's target."""
    name = "h100" if target_name == "auto" else target_name
    ref = workloads.split_name(program.name)[0].reference(program)
    ref = renamed(ref, {}, f"{program.name}.{ref.name.rsplit('.', 1)[1]}")  # named for its program, as a hit is
    best = _candidate(ref, name, verdict_of(program, ref, name) if proved else Verdict())
    baseline = _candidate(unfused_baseline(program), name, None)
    fl = floor(program, target(name))
    return Result(
        program=program, target=name, measured=False,
        search=SearchStats(seconds=0.01, states=12, pruned=5, verified=1), best=best, baseline=baseline,
        floor_dram_bytes=fl.dram_bytes, floor_time_us=fl.time_s * 1e6, candidates=[best, baseline],
        target_fingerprint=resolve_fingerprint(target_name),
    )


def optimize(
    program: Program, *, target: str = "auto", budget_s: float | None = None, max_states: int | None = None,
    config: SearchConfig | None = None, force: bool = False, progress: Callable[[dict[str, Any]], None] | None = None,
) -> Result:
    """The stand-in for superopt.api.optimize (same signature)."""
    if progress:
        progress({"states": 12, "pruned": 5, "verified": 1, "best_time_us": None, "phase": "search"})
    return standin_result(program, target)


def interrupted_optimize(program: Program, **options: Any) -> Result:
    """The stand-in optimize, stopped (Ctrl-C, or SIGTERM as the commands take it) on lora:ci."""
    if program.name.startswith("lora"):
        raise KeyboardInterrupt
    return optimize(program, **options)


def slow_optimize(program: Program, **options: Any) -> Result:
    """`optimize` after SUPEROPT_TEST_DELAY_S seconds of reported progress: a job to kill or watch."""
    progress = options.get("progress")
    end = time.monotonic() + float(os.environ.get(DELAY_ENV, "3"))
    states = 0
    while time.monotonic() < end:
        states += 1
        if progress:
            progress({"states": states, "pruned": states // 2, "verified": 0, "best_time_us": None, "phase": "search"})
        time.sleep(0.05)
    return optimize(program, **options)


def failing_optimize(program: Program, **options: Any) -> Result:
    raise ValueError(f"no candidate found for {program.name} within the bounds")


def cli_env(db_url: str, **extra: str) -> dict[str, str]:
    """Environment for a `superopt` subprocess on `db_url` that can import this module."""
    env = {k: v for k, v in os.environ.items() if k not in ("SUPEROPT_TOKEN", "SUPEROPT_DB_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["SUPEROPT_DB_URL"] = db_url
    env.update(extra)
    return env


@contextmanager
def running_service(app: Any) -> Iterator[str]:
    """A real uvicorn server for `app` on a free port of 127.0.0.1, in a thread; yields its base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < end and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def superopt_process(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "superopt.cli", *args], env=env, cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,
    )


# X * 1e5, past f16's 65,504: a program `superopt check` refuses, and so every way to queue it.
NOT_FINITE = {"schema": "superopt.program/1", "name": "big_scale", "outputs": ["O"], "nodes": [
    {"id": "X", "op": "input", "shape": [4, 64], "dtype": "f16"}, {"id": "C", "op": "const", "attrs": {"value": 1e5}},
    {"id": "O", "op": "mul", "inputs": ["X", "C"]}]}
