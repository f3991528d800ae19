"""The job queue and workers on SQLite and PostgreSQL: states, leases, cancellation, cache hits,
a worker killed mid-job, and 4 submitting processes with 2 workers."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from db_fixtures import cli_env, failing_optimize, optimize, slow_optimize, superopt_process
from sqlalchemy import func, select

from superopt import workloads
from superopt.config import SearchConfig
from superopt.db.engine import open_database
from superopt.db.errors import Conflict, NotFound
from superopt.db.jobs import JobQueue, JobView
from superopt.db.models import Candidate, Job, JobState, Winner
from superopt.program import Program
from superopt.worker import Worker, cache_note, describe, resolve_fingerprint


def count(db, model, *where) -> int:
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(model).where(*where))


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def run_one(worker: Worker) -> JobView:
    view = worker.run_one()
    assert view is not None, "no job was claimed"
    return view


def test_job_lifecycle_and_fencing(db):
    queue = JobQueue(db, lease_s=30)
    job = queue.submit(workloads.resolve("lora:ci"), target="h100", budget_s=5, config=SearchConfig(max_kernel_ops=4))
    assert job.state is JobState.queued and job.attempts == 0 and job.result is None
    claim = queue.claim("w1")
    assert claim is not None and claim.job_id == job.id and claim.attempt == 1
    assert claim.budget_s == 5 and claim.config == SearchConfig(max_kernel_ops=4) and claim.program.name == "lora:ci"
    assert queue.claim("w2") is None  # nothing else queued
    assert queue.heartbeat(claim, {"states": 3, "pruned": 1, "verified": 0, "best_time_us": float("inf"), "phase": "x"})
    view = queue.get(job.id)
    assert view.state is JobState.running and view.worker_id == "w1"
    assert view.progress == {"states": 3, "pruned": 1, "verified": 0, "best_time_us": None, "phase": "x"}
    done = queue.finish(claim, optimize(claim.program, target="h100"))
    assert done is not None and done.state is JobState.succeeded and done.finished_at is not None
    assert done.result["cached"] and done.result["kernel_id"] and done.progress["phase"] == "done"
    # the claim is spent: a second finish, a heartbeat or a failure changes nothing
    assert queue.finish(claim, optimize(claim.program, target="h100")) is None
    assert not queue.heartbeat(claim) and queue.fail(claim, "late") is None
    assert count(db, Winner) == 1 and count(db, Candidate) == 2
    with pytest.raises(Conflict, match="already finished"):
        queue.cancel(job.id)
    with pytest.raises(NotFound, match="no job 999"):
        queue.get(999)


def test_expired_lease_requeues_and_the_old_claim_is_fenced_off(db):
    queue = JobQueue(db, lease_s=0.2)
    job = queue.submit(workloads.resolve("ntrans:ci"), target="h100", max_attempts=2)
    first = queue.claim("w1")
    time.sleep(0.3)
    assert queue.requeue_expired() == 1
    assert queue.get(job.id).state is JobState.queued
    second = queue.claim("w2")
    assert second is not None and second.attempt == 2
    assert not queue.heartbeat(first)  # w1 woke up late: the job is not its any more
    assert queue.finish(first, optimize(first.program, target="h100")) is None
    assert queue.finish(second, optimize(second.program, target="h100")).worker_id == "w2"
    assert count(db, Candidate) == 2 and count(db, Winner) == 1
    # a job whose workers keep dying fails after max_attempts
    doomed = queue.submit(workloads.resolve("gqa:ci"), target="h100", max_attempts=2)
    for _ in range(2):
        assert queue.claim("w3").job_id == doomed.id
        time.sleep(0.3)
    assert queue.claim("w4") is None  # the expired claim was the last allowed attempt
    failed = queue.get(doomed.id)
    assert failed.state is JobState.failed and "gave up after 2 attempts" in failed.error


def test_cache_hits_at_submit_and_at_claim_and_force(db):
    queue = JobQueue(db)
    worker = Worker(db, optimize=optimize)
    program = workloads.resolve("gated_mlp:ci")
    first = queue.submit(program, target="h100")
    assert run_one(worker).id == first.id
    hit = queue.submit(program, target="h100")  # a named target: answered at once
    assert hit.state is JobState.succeeded and hit.cache_hit and hit.attempts == 0
    assert hit.result["kernel_id"] == queue.get(first.id).result["kernel_id"] and hit.result["source_job"] == first.id
    forced = queue.submit(program, target="h100", force=True)
    assert forced.state is JobState.queued
    searched = run_one(worker)
    assert searched.id == forced.id and not searched.cache_hit and searched.result["kernel_id"] != hit.result["kernel_id"]
    assert count(db, Winner) == 1  # the forced search replaced the winner of its key
    assert count(db, Candidate) == 4
    # "auto" at submission means what it meant to the worker that last resolved it (the local
    # GPU, else h100): the second such job is answered at once, as a named target's is
    auto = queue.submit(workloads.resolve("lora:ci"))
    assert auto.state is JobState.queued and not run_one(worker).cache_hit
    again = queue.submit(workloads.resolve("lora:ci"))
    assert again.state is JobState.succeeded and again.cache_hit and again.attempts == 0
    assert again.result["kernel_id"] == queue.get(auto.id).result["kernel_id"]
    assert "input_names" not in again.result  # the same names: nothing to bind


def test_auto_at_submission_is_what_the_workers_resolved(db, monkeypatch):
    """A service without a GPU in front of workers with one must not answer their "auto" jobs
    from h100 estimates: what a worker last resolved "auto" to decides, before the submitting host."""
    from superopt.db import jobs

    monkeypatch.setattr(jobs, "_auto_fingerprint", lambda: resolve_fingerprint("h100"))  # this host: no GPU
    queue = JobQueue(db)
    program = workloads.resolve("lora:ci")
    queue.submit(program, target="h100")
    run_one(Worker(db, optimize=optimize))  # h100 estimates cached
    assert queue.submit(program).state is JobState.succeeded  # no worker resolved "auto" yet: this host's h100
    gpu_job = queue.submit(workloads.resolve("ntrans:ci"))
    with db.write() as s:  # a worker with a GPU claimed an "auto" job
        s.get(Job, gpu_job.id).target_fingerprint = "gpu:NVIDIA H200:cc=90"
    assert queue.submit(program).state is JobState.queued


def test_auto_ignores_a_cost_model_fingerprint_of_an_older_model(db, monkeypatch):
    """make demo's "auto" jobs were answered from winners an older cost model ranked: "auto" was
    what the last worker resolved, the old fingerprint. One of another model revision is not
    taken: this host's target is, and the program is searched again."""
    from superopt.db import jobs

    monkeypatch.setattr(jobs, "_auto_fingerprint", lambda: resolve_fingerprint("h100"))  # this host: no GPU
    queue = JobQueue(db)
    program = workloads.resolve("lora:ci")
    queue.submit(program, target="h100")
    run_one(Worker(db, optimize=optimize))  # h100 estimates cached, under this model's fingerprint
    old_job = queue.submit(workloads.resolve("ntrans:ci"))
    stale = resolve_fingerprint("h100").rsplit(":m", 1)[0]  # as fingerprints were before the revision
    with db.write() as s:
        s.get_one(Job, old_job.id).target_fingerprint = stale
    assert queue.submit(program).state is JobState.succeeded  # "auto": this host's h100, a hit


