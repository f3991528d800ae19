"""What the dashboard shows, read from the database: recent jobs, cache entries grouped by program
and target, the speedups chart's rows.

Kept apart from the routes so that the pages and `scripts/bench_dashboard.py` time the same
queries, and so that the HTTP layer holds no SQL.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import load_only

from superopt.db.cache import CacheEntry, KernelCache
from superopt.db.engine import Database
from superopt.db.jobs import served_ending
from superopt.db.keys import check_hash_prefix
from superopt.db.models import Job, Winner, Workload, iso

JOBS_SHOWN = 100  # the jobs page lists the newest jobs; ?limit= shows more, up to JOBS_MAX
JOBS_MAX = 1000


def recent_jobs(db: Database, limit: int = JOBS_SHOWN) -> list[dict[str, Any]]:
    """The newest `limit` jobs, newest first, as the jobs page and its polling endpoint show them:
    only the columns shown and signed are read (not the program JSON), which keeps a 2 s poll
    cheap; a result or error whose MAC fails is withheld, as the API withholds it (`served_ending`)."""
    q = (select(Job, Workload.name, Workload.program_hash)
         .join(Workload, Job.workload_id == Workload.id)
         .options(load_only(Job.id, Job.state, Job.workload_id, Job.config_hash, Job.target, Job.progress,
                            Job.result, Job.result_mac, Job.cache_hit, Job.error, Job.created_at))
         .order_by(Job.id.desc()).limit(max(1, min(limit, JOBS_MAX))))
    rows = []
    with db.read() as s:
        for job, name, program_hash in s.execute(q):
            result, error = served_ending(s, job)
            rows.append(job_row(job.id, job.state, name, program_hash, job.target, job.progress, result, error,
                                job.cache_hit, job.created_at))
    return rows


def job_row(job_id: int, state: str, name: str, program_hash: str, target: str, progress: dict[str, Any] | None,
            result: dict[str, Any] | None, error: str | None, cache_hit: bool, created_at: datetime | None,
            ) -> dict[str, Any]:
    """A job as the dashboard shows it (small: polled every 2 s)."""
    # (unsigned columns edited to another JSON kind show nothing, not a failed page)
    r, p = (v if isinstance(v, dict) else {} for v in (result, progress))
    return {
        "id": job_id, "state": state, "program": name, "hash": program_hash[:12], "target": target,
        "phase": p.get("phase"), "states": p.get("states"), "verified": p.get("verified"),
        "best_time_us": p.get("best_time_us"), "speedup": r.get("speedup"), "kernel_id": r.get("kernel_id"),
        "cache_hit": cache_hit, "error": error, "created_at": iso(created_at),
    }


@dataclass(frozen=True)
class CacheGroup:
    """The cached kernels of one program on one target: the best of them, and how many there are."""

    best: CacheEntry
    count: int
    proved: bool

    @property
    def speedup(self) -> float | None:
        return self.best.baseline_time_us / self.best.time_us if self.best.time_us > 0 else None


class CacheListing:
    """`KernelCache.entries` kept for a few seconds while the cache's winners stay the same.

    Listing checks every winner's MACs (about 0.5 ms each: 0.5 s for 1,000 winners), while the
    cache page and the chart are reloaded often and the set of winners changes only when a job
    finishes or an entry is invalidated. A new or removed winner changes (count, newest id), which
    a cheap query reads on every request; a row edited in place is caught when the memo expires
    (`ttl_s`), and the kernel page always checks its kernel in full."""

    def __init__(self, cache: KernelCache, ttl_s: float = 30.0) -> None:
        self.cache, self.ttl_s = cache, ttl_s
        self._memo: dict[tuple[str, str], tuple[tuple[int, int], float, list[CacheEntry]]] = {}

    def entries(self, hash_prefix: str = "", target: str = "") -> list[CacheEntry]:
        if hash_prefix:
            check_hash_prefix(hash_prefix)
        with self.cache.db.read() as s:
            count, newest = s.execute(select(func.count(Winner.id), func.max(Winner.id))).one()
        state, now = (int(count), int(newest or 0)), time.monotonic()
        key = (hash_prefix, target)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == state and now - hit[1] < self.ttl_s:
            return hit[2]
        entries = self.cache.entries(hash_prefix or None, target or None)
        if len(self._memo) > 64:  # filters typed by hand: keep the memo small
            self._memo.clear()
        self._memo[key] = (state, now, entries)
        return entries


def cache_groups(
    listing: CacheListing, *, program: str = "", target: str = "", hash_prefix: str = "",
) -> list[CacheGroup]:
    """Cache entries that match the filters (`program`: a substring of the name, case-insensitive;
    `hash_prefix`: checked as the API checks it), one group per program hash and target, the
    fastest first. A stored winner is a proved kernel (the cache keeps only those), which
    `proved` restates from its job's result."""
    entries = listing.entries(hash_prefix, target)
    if program:
        needle = program.lower()
        entries = [e for e in entries if needle in e.program_name.lower()]
    proved = _proved(listing.cache.db, [e.job_id for e in entries])
    groups: dict[tuple[str, str], list[CacheEntry]] = {}
    for e in entries:
        groups.setdefault((e.program_hash, e.target_fingerprint), []).append(e)
    out = [CacheGroup(min(es, key=lambda e: e.time_us), len(es), all(proved.get(e.job_id, False) for e in es))
           for es in groups.values()]
    return sorted(out, key=lambda g: (g.best.program_name, g.best.target))


def _proved(db: Database, job_ids: Sequence[int]) -> dict[int, bool]:
    if not job_ids:
        return {}
    with db.read() as s:
        rows = s.execute(select(Job.id, Job.result).where(Job.id.in_(set(job_ids))))
        return {i: bool((r or {}).get("proved")) for i, r in rows}


def speedup_rows(groups: Sequence[CacheGroup]) -> list[tuple[str, float | None]]:
    """(program @ target, speedup over unfused) for the chart: one bar per program and target."""
    return [(f"{g.best.program_name} @ {g.best.target}", g.speedup) for g in groups]
