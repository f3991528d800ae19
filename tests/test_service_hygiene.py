"""HTTP hygiene of the service: idempotent submissions (Idempotency-Key), "auto" and the target it
resolves to searched once, the API docs behind the token, the Host allow-list, a deadline for
request bodies (a raw socket against a real uvicorn), and health checks that say whether the
database answers (503 with Retry-After while it does not)."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from db_fixtures import optimize, running_service
from fastapi.testclient import TestClient
from sqlalchemy import event, exc, func, select

from superopt import workloads
from superopt.db.engine import Database, open_database
from superopt.db.jobs import JobQueue
from superopt.db.models import Job, JobState
from superopt.service import create_app, host_name
from superopt.worker import Worker

LOOPBACK = "http://127.0.0.1"


def jobs(db: Database) -> int:
    with db.read() as s:
        return int(s.scalar(select(func.count()).select_from(Job)))


@contextmanager
def outage(db: Database, error: Exception | None = None) -> Iterator[None]:
    """Every statement of `db` fails as a stopped PostgreSQL server makes it fail (or with `error`)."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise exc.OperationalError("SELECT 1", {}, error or ConnectionRefusedError("connection refused"))

    event.listen(db.engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        event.remove(db.engine, "before_cursor_execute", refuse)


# -- Idempotency-Key ----------------------------------------------------------------------------


def test_a_retried_submission_answers_the_same_job(db):
    client = TestClient(create_app(db), base_url=LOOPBACK)
    body = {"program": "lora:ci", "target": "h100", "budget_s": 30}
    key = {"Idempotency-Key": "7f9c2ba4-e88f-4a1d-9b1e-0c6b1f3a2d10"}
    first = client.post("/jobs", json=body, headers=key)
    assert first.status_code == 201, first.text
    # the same request, written otherwise (key order, spacing, the program inline)
    inline = {"budget_s": 30, "target": "h100", "program": workloads.resolve("lora:ci").to_json()}
    for again in (client.post("/jobs", json=body, headers=key),
                  client.post("/jobs", content=json.dumps(inline, indent=3), headers={**key, "content-type": "application/json"})):
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"], again.text
    assert jobs(db) == 1
    other = client.post("/jobs", json={**body, "budget_s": 31}, headers=key)
    assert other.status_code == 422 and other.json()["field"] == "idempotency-key", other.text
    assert f"already used for job {first.json()['id']} with a different request" in other.json()["detail"]
    assert client.post("/jobs", json=body, headers={"Idempotency-Key": "another"}).json()["id"] != first.json()["id"]
    assert client.post("/jobs", json=body).json()["id"] != first.json()["id"]  # no key: a new job each time
    assert jobs(db) == 3


def test_racing_submissions_with_one_key_make_one_job(db):
    app = create_app(db)
    with running_service(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        def post(_: int) -> httpx.Response:
            return client.post("/jobs", json={"program": "ntrans:ci", "target": "a100"},
                               headers={"Idempotency-Key": "race-1"})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(post, range(16)))
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1 and jobs(db) == 1


# -- "auto" and the target it resolves to ------------------------------------------------------


@pytest.mark.parametrize("order", [("auto", "h100"), ("h100", "auto")])
def test_auto_and_the_target_it_resolves_to_search_once(db, order):
    """Without a GPU, "auto" means h100 estimates: the second job waits for the first and is then
    a cache hit, where both used to search."""
    queue = JobQueue(db)
    program = workloads.resolve("gated_mlp:ci")
    first, second = (queue.submit(program, target=t) for t in order)
    claim = queue.claim("w1")
    assert claim is not None and claim.job_id == first.id
    assert queue.claim("w2") is None and queue.get(second.id).state is JobState.queued
    queue.finish(claim, optimize(claim.program, target=claim.target))
    answered = Worker(db, optimize=optimize).run_one()
    assert answered is not None and answered.id == second.id and answered.cache_hit
    assert answered.result["kernel_id"] == queue.get(first.id).result["kernel_id"]


def test_a_requeued_job_forgets_how_auto_was_resolved(db):
    queue = JobQueue(db, lease_s=0.1)
    job = queue.submit(workloads.resolve("lora:ci"))
    assert queue.claim("w1") is not None
    with db.read() as s:
        assert s.get_one(Job, job.id).target_fingerprint.startswith("costmodel:h100:")
    time.sleep(0.2)
    assert queue.requeue_expired() == 1
    with db.read() as s:
        assert s.get_one(Job, job.id).target_fingerprint is None


# -- the API docs behind the token ---------------------------------------------------------------


def test_the_docs_need_the_token_when_one_is_set(tmp_path):
    db = open_database(str(tmp_path / "superopt.db"))
    guarded = TestClient(create_app(db, token="s3cret"), base_url=LOOPBACK)
    open_ = TestClient(create_app(db), base_url=LOOPBACK)
    for path in ("/docs", "/redoc", "/openapi.json"):
        refused = guarded.get(path)
        assert refused.status_code == 401 and refused.json()["field"] == "authorization", path
        assert guarded.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200, path
        assert open_.get(path).status_code == 200, path
    spec = guarded.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).json()
    assert "/jobs" in spec["paths"] and "/docs" not in spec["paths"]
    assert guarded.get("/health/live").status_code == 200  # health checks stay open for probes
    db.close()