def test_a_job_waits_while_its_twin_runs_and_is_then_a_cache_hit(db):
    """Two workers used to search identical jobs at once, the later store replacing the earlier
    winner (whose job then named a kernel no longer cached). A job whose twin (same program,
    target and configuration) is running now waits; other jobs, and forced ones, go ahead."""
    queue = JobQueue(db)
    program = workloads.resolve("lora:ci")
    first, twin = queue.submit(program, target="h100"), queue.submit(program, target="h100")
    other = queue.submit(workloads.resolve("ntrans:ci"), target="h100")
    forced = queue.submit(program, target="h100", force=True)
    claims = [queue.claim(f"w{i}") for i in range(3)]
    assert [c.job_id for c in claims] == [first.id, other.id, forced.id]
    assert queue.claim("w3") is None and queue.get(twin.id).state is JobState.queued
    for c in claims:
        queue.finish(c, optimize(c.program, target="h100"))
    answered = run_one(Worker(db, optimize=optimize))
    assert answered.id == twin.id and answered.cache_hit
    assert answered.result["kernel_id"] == queue.get(forced.id).result["kernel_id"]  # the newest winner
    assert count(db, Winner) == 2


def test_a_job_line_says_what_happened(db):
    """A cancelled job was logged as '0.00 us (None), kernel None, not cached: not proved'; a
    proved kernel left uncached by a faster winner as 'not proved'."""
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("lora:ci"), target="h100")
    queue.cancel(job.id)
    assert describe(queue.get(job.id)) == f"job {job.id} cancelled"
    assert cache_note({"cached": False, "proved": True}) == "not cached: a faster proved winner is"
    assert cache_note({"cached": False, "proved": False}) == "not cached: not proved"


