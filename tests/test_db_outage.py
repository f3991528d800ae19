"""Workers and the service outlive the database.

- `Retry`: bounded, jittered exponential backoff through the errors of an unreachable database,
  and none for wrong statements.
- Workers in this process against a database whose every statement fails for a while (as a
  stopped server makes them fail), on SQLite and PostgreSQL: a job's end is written once the
  database is back; a worker whose retry window ends gives up and the next worker re-leases its
  job once the lease expires.
- A real PostgreSQL server (a throwaway one this module starts, stops and starts again) down for
  6 s and for 18 s under two worker processes, one finishing a job and one idle, and the HTTP
  service: no worker exits, each job ends exactly once, the service answers 503 meanwhile.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from db_fixtures import (
    DELAY_ENV,
    cli_env,
    free_port,
    optimize,
    running_service,
    slow_optimize,
    superopt_process,
)
from sqlalchemy import event, exc, func, select

from superopt import workloads
from superopt.db.engine import Database, DatabaseUnavailable, Retry, open_database, unavailable
from superopt.db.jobs import JobQueue
from superopt.db.models import Candidate, JobState
from superopt.service import create_app
from superopt.worker import Worker


def refused() -> exc.OperationalError:
    return exc.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))


@contextmanager
def outage(db: Database) -> Iterator[None]:
    """Every statement of `db` fails as a stopped PostgreSQL server makes it fail."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise refused()

    event.listen(db.engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        event.remove(db.engine, "before_cursor_execute", refuse)


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- Retry ----------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_with_jitter():
    retry = Retry(first_s=0.25, max_s=5.0)
    for failures in range(1, 12):
        ceiling = min(5.0, 0.25 * 2 ** (failures - 1))
        delays = [retry.delay(failures) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered: workers that lost the database together do not return in step


def test_a_call_is_retried_through_an_outage_and_the_recovery_logged():
    lines: list[str] = []
    failures = iter([refused(), refused()])

    def call() -> str:
        if (e := next(failures, None)) is not None:
            raise e
        return "done"

    assert Retry(first_s=0.01, max_s=0.02, log=lines.append)("claim", call) == "done"
    assert [re.sub(r"\d+\.\d+", "T", line) for line in lines] == [
        "database unreachable (claim, try 1): connection refused; next try in T s",
        "database unreachable (claim, try 2): connection refused; next try in T s",
        "database reachable again (claim) after T s",
    ]


def test_the_retry_window_is_bounded_and_a_stop_ends_it_after_one_more_try():
    def down() -> None:
        raise refused()

    start = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match=r"database unreachable for 0\.\d s \(finish\): connection refused"):
        Retry(window_s=0.5, first_s=0.05, max_s=0.1)("finish", down)
    assert 0.5 <= time.monotonic() - start < 1.0
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="stopped while the database was unreachable"):
        Retry(window_s=60, first_s=5, max_s=5, stop=stop)("claim", down)
    assert time.monotonic() - start < 1.0

    def back_at_the_stop() -> str:
        if not stop.is_set():
            raise refused()
        return "written"

    stop.clear()
    threading.Timer(0.2, stop.set).start()
    assert Retry(window_s=60, first_s=5, max_s=5, stop=stop)("finish", back_at_the_stop) == "written"