def test_an_unknown_route_and_a_wrong_method_answer_the_error_body_of_every_route(tmp_path):
    """404 and 405 answered {"detail": "Not Found"} alone, where http.md promises every error
    a `field` too; 405 still says which methods the route takes."""
    db = open_database(str(tmp_path / "superopt.db"))
    client = TestClient(create_app(db), base_url=LOOPBACK)
    missing, wrong = client.get("/nope"), client.delete("/health")
    assert (missing.status_code, missing.json()) == (404, {"detail": "path: not found", "field": "path"})
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "method: method not allowed", "field": "method"})
    assert wrong.headers["allow"] == "GET"
    db.close()


def test_the_access_log_hides_the_sign_in_token(tmp_path):
    """The dashboard's sign-in link carries the token in its address (`/?token=`), which uvicorn's
    access log wrote out whole. `serve` filters that logger; uvicorn's own logging setup, made
    when it starts, keeps the filter."""
    import logging

    import uvicorn

    from superopt.service import HiddenTokens

    access = logging.getLogger("uvicorn.access")
    hidden = HiddenTokens()
    access.addFilter(hidden)
    try:
        uvicorn.Config(create_app(open_database(str(tmp_path / "superopt.db"))))  # configures uvicorn's loggers
        assert hidden in access.filters
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                   ("127.0.0.1:5", "GET", "/jobs/3?x=1&token=s3cret&y=2", "1.1", 303), None)
        assert hidden.filter(record) and "s3cret" not in record.getMessage()
        assert record.getMessage() == '127.0.0.1:5 - "GET /jobs/3?x=1&token=***&y=2 HTTP/1.1" 303'
    finally:
        access.removeFilter(hidden)


# -- the Host allow-list -------------------------------------------------------------------------


def test_host_names_are_compared_without_port_brackets_or_case():
    assert [host_name(h) for h in ("LocalHost:8000", "[::1]:80", "[::1]", "127.0.0.1", "::1", "api.example.")] == [
        "localhost", "::1", "::1", "127.0.0.1", "::1", "api.example"]
    # After the brackets only a port may follow: "[::1]evil" was read as ::1 and let through.
    assert [host_name(h) for h in ("[::1]evil", "[::1]:80x", "[::1]:")] == ["[::1]evil", "[::1]:80x", "[::1]:"]


def test_only_allowed_host_names_are_served(tmp_path):
    db = open_database(str(tmp_path / "superopt.db"))
    default = TestClient(create_app(db))
    for host in ("localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
        assert default.get("/health/live", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "localhost.evil.example", "",
                 "testserver"):
        res = default.get("/health/live", headers={"Host": host})
        assert res.status_code == 421 and res.json()["field"] == "host", (host, res.text)
    assert jobs(db) == 0
    configured = TestClient(create_app(db, allowed_hosts=["api.example"]))
    assert configured.get("/health/live", headers={"Host": "api.example:443"}).status_code == 200
    assert configured.get("/health/live", headers={"Host": "localhost"}).status_code == 421
    anything = TestClient(create_app(db, allowed_hosts=["*"]))
    assert anything.get("/health/live", headers={"Host": "whatever.example"}).status_code == 200
    db.close()


# -- a deadline for request bodies -------------------------------------------------------------


def test_a_client_that_sends_less_than_it_announced_is_cut_off(tmp_path):
    db = open_database(str(tmp_path / "superopt.db"))
    with running_service(create_app(db, body_timeout_s=1.0)) as base:
        port = httpx.URL(base).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            start = time.monotonic()
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"program\": ")
            received = b""
            while chunk := sock.recv(4096):  # read until the server closes the connection
                received += chunk
            waited = time.monotonic() - start
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert b"did not arrive within 1 s" in received and b"connection: close" in received.lower()
        assert 0.9 < waited < 5, waited
        # a body that arrives in pieces within the deadline is read
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            body = json.dumps({"program": "lora:ci", "target": "h100"}).encode()
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
            time.sleep(0.4)
            sock.sendall(body[10:])
            assert sock.recv(4096).startswith(b"HTTP/1.1 201 ")
    assert jobs(db) == 1
    db.close()


# -- health and database outages ------------------------------------------------------------