def test_a_hit_for_a_program_with_other_input_names_says_how_they_bind(db):
    """One canonical hash, inputs named the other way round: the job answered from the cache
    says which of the cached kernel's inputs is which of its own."""
    queue = JobQueue(db)
    program = workloads.resolve("rmsnorm_matmul:ci")  # X (4, 64), W (64, 48)
    queue.submit(program, target="h100")
    run_one(Worker(db, optimize=optimize))
    swapped = json.loads(json.dumps(program.to_json()).replace('"X"', '"tmp"').replace('"W"', '"X"')
                         .replace('"tmp"', '"W"'))
    hit = queue.submit(Program.from_json(swapped), target="h100")
    assert hit.cache_hit and hit.result["input_names"] == {"X": "W", "W": "X"}


def test_a_failing_search_fails_its_job_and_the_worker_goes_on(db):
    queue = JobQueue(db)
    bad = queue.submit(workloads.resolve("lora:ci"), target="h100")
    good = queue.submit(workloads.resolve("ntrans:ci"), target="h100")
    lines: list[str] = []
    assert Worker(db, optimize=failing_optimize, log=lines.append).run(once=True) == 2
    view = queue.get(bad.id)
    assert view.state is JobState.failed and view.error == "ValueError: no candidate found for lora:ci within the bounds"
    assert queue.get(good.id).state is JobState.failed
    assert lines[0] == f"job {bad.id} failed: ValueError: no candidate found for lora:ci within the bounds"
    assert count(db, Candidate) == 0 and count(db, Winner) == 0


def test_a_queued_program_a_worker_cannot_read_fails_and_the_jobs_behind_it_run(db, monkeypatch):
    """A worker whose size limits are lower than the submitter's died claiming the job (the
    program did not load), leaving it queued: every worker after it died the same way and the jobs
    behind it never ran. Such a job now fails with why, signed; the next one is claimed."""
    queue = JobQueue(db)
    big = queue.submit(workloads.resolve("lora:ci"), target="h100")  # W: 32 x 48
    tiny = Program("tiny")
    tiny.output(tiny.exp(tiny.input("X", (4, 8), "f32")))
    small = queue.submit(tiny, target="h100")
    monkeypatch.setenv("SUPEROPT_MAX_TENSOR_ELEMENTS", "100")
    claim = queue.claim("w1")
    assert claim is not None and claim.job_id == small.id
    view = queue.get(big.id)
    assert view.state is JobState.failed and view.attempts == 1
    assert view.error.startswith("the queued program cannot be read here: ") and "at most 100" in view.error