def test_what_counts_as_an_unreachable_database():
    def wrapped(kind: type[exc.DBAPIError], orig: Exception) -> exc.DBAPIError:
        return kind("SELECT 1", {}, orig)

    assert unavailable(wrapped(exc.OperationalError, psycopg.OperationalError("connection refused")))
    assert unavailable(wrapped(exc.OperationalError, sqlite3.OperationalError("database is locked")))
    assert unavailable(wrapped(exc.OperationalError, sqlite3.OperationalError("unable to open database file")))
    assert unavailable(exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"))
    assert not unavailable(wrapped(exc.OperationalError, sqlite3.OperationalError("no such table: job")))
    assert not unavailable(wrapped(exc.IntegrityError, psycopg.IntegrityError("duplicate key")))
    assert not unavailable(ValueError("not a database error"))


def test_a_wrong_statement_is_not_retried():
    calls = []

    def wrong() -> None:
        calls.append(1)
        raise exc.IntegrityError("INSERT", {}, ValueError("duplicate key"))

    with pytest.raises(exc.IntegrityError):
        Retry(first_s=0.01)("finish", wrong)
    assert len(calls) == 1


# -- workers in this process ----------------------------------------------------------------------


class Running(threading.Thread):
    """A worker's `run` in a thread, keeping what it raised."""

    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.worker, self.stop, self.error = worker, stop, None

    def run(self) -> None:
        try:
            self.worker.run(stop=self.stop)
        except BaseException as e:  # the test reports it
            self.error = e


def test_a_jobs_end_is_written_once_the_database_is_back(db, monkeypatch):
    monkeypatch.setenv(DELAY_ENV, "2")
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("lora:ci"), target="h100")
    busy_log: list[str] = []
    idle_log: list[str] = []
    stop = threading.Event()
    busy = Running(Worker(db, optimize=slow_optimize, lease_s=10, poll_s=0.05, log=busy_log.append), stop)
    idle = Running(Worker(db, optimize=slow_optimize, lease_s=10, poll_s=0.05, log=idle_log.append), stop)
    busy.start()
    wait_for(lambda: queue.get(job.id).progress.get("states", 0) > 0, what="the search")
    idle.start()
    try:
        with outage(db):
            time.sleep(3)  # a heartbeat fails, the search ends (after 2 s), its end cannot be written
            assert busy.is_alive() and idle.is_alive()
        done = wait_for(lambda: (v := queue.get(job.id)).state.terminal and v, what="the job's end")
    finally:
        stop.set()
        busy.join(30)
        idle.join(30)
    assert busy.error is None and idle.error is None
    assert done.state is JobState.succeeded and done.attempts == 1 and done.worker_id == busy.worker.id
    assert any(line.startswith("database unreachable (finish, try 1)") for line in busy_log), busy_log
    assert any(line.startswith("database reachable again (finish)") for line in busy_log), busy_log
    assert any(line.startswith(f"job {job.id}: lease not renewed") for line in busy_log), busy_log
    assert any(line.startswith("database unreachable (claim") for line in idle_log), idle_log
    assert any(line.startswith(f"job {job.id} succeeded") for line in busy_log), busy_log
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(Candidate)) == 2


def test_a_worker_out_of_retries_leaves_its_job_to_the_next_once_the_lease_expires(db, monkeypatch):
    monkeypatch.setenv(DELAY_ENV, "0.5")
    queue = JobQueue(db)
    job = queue.submit(workloads.resolve("ntrans:ci"), target="h100")
    lines: list[str] = []
    first = Worker(db, optimize=slow_optimize, lease_s=1.0, db_retry_s=0.5, log=lines.append)
    raised: list[BaseException] = []
    thread = threading.Thread(target=lambda: raised.append(_raised(first.run_one)))
    thread.start()
    wait_for(lambda: queue.get(job.id).progress.get("states", 0) > 0, what="the search")
    with outage(db):
        thread.join(30)
    assert isinstance(raised[0], DatabaseUnavailable) and "(finish)" in str(raised[0])
    assert f"job {job.id}: not ended here; it returns to the queue when its lease expires" in lines
    assert queue.get(job.id).state is JobState.running  # until its lease expires
    second = Worker(db, optimize=optimize)
    done = wait_for(lambda: second.run_one(), what="the lease to expire")
    assert done.id == job.id and done.state is JobState.succeeded and done.attempts == 2
    assert done.worker_id == second.id