def test_health_says_whether_the_database_answers_and_routes_answer_503_meanwhile(db):
    client = TestClient(create_app(db), base_url=LOOPBACK)
    job = client.post("/jobs", json={"program": "lora:ci", "target": "h100"}).json()
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["database"] == "ok" and health["version"]
    assert client.get("/health/ready").json() == {"status": "ok", "database": "ok"}
    with outage(db):
        assert client.get("/health/live").status_code == 200
        for method, path in (("GET", "/health"), ("GET", "/health/ready"), ("GET", f"/jobs/{job['id']}"),
                             ("DELETE", f"/jobs/{job['id']}"), ("GET", "/cache?hash=abcdef"), ("GET", "/kernels/1"),
                             ("POST", "/jobs")):
            res = client.request(method, path, json={"program": "ntrans:ci"} if method == "POST" else None)
            assert res.status_code == 503 and res.headers["retry-after"] == "5", (path, res.text)
            assert "Traceback" not in res.text
        assert client.get("/health").json()["database"] == "unreachable"
        assert client.get("/health/ready").json()["field"] == "database"
    assert client.get("/health/ready").status_code == 200
    assert client.get(f"/jobs/{job['id']}").json()["state"] == "queued" and jobs(db) == 1


def refusing_writes(db: Database) -> Database:
    """`db` as a read-only SQLite file answers (what `chattr +i` makes of it)."""
    event.listen(db.engine, "connect", lambda conn, _record: conn.execute("PRAGMA query_only = ON"))
    db.engine.dispose()
    return db


def test_a_database_that_refuses_writes_answers_503_naming_it_and_reads_still_answer(tmp_path):
    """POST /jobs against an immutable SQLite file answered a bare 500 (and the CLI a traceback)."""
    db = open_database(str(tmp_path / "superopt.db"))
    client = TestClient(create_app(db), base_url=LOOPBACK, raise_server_exceptions=False)
    job = client.post("/jobs", json={"program": "lora:ci", "target": "h100"}).json()
    refusing_writes(db)
    for method, path in (("POST", "/jobs"), ("DELETE", f"/jobs/{job['id']}")):
        res = client.request(method, path, json={"program": "ntrans:ci", "target": "h100"} if method == "POST" else None)
        assert res.status_code == 503 and res.json() == {
            "detail": "database: refuses writes (attempt to write a readonly database); nothing was written",
            "field": "database"}, res.text
    assert client.get(f"/jobs/{job['id']}").json()["state"] == "queued" and jobs(db) == 1
    db.close()


def test_the_command_line_says_a_database_that_refuses_writes_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from superopt.cli import app
    from superopt.db import engine

    url = str(tmp_path / "superopt.db")
    open_database(url).close()
    monkeypatch.setattr(engine, "open_database", lambda *a, **k: refusing_writes(open_database(*a, **k)))
    res = CliRunner().invoke(app, ["submit", "ntrans:ci", "--target", "h100", "--db", url])
    assert res.exit_code == 2 and res.stderr == \
        "error: the database refuses writes (attempt to write a readonly database); nothing was written\n", res.output


def test_a_database_file_deleted_under_the_service_is_unreachable_not_written(tmp_path):
    """Deleted while the service ran, the SQLite file went on taking jobs through the pool's
    connections to the unlinked file, where no worker would ever see them."""
    path = tmp_path / "superopt.db"
    db = open_database(str(path))
    client = TestClient(create_app(db), base_url=LOOPBACK)
    assert client.post("/jobs", json={"program": "lora:ci", "target": "h100"}).status_code == 201
    for f in tmp_path.glob("superopt.db*"):
        f.unlink()
    assert client.get("/health/ready").status_code == 503
    res = client.post("/jobs", json={"program": "ntrans:ci", "target": "h100"})
    assert res.status_code == 503 and res.json()["field"] == "database" and res.headers["retry-after"] == "5"
    assert not path.exists()
    db.close()


def test_a_wrong_statement_is_a_500_not_a_503(tmp_path):
    """SQLite raises OperationalError for a missing table as for a locked file: only the latter
    is worth a retry."""
    db = open_database(str(tmp_path / "superopt.db"))
    client = TestClient(create_app(db), base_url=LOOPBACK, raise_server_exceptions=False)
    with outage(db, sqlite3.OperationalError("no such table: job")):
        assert client.get("/jobs/1").status_code == 500
    with outage(db, sqlite3.OperationalError("database is locked")):
        assert client.get("/jobs/1").status_code == 503
    db.close()


def test_a_body_deadline_does_not_hold_other_clients(tmp_path):
    """While one client holds a short body, others are served at once."""
    db = open_database(str(tmp_path / "superopt.db"))
    with running_service(create_app(db, body_timeout_s=3.0)) as base, httpx.Client(base_url=base) as client:
        port = httpx.URL(base).port
        assert port is not None
        held = socket.create_connection(("127.0.0.1", port))
        held.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
        time.sleep(0.2)
        start = time.monotonic()
        assert client.get("/health/ready").status_code == 200
        assert time.monotonic() - start < 1
        held.close()
    db.close()