def test_a_worker_whose_cluster_is_unreachable_gives_the_job_back_and_stops(db):
    """A worker started with a Ray address nothing answers failed every job it claimed, for good
    (attempt 1 of 3, never retried): the fault is the worker's. The job goes back to the queue
    and the worker stops with the error (the command line prints it in one line)."""
    from superopt.core.errors import ClusterUnreachable

    def unreachable(*args, **kwargs):
        raise ClusterUnreachable("no Ray cluster answers at 127.0.0.1:1")

    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("lora:ci"), target="h100", force=True)
    with pytest.raises(ClusterUnreachable):
        Worker(db, optimize=unreachable, log=lambda line: None).run(once=True)
    view = queue.get(job.id)
    assert view.state is JobState.queued and view.error is None and view.worker_id is None


def test_progress_is_recorded_while_the_search_runs_and_cancelling_stops_it(db, monkeypatch):
    monkeypatch.setenv("SUPEROPT_TEST_DELAY_S", "60")
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("gqa:ci"), target="h100")
    worker = Worker(db, optimize=slow_optimize, lease_s=2)
    ended: list[JobView] = []
    t = threading.Thread(target=lambda: ended.append(run_one(worker)))
    t.start()
    seen = wait_for(lambda: (v := queue.get(job.id)).progress.get("states", 0) > 0 and v, what="progress")
    assert seen.state is JobState.running and seen.progress["phase"] == "search" and seen.attempts == 1
    later = wait_for(lambda: (v := queue.get(job.id)).progress["states"] > seen.progress["states"] and v,
                     what="more progress")
    assert later.state is JobState.running and later.progress["pruned"] == later.progress["states"] // 2
    assert queue.cancel(job.id).state is JobState.cancelled
    t.join(10)
    assert not t.is_alive(), "the worker did not notice the cancellation"
    assert ended[0].state is JobState.cancelled
    assert count(db, Candidate) == 0
    queued = queue.submit(workloads.resolve("gqa:ci"), target="h100")
    assert queue.cancel(queued.id).state is JobState.cancelled and queue.claim("w") is None


