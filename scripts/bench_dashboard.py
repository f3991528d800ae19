"""Benchmark the web dashboard's pages on a full database: 1,000 jobs and 1,000 cache entries.

A fresh SQLite file in a temporary folder gets a few real cached results (the tests' stand-in
results: cost-model times, proved by the verifier), which are then cloned row by row (workload,
job, best and baseline candidates, winner, each clone with its own program hash) and signed with
the database's key, as a database that has served many programs holds them. Each page is then
requested 20 times through the service (FastAPI's TestClient, no network) and its median time
printed as a table and as JSON. The goal: every page under 200 ms.

    .venv/bin/python scripts/bench_dashboard.py [--jobs 1000] [--rounds 20] [--json out/bench_dashboard.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from superopt import workloads
from superopt.db.cache import KernelCache
from superopt.db.engine import Database, open_database
from superopt.db.integrity import candidate_fields, signer_for, winner_fields
from superopt.db.models import Candidate, Job, Winner, Workload
from superopt.service import create_app

REPO = Path(__file__).resolve().parent.parent
SEEDS = [("rmsnorm_matmul:ci", "h100"), ("gqa:ci", "h100"), ("lora:ci", "a100")]
GOAL_MS = 200.0


def fill(db: Database, total: int) -> int:
    """`total` jobs, each with a cached winner; returns a real kernel id (for the kernel page)."""
    sys.path.insert(0, str(REPO / "tests"))
    from db_fixtures import standin_result  # the tests' stand-in search: no GPU, seconds

    cache = KernelCache(db)
    kernel_id = 0
    for name, target in SEEDS:
        kernel_id = kernel_id or cache.store(standin_result(workloads.resolve(name), target))["kernel_id"]
    with db.write() as s:
        winners = list(s.scalars(select(Winner)))
        for i in range(total - len(winners)):
            _clone(s, winners[i % len(winners)], i)
        s.flush()
        signer = signer_for(s)
        for c in s.scalars(select(Candidate)):
            c.mac = signer.mac(candidate_fields(c, s.get_one(Workload, c.workload_id), c.target))
        for w in s.scalars(select(Winner)):
            w.mac = signer.mac(winner_fields(w, w.job.result))
    return kernel_id


def _clone(s: Any, w: Winner, i: int) -> None:
    src = w.workload
    wl = Workload(program_hash=hashlib.sha256(f"bench-{i}".encode()).hexdigest(), shapes=src.shapes,
                  dtypes=src.dtypes, name=f"{src.name.split(':')[0]}_{i % 97}:bench", program_json=src.program_json)
    j = w.job
    job = Job(workload=wl, program_json=j.program_json, target=j.target, config=j.config, config_hash=j.config_hash,
              state=j.state, attempts=1, worker_id="bench", progress=j.progress, result=dict(j.result or {}),
              started_at=j.started_at, finished_at=j.finished_at)
    s.add_all([wl, job])
    s.flush()
    rows = []
    for c in (w.candidate, w.baseline):
        rows.append(Candidate(job_id=job.id, workload_id=wl.id, target_id=c.target_id, rank=c.rank, data=c.data,
                              digest=c.digest, time_us=c.time_us, time_source=c.time_source,
                              estimated_us=c.estimated_us, proved=c.proved, kernels=c.kernels))
    s.add_all(rows)
    s.flush()
    s.add(Winner(workload_id=wl.id, target_id=w.target_id, config_hash=w.config_hash, version=w.version,
                 job_id=job.id, candidate_id=rows[0].id, baseline_id=rows[1].id, ranked_ids=None, time_us=w.time_us))


def timed(client: TestClient, path: str, rounds: int) -> dict[str, Any]:
    """The first request's time (cold: templates load, the cache listing checks every MAC) and the
    median of the next `rounds`."""
    t = time.perf_counter()
    client.get(path)
    first = (time.perf_counter() - t) * 1000
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        status = client.get(path).status_code
        times.append((time.perf_counter() - t) * 1000)
    ms = statistics.median(times)
    return {"page": path, "status": status, "first_ms": round(first, 1), "median_ms": round(ms, 1),
            "ok": status == 200 and ms < GOAL_MS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="jobs, each with a cache entry")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = open_database(f"sqlite:///{Path(tmp) / 'superopt.db'}")
        t = time.perf_counter()
        kernel_id = fill(db, args.jobs)
        fill_s = time.perf_counter() - t
        entries = len(KernelCache(db).entries())
        client = TestClient(create_app(db), base_url="http://127.0.0.1")
        pages = ["/", "/?limit=1000", "/ui/jobs.json", "/ui/submit", "/ui/cache", "/ui/cache?program=gqa",
                 "/ui/cache?target=a100", f"/ui/kernels/{kernel_id}", "/ui/chart"]
        rows = [timed(client, path, args.rounds) for path in pages]
        db.close()
    report = {"jobs": args.jobs, "cache_entries": entries, "rounds": args.rounds, "fill_s": round(fill_s, 1),
              "goal_ms": GOAL_MS, "pages": rows}
    print(f"{args.jobs} jobs, {entries} cache entries (filled in {fill_s:.1f} s); median of {args.rounds} requests")
    print(f"{'page':<28} {'status':>6} {'first ms':>9} {'median ms':>10}  goal: median < {GOAL_MS:.0f} ms")
    for r in rows:
        print(f"{r['page']:<28} {r['status']:>6} {r['first_ms']:>9.1f} {r['median_ms']:>10.1f}  "
              f"{'ok' if r['ok'] else 'SLOW'}")
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