def _raised(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except BaseException as e:  # the test inspects it
        return e
    return None


# -- a real PostgreSQL server, stopped and started -------------------------------------------------


@dataclass
class PgServer:
    """A throwaway PostgreSQL cluster in a temporary directory that the test may stop and start."""

    bin: Path
    data: Path
    port: int
    prefix: list[str]  # runuser -u postgres -- when this runs as root (initdb refuses root)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.prefix, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-o",
                 f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off", "start")

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")


def _pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


@pytest.fixture
def pg_server() -> Iterator[PgServer]:
    """Its own server (the test stops it), so SUPEROPT_TEST_PG_URL's is neither needed nor disturbed."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("pg_ctl not found (PostgreSQL's server binaries): the outage test stops and starts its own server")
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run a PostgreSQL server as")
        prefix = ["runuser", "-u", "postgres", "--"]
    data = Path(tempfile.mkdtemp(prefix="superopt-outage-pg-"))
    if prefix:
        os.chown(data, owner.pw_uid, owner.pw_gid)
    server = PgServer(bin_dir, data, free_port(), prefix)
    try:
        server.run("initdb", "-D", str(data), "--auth=trust", "--username=postgres", "--no-sync")
        server.start()
        yield server
    finally:
        subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def _statuses_while(client: httpx.Client, job_id: int, seconds: float) -> dict[str, set[int]]:
    """What the service answers, polled every 0.5 s for `seconds`."""
    seen: dict[str, set[int]] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for path in (f"/jobs/{job_id}", "/health/ready", "/health/live"):
            res = client.get(path)
            assert res.status_code != 503 or res.headers.get("retry-after") == "5", res.headers
            seen.setdefault(path.rsplit("/", 1)[-1] if "health" in path else "job", set()).add(res.status_code)
        time.sleep(0.5)
    return seen


def _job_state(client: httpx.Client, job_id: int) -> dict[str, Any] | None:
    res = client.get(f"/jobs/{job_id}")
    return res.json() if res.status_code == 200 and res.json()["state"] in ("succeeded", "failed") else None


@pytest.mark.postgres
def test_two_workers_and_the_service_outlive_postgresql_restarts(pg_server, capsys):
    db = open_database(pg_server.url)
    env = cli_env(pg_server.url, **{DELAY_ENV: "3"})
    args = ["worker", "--poll-s", "0.2", "--lease-s", "10", "--optimizer", "db_fixtures:slow_optimize"]
    workers = [superopt_process(args, env) for _ in range(2)]
    report: list[str] = []
    try:
        for w in workers:  # each has opened the database (a worker starting during an outage exits, exit 2)
            assert w.stderr is not None and w.stderr.readline().startswith("worker "), "a worker did not start"
        with running_service(create_app(db)) as base, httpx.Client(base_url=base, timeout=30) as client:
            for outage_s, spec in ((6, "lora:ci"), (18, "ntrans:ci")):
                job_id = client.post("/jobs", json={"program": spec, "target": "h100"}).json()["id"]
                wait_for(lambda: client.get(f"/jobs/{job_id}").json()["progress"].get("states", 0) > 0,  # noqa: B023
                         what="a worker searching")
                pg_server.stop()  # the search (3 s) ends during the outage
                seen = _statuses_while(client, job_id, outage_s)
                pg_server.start()
                back = time.monotonic()
                done = wait_for(lambda: _job_state(client, job_id), what="the job's end")  # noqa: B023
                report.append(f"outage {outage_s} s: service answered {seen}; job {job_id} {done['state']} "
                              f"{time.monotonic() - back:.1f} s after the server was back (attempt {done['attempts']})")
                assert seen == {"job": {503}, "ready": {503}, "live": {200}}
                assert done["state"] == "succeeded"
                assert [w.poll() for w in workers] == [None, None], "a worker exited"
                assert client.get("/health/ready").status_code == 200
            ids = [job_id - 1, job_id]
    finally:
        logs = []
        for w in workers:
            w.send_signal(signal.SIGTERM)
            out, errs = w.communicate(timeout=60)
            logs.append(out)
            print(f"worker {w.pid} (exit {w.returncode}):\n{out}{errs}")  # shown when the test fails
    assert [w.returncode for w in workers] == [0, 0], errs
    text = "".join(logs)
    for job_id in ids:  # each job ended once: by one worker, one search stored
        assert len(re.findall(rf"^job {job_id} succeeded", text, re.M)) == 1, text
        with db.read() as s:
            assert s.scalar(select(func.count()).select_from(Candidate).where(Candidate.job_id == job_id)) == 2
    assert "database unreachable (finish" in text and "database reachable again (finish)" in text, text
    assert "database unreachable (claim" in text, text
    db.close()
    with capsys.disabled():
        print("\n" + "\n".join(report))