def test_a_worker_stopped_after_its_job_ended_says_how_it_ended(db, monkeypatch):
    """A worker's SIGTERM (a KeyboardInterrupt) that lands after the job's result was written
    logged "given back to the queue" (seen in CI under load), though the job had succeeded and
    stayed so; one that lands during the search gives the job back."""
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("gated_mlp:ci"), target="h100")
    finish = JobQueue.finish

    def finish_then_stop(self: JobQueue, *args: object, **kwargs: object) -> JobView | None:
        finish(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(JobQueue, "finish", finish_then_stop)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        Worker(db, optimize=optimize, log=lines.append).run_one()
    assert queue.get(job.id).state is JobState.succeeded
    assert len(lines) == 1 and lines[0].startswith(f"job {job.id} succeeded: ")

    def stopped(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    second = queue.submit(workloads.resolve("gated_mlp:ci"), target="h100", force=True)
    with pytest.raises(KeyboardInterrupt):
        Worker(db, optimize=stopped, log=lines.append).run_one()
    assert queue.get(second.id).state is JobState.queued and lines[1] == f"job {second.id} given back to the queue"


def test_killed_worker_job_is_requeued_and_completed_by_another(url, db):
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("qknorm_gqa:ci"), target="h100")
    env = cli_env(url, SUPEROPT_TEST_DELAY_S="120")
    args = ["worker", "--lease-s", "2", "--poll-s", "0.1"]
    first = superopt_process([*args, "--optimizer", "db_fixtures:slow_optimize"], env)
    try:
        wait_for(lambda: queue.get(job.id).progress.get("states", 0) > 0, what="the first worker to be searching")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    assert first.returncode == -signal.SIGKILL
    held = queue.get(job.id)
    assert held.state is JobState.running and f":{first.pid}:" in held.worker_id
    second = superopt_process([*args, "--optimizer", "db_fixtures:optimize"], env)
    try:
        done = wait_for(lambda: (v := queue.get(job.id)).state.terminal and v, what="the second worker to finish")
    finally:
        second.send_signal(signal.SIGTERM)
        out, errs = second.communicate(timeout=30)
    assert second.returncode == 0, errs
    assert done.state is JobState.succeeded and done.attempts == 2 and f":{second.pid}:" in done.worker_id
    assert f"job {job.id} succeeded" in out
    assert count(db, Winner) == 1
    assert count(db, Candidate) == 2  # only the second worker's search was stored


SUBMITTER = """
import json, sys
from superopt import workloads
from superopt.db.engine import open_database
from superopt.db.jobs import JobQueue, JobView
specs = ["ntrans:ci", "lora:ci", "rmsnorm_matmul:ci", "gated_mlp:ci"]
targets = ["h100", "a100", "auto"]
queue = JobQueue(open_database())
ids = []
for n in range(10 * int(sys.argv[1]), 10 * int(sys.argv[1]) + 10):
    ids.append(queue.submit(workloads.resolve(specs[n % 4]), target=targets[n % 3], force=n % 5 == 0).id)
print(json.dumps(ids))
"""


def test_four_submitters_and_two_workers_run_forty_jobs_exactly_once(url):
    env = cli_env(url)
    workers = [
        superopt_process(["worker", "--poll-s", "0.1", "--optimizer", "db_fixtures:optimize"], env) for _ in range(2)
    ]
    submitters = [
        subprocess.Popen([sys.executable, "-c", SUBMITTER, str(i)], env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        for i in range(4)
    ]
    ids: list[int] = []
    for p in submitters:
        out, errs = p.communicate(timeout=120)
        assert p.returncode == 0, errs
        ids += json.loads(out)
    assert len(set(ids)) == 40
    db = open_database(url)
    queue = JobQueue(db)
    try:
        wait_for(lambda: all(v.state.terminal for v in queue.get_many(ids)), timeout=120, what="all 40 jobs")
    finally:
        logs = []
        for w in workers:
            w.send_signal(signal.SIGTERM)
            out, errs = w.communicate(timeout=30)
            assert w.returncode == 0, errs
            logs.append(out)
    views = queue.get_many(ids)
    assert [v.state for v in views] == [JobState.succeeded] * 40
    assert count(db, Job) == 40
    # every job was finished once: by a worker (one log line) or at submission (a cache hit, no attempt)
    finished_by_workers = Counter(int(m) for log in logs for m in re.findall(r"^job (\d+) ", log, re.M))
    at_submit = {v.id for v in views if v.attempts == 0}
    assert all(n == 1 for n in finished_by_workers.values())
    assert set(finished_by_workers) | at_submit == set(ids) and not set(finished_by_workers) & at_submit
    assert all(v.attempts <= 1 for v in views)
    assert all(v.cache_hit for v in views if v.id in at_submit)
    searched = [v for v in views if not v.cache_hit]
    # each search stored its two candidates; cache hits stored none
    with db.read() as s:
        per_job = Counter(s.scalars(select(Candidate.job_id)))
    assert per_job == Counter({v.id: 2 for v in searched})
    assert sum(1 for v in views if v.force) == 8 and all(not v.cache_hit for v in views if v.force)
    # one winner per key: program and target as the workers resolved it ("auto": h100 without a GPU)
    keys = {(v.program_hash, resolve_fingerprint(v.target)) for v in views}
    with db.read() as s:
        winners = s.scalars(select(Winner)).all()
        assert len(winners) == len(keys) >= 8
        assert {w.job_id for w in winners} <= {v.id for v in searched}
    assert all(not v.error for v in views)
    db.close()
