"""Batch runs (`superopt batch FILE.jsonl`): many programs, one job each, one summary.

Each non-blank line not starting with `#` is one of:
    gqa:ci                                      a built-in workload name (bare or as a JSON string)
    {"schema": "superopt.program/1", ...}       a program JSON document
    {"program": "lora", "target": "a100", "budget_s": 30, "force": false, "config": {...}}
                                                a job request (the body of POST /jobs); here
                                                "program" may also be a file relative to FILE
The whole file is checked before anything is submitted, so a bad line queues nothing. Jobs run
through workers, or with `local` in this process; either way a program already in the cache
finishes at once as a cache hit, so re-running a batch only searches what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from superopt.db.engine import Database
from superopt.db.errors import Conflict, RequestError
from superopt.db.jobs import JobQueue, JobView
from superopt.jobspec import JobRequest, parse_request
from superopt.jsontext import JSONTextError, json_problem, parse_json
from superopt.program import Program
from superopt.worker import Optimize, Worker


@dataclass(frozen=True)
class BatchEntry:
    line: int
    program: Program
    request: JobRequest


def read_batch(path: Path, defaults: dict[str, Any] | None = None) -> list[BatchEntry]:
    """Every job of a batch file, or the RequestError of its first bad line ("line 3: target: ...").
    `defaults` fill the options a line leaves out (the command line's --target, --budget-s)."""
    if not path.is_file():
        raise RequestError(str(path), "a directory, not a file" if path.is_dir() else "no such file")
    if defaults:  # the command line's options, named as such (not as some line's fields)
        try:
            parse_request({"program": "", **defaults})
        except RequestError as e:
            raise RequestError(f"--{e.field.replace('_', '-')}", e.message) from None
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of line 1
    except UnicodeDecodeError as e:
        raise RequestError(str(path), str(json_problem(e))) from None
    entries = []
    for n, raw in enumerate(text.splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            data = parse_json(text) if text[0] in '{["' else text
        except JSONTextError as e:
            raise RequestError(f"line {n}", str(e)) from None
        if not isinstance(data, dict) or "schema" in data:
            data = {"program": data}
        try:
            req = parse_request({**(defaults or {}), **data})
            entries.append(BatchEntry(n, req.build_program(files_under=path.parent), req))
        except RequestError as e:
            raise RequestError(f"line {n}: {e.field}", e.message) from None
    if not entries:
        raise RequestError(str(path), "holds no job")
    return entries


def run_batch(
    db: Database, entries: list[BatchEntry], *, local: bool = False, optimize: Optimize | None = None,
    on_progress: Callable[[list[JobView]], None] | None = None, poll_s: float = 0.5,
    ray_workers: int | None = None, ray_address: str | None = None, optimizer_spec: str | None = None,
) -> list[JobView]:
    """Submit every entry and wait until all have finished; `local` runs them in this process
    (only these jobs); `ray_workers` / `ray_address` run them on Ray (each task a queue worker
    over these jobs, one job per program); otherwise workers elsewhere do. `on_progress` sees
    the jobs after every change."""
    queue = JobQueue(db)
    ids = [e.request.submit_to(queue, e.program).id for e in entries]
    worker = Worker(db, optimize=optimize) if local else None
    tasks = _start_ray_workers(db, ids, ray_workers, ray_address, optimizer_spec) if ray_workers or ray_address else []
    try:
        while True:
            views = queue.get_many(ids)
            if on_progress:
                on_progress(views)
            if all(v.state.terminal for v in views):
                if tasks:
                    import ray

                    ray.get(tasks)
                return views
            if worker is None or worker.run_one(only=ids) is None:
                time.sleep(poll_s)  # workers elsewhere hold the rest
    except KeyboardInterrupt:
        if local:  # this process was their only worker: none is left to run them
            _cancel_unfinished(queue, ids)
        raise


def _cancel_unfinished(queue: JobQueue, ids: list[int]) -> int:
    """Cancel those of these jobs that have not ended (a stopped local batch: a later worker would
    run them, and the batch run again would queue them twice); how many were."""
    cancelled = 0
    for view in queue.get_many(ids):
        if not view.state.terminal:
            try:
                queue.cancel(view.id)
                cancelled += 1
            except Conflict:  # it ended meanwhile
                pass
    return cancelled


def _start_ray_workers(
    db: Database, ids: list[int], workers: int | None, address: str | None, optimizer_spec: str | None,
) -> list[Any]:
    import ray

    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    count = workers or int(ray.cluster_resources().get("CPU", 1))
    task = ray.remote(max_retries=3)(_ray_batch_worker)
    url = db.url.render_as_string(hide_password=False)
    return [task.remote(url, ids, optimizer_spec) for _ in range(count)]


def _ray_batch_worker(url: str, ids: list[int], optimizer_spec: str | None) -> int:
    """A queue worker in a Ray task: runs this batch's jobs until none is left to claim (a job
    whose task dies returns to the queue when its lease expires, like any dead worker's)."""
    from superopt.db.engine import open_database
    from superopt.worker import load_optimizer

    return Worker(open_database(url), optimize=load_optimizer(optimizer_spec)).run(once=True, only=ids)


def summary_rows(entries: list[BatchEntry], views: list[JobView]) -> list[dict[str, Any]]:
    """One row per batch line: what the summary table and `--json` show."""
    rows = []
    for e, v in zip(entries, views, strict=True):
        r = v.result or {}
        rows.append({
            "line": e.line, "job": v.id, "program": v.program_name, "hash": v.program_hash, "target": v.target,
            "state": v.state.value, "cache_hit": v.cache_hit, "time_us": r.get("time_us"),
            "baseline_time_us": r.get("baseline_time_us"), "speedup": r.get("speedup"),
            "kernel_id": r.get("kernel_id"), "cached": r.get("cached"), "error": v.error,
            # what `superopt report` charts besides speedups (the search's, for a cache hit the original's)
            "proved": r.get("proved"), "kernels": r.get("kernels"), "search_s": (r.get("search") or {}).get("seconds"),
        })
    return rows
