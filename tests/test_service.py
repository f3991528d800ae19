"""The HTTP service over real HTTP on 127.0.0.1: a job from submission to its kernel, malformed
requests answered 4xx naming the field with nothing written, bearer tokens, body limits."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from db_fixtures import (
    BACKENDS,
    NOT_FINITE,
    cli_env,
    database_url,
    free_port,
    optimize,
    running_service,
    superopt_process,
)
from sqlalchemy import func, select

from superopt import workloads
from superopt.db.engine import open_database
from superopt.db.models import Candidate, Job, Target, Winner, Workload
from superopt.service import create_app
from superopt.worker import Worker


def rows(db) -> dict[str, int]:
    with db.read() as s:
        return {m.__tablename__: s.scalar(select(func.count()).select_from(m))
                for m in (Workload, Target, Job, Candidate, Winner)}


def wait_state(client: httpx.Client, job_id: int, timeout: float = 30.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        job = client.get(f"/jobs/{job_id}").json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.mark.parametrize("backend", BACKENDS)
def test_submit_run_and_fetch_the_kernel_over_http(backend, tmp_path):
    with database_url(backend, tmp_path) as url:
        db = open_database(url)
        stop = threading.Event()
        worker = threading.Thread(target=Worker(db, optimize=optimize, poll_s=0.05).run, kwargs={"stop": stop})
        worker.start()
        try:
            with running_service(create_app(db)) as base, httpx.Client(base_url=base, timeout=30) as client:
                assert client.get("/health").json()["status"] == "ok"
                res = client.post("/jobs", json={"program": "gqa:ci", "target": "h100", "budget_s": 30})
                assert res.status_code == 201, res.text
                job_id = res.json()["id"]
                assert res.json()["state"] == "queued"
                job = wait_state(client, job_id)
                assert job["state"] == "succeeded" and job["error"] is None and job["progress"]["phase"] == "done"
                result = job["result"]
                assert result["cached"] and result["proved"] and not result["cache_hit"]
                kernel = client.get(f"/kernels/{result['kernel_id']}").json()
                ref = workloads.reference_for("gqa:ci")[1]
                assert kernel["sgraph"] == {**ref.to_json(), "name": "gqa:ci.flashdecode"} and kernel["winner"]
                assert kernel["verdict"]["proved"] and kernel["time_us"] == result["time_us"]
                assert set(kernel["params"]) == set(ref.symbols) and "cuda" in kernel
                program_hash = workloads.resolve("gqa:ci").canonical_hash()
                entries = client.get("/cache", params={"hash": program_hash, "target": "h100"}).json()["entries"]
                assert [e["kernel_id"] for e in entries] == [result["kernel_id"]]
                assert client.get("/cache", params={"hash": program_hash, "target": "a100"}).json()["entries"] == []
                # the same request again is answered from the cache at once
                again = client.post("/jobs", json={"program": "gqa:ci", "target": "h100"}).json()
                assert again["state"] == "succeeded" and again["cache_hit"]
                assert client.get(f"/jobs/{again['id']}").json()["result"]["kernel_id"] == result["kernel_id"]
                # program JSON inline
                inline = client.post("/jobs", json={"program": workloads.resolve("lora:ci").to_json()}).json()
                assert wait_state(client, inline["id"])["result"]["program"]["name"] == "lora:ci"
                # cancel: a queued job once, then 409
                stop.set()
                worker.join()
                queued = client.post("/jobs", json={"program": "ntrans:ci", "target": "a100"}).json()
                assert client.delete(f"/jobs/{queued['id']}").json() == {"id": queued["id"], "state": "cancelled"}
                conflict = client.delete(f"/jobs/{queued['id']}")
                assert conflict.status_code == 409 and conflict.json()["field"] == "state"
        finally:
            stop.set()
            worker.join()
            db.close()


def _program_with(**change) -> dict:
    data = workloads.resolve("ntrans:ci").to_json()
    data["nodes"][0].update(change)
    return data


def _chunks():
    yield b'{"program": "'
    for _ in range(40):
        yield b"x" * 256
    yield b'"}'


BAD = [
    # (name, method, path, httpx keyword arguments, status, field, text in the detail)
    ("not json", "POST", "/jobs", {"content": b"{bad", "headers": {"content-type": "application/json"}}, 422, "body", "not valid JSON"),
    ("nested too deeply", "POST", "/jobs", {"content": b'{"program":' + b"[" * 4000 + b"]" * 4000 + b"}", "headers": {"content-type": "application/json"}}, 422, "body", "nested too deeply"),
    ("not utf-8", "POST", "/jobs", {"content": b'{"program":"\xff\xfe"}', "headers": {"content-type": "application/json"}}, 422, "body", "not UTF-8 text"),
    ("a key twice", "POST", "/jobs", {"content": b'{"program":"gqa:ci","target":"h100","target":"a100"}', "headers": {"content-type": "application/json"}}, 422, "body", "not valid JSON: the key 'target' is given twice in one object"),
    ("integer too long", "POST", "/jobs", {"content": b'{"program":"gqa:ci","max_states":' + b"9" * 5000 + b"}", "headers": {"content-type": "application/json"}}, 422, "body", "digits"),
    ("a list", "POST", "/jobs", {"json": [1, 2]}, 422, "body", "dictionary"),
    ("no program", "POST", "/jobs", {"json": {"target": "h100"}}, 422, "program", "required"),
    ("program a number", "POST", "/jobs", {"json": {"program": 3}}, 422, "program", "got int"),
    ("unknown workload", "POST", "/jobs", {"json": {"program": "nope"}}, 422, "program", "not a built-in workload"),
    ("unknown shape", "POST", "/jobs", {"json": {"program": "gqa:huge"}}, 422, "program", "has no shape 'huge'"),
    ("a file path", "POST", "/jobs", {"json": {"program": "/etc/passwd"}}, 422, "program", "not a built-in workload"),
    ("wrong schema", "POST", "/jobs", {"json": {"program": {"schema": "superopt.program/9"}}}, 422, "program", "unknown program schema"),
    ("negative dim", "POST", "/jobs", {"json": {"program": _program_with(shape=[6, -1])}}, 422, "program", "node 'H' (input): dimension -1"),
    ("bad dtype", "POST", "/jobs", {"json": {"program": _program_with(dtype="f8")}}, 422, "program", "unknown dtype 'f8'"),
    ("not finite", "POST", "/jobs", {"json": {"program": NOT_FINITE}}, 422, "program", "node 'O' (mul) is not finite in f16"),
    ("unknown target", "POST", "/jobs", {"json": {"program": "gqa:ci", "target": "tpu"}}, 422, "target", "unknown target 'tpu'"),
    ("target a number", "POST", "/jobs", {"json": {"program": "gqa:ci", "target": 5}}, 422, "target", "string"),
    ("negative budget", "POST", "/jobs", {"json": {"program": "gqa:ci", "budget_s": -1}}, 422, "budget_s", "greater than 0"),
    ("budget a word", "POST", "/jobs", {"json": {"program": "gqa:ci", "budget_s": "fast"}}, 422, "budget_s", "number"),
    ("zero states", "POST", "/jobs", {"json": {"program": "gqa:ci", "max_states": 0}}, 422, "max_states", "greater than 0"),
    ("force a word", "POST", "/jobs", {"json": {"program": "gqa:ci", "force": "yes"}}, 422, "force", "boolean"),
    ("unknown field", "POST", "/jobs", {"json": {"program": "gqa:ci", "priority": 1}}, 422, "priority", "unknown field"),
    ("unknown config field", "POST", "/jobs", {"json": {"program": "gqa:ci", "config": {"max_ops": 3}}}, 422, "config.max_ops", "unknown field"),
    ("config out of range", "POST", "/jobs", {"json": {"program": "gqa:ci", "config": {"max_kernel_ops": 0}}}, 422, "config.max_kernel_ops", "greater than or equal to 1"),
    ("not json content type", "POST", "/jobs", {"content": b'{"program": "gqa:ci"}', "headers": {"content-type": "text/plain"}}, 415, "content-type", "application/json"),
    ("too large", "POST", "/jobs", {"json": {"program": "x" * 20000}}, 413, "body", "larger than 8192 bytes"),
    ("too large, streamed", "POST", "/jobs", {"content": _chunks, "headers": {"content-type": "application/json"}}, 413, "body", "larger than 8192 bytes"),
    ("job id not a number", "GET", "/jobs/abc", {}, 422, "job_id", "integer"),
    ("no such job", "GET", "/jobs/12345", {}, 404, "id", "no job 12345"),
    ("cancel no such job", "DELETE", "/jobs/12345", {}, 404, "id", "no job 12345"),
    ("cache page of none", "GET", "/cache", {"params": {"limit": 0}}, 422, "limit", "greater than or equal to 1"),
    ("cache page too long", "GET", "/cache", {"params": {"limit": 201}}, 422, "limit", "less than or equal to 200"),
    ("cache negative offset", "GET", "/cache", {"params": {"offset": -1}}, 422, "offset", "greater than or equal to 0"),
    ("cache bad hash", "GET", "/cache", {"params": {"hash": "xyz"}}, 422, "hash", "4 to 64 lowercase hex digits"),
    ("cache upper-case hash", "GET", "/cache", {"params": {"hash": "ABCDEF"}}, 422, "hash", "got 'ABCDEF'"),
    ("cache short hash", "GET", "/cache", {"params": {"hash": "abc"}}, 422, "hash", "4 to 64 lowercase hex digits"),
    ("no such kernel", "GET", "/kernels/777", {}, 404, "id", "no kernel 777"),
    ("job id past 64 bits", "GET", "/jobs/99999999999999999999", {}, 404, "id", "no job 99999999999999999999"),
    ("cancel id past 64 bits", "DELETE", "/jobs/99999999999999999999", {}, 404, "id", "no job 99999999999999999999"),
    ("kernel id past 64 bits", "GET", "/kernels/99999999999999999999", {}, 404, "id", "no kernel 99999999999999999999"),
    ("states past any budget", "POST", "/jobs", {"json": {"program": "gqa:ci", "max_states": 2**63}}, 422, "max_states", "less than or equal to"),
    ("dtype a list", "POST", "/jobs", {"json": {"program": _program_with(dtype=["f16"])}}, 422, "program", "unknown dtype ['f16']"),
    ("cache misspelt filter", "GET", "/cache", {"params": {"hsah": "abcdef"}}, 422, "hsah", "unknown query parameter (this route takes one of hash, limit, offset, program, target)"),
    ("job a query parameter", "GET", "/jobs/1", {"params": {"verbose": "1"}}, 422, "verbose", "takes none"),
    ("cache hostile parameter", "GET", "/cache", {"params": {"\x1b[2J": "1"}}, 422, "query", "unknown parameter '\\x1b[2J'"),
    ("submit a query parameter", "POST", "/jobs?force=1", {"json": {"program": "gqa:ci"}}, 422, "force", "unknown query parameter"),
    ("cache filter given twice", "GET", "/cache?hash=abcd&hash=ef01", {}, 422, "hash", "given more than once"),
    ("json-like content type", "POST", "/jobs", {"content": b'{"program": "gqa:ci"}', "headers": {"content-type": "application/jsonx"}}, 415, "content-type", "expected application/json, got application/jsonx"),
]


@pytest.fixture(scope="module")
def bad_service(tmp_path_factory):
    db = open_database(str(tmp_path_factory.mktemp("svc") / "superopt.db"))
    with running_service(create_app(db, max_body_bytes=8192)) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield db, client
    db.close()


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "field", "text"),
                         [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_malformed_requests_are_refused_naming_the_field_and_write_nothing(bad_service, method, path, kwargs, status,
                                                                          field, text):
    db, client = bad_service
    before = rows(db)
    options: dict[str, Any] = {k: v() if callable(v) else v for k, v in kwargs.items()}
    res = client.request(method, path, **options)
    assert res.status_code == status, res.text
    body = res.json()
    assert body["field"] == field and body["detail"].startswith(f"{field}: ") and text in body["detail"], body
    assert "Traceback" not in res.text
    assert rows(db) == before == {"workload": 0, "target": 0, "job": 0, "candidate": 0, "winner": 0}


def test_a_token_is_required_when_set(tmp_path):
    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    port = free_port()
    server = superopt_process(["serve", "--port", str(port)], cli_env(url, SUPEROPT_TOKEN="s3cret-token"))
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"{base}/health").json()["status"] == "ok"  # open: says nothing about data
                break
            except httpx.TransportError:
                assert time.monotonic() < end and server.poll() is None, "superopt serve did not start"
                time.sleep(0.1)
        body = {"program": "ntrans:ci", "target": "h100"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"},
                        {"Authorization": "Bearer s3cret-token-and-more"}):
            for method, path in (("POST", "/jobs"), ("GET", "/jobs/1"), ("DELETE", "/jobs/1"),
                                 ("GET", "/cache?hash=abcdef"), ("GET", "/kernels/1")):
                res = httpx.request(method, base + path, headers=headers, json=body if method == "POST" else None)
                assert res.status_code == 401, (headers, path, res.text)
                assert res.json()["field"] == "authorization" and res.headers["www-authenticate"] == "Bearer"
        db = open_database(url)
        assert rows(db)["job"] == 0
        auth = {"Authorization": "Bearer s3cret-token"}
        res = httpx.post(f"{base}/jobs", json=body, headers=auth)
        assert res.status_code == 201, res.text
        assert httpx.get(f"{base}/jobs/{res.json()['id']}", headers=auth).json()["state"] == "queued"
        assert rows(db)["job"] == 1
        db.close()
    finally:
        server.terminate()
        server.communicate(timeout=30)
