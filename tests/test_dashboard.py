"""The web dashboard (superopt/dashboard.py) on SQLite: every page answers with what it should
show, the token guards it as it guards the API (with a cookie a browser can hold), and names,
which are user text, are escaped wherever they are shown."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from db_fixtures import resign, standin_result
from fastapi.testclient import TestClient
from sqlalchemy import update

from superopt import workloads
from superopt.dashboard import COOKIE, session_value
from superopt.db.cache import KernelCache
from superopt.db.engine import Database, open_database
from superopt.db.jobs import JobQueue
from superopt.db.models import Job, Workload
from superopt.service import create_app

EVIL = "<script>alert('x')</script>&co"
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, dict[str, Any]]]:
    """Two cached programs on two targets and queued jobs; one program's name is rewritten in its
    row to markup (the name grammar refuses it at the door: this is the row of an older version,
    or of someone with the database key, which the dashboard must still show as text)."""
    db = open_database(f"sqlite:///{tmp_path_factory.mktemp('dash') / 'superopt.db'}")
    cache, queue = KernelCache(db), JobQueue(db)
    stored = {
        "rms_h100": cache.store(standin_result(workloads.resolve("rmsnorm_matmul:ci"), "h100")),
        "rms_a100": cache.store(standin_result(workloads.resolve("rmsnorm_matmul:ci"), "a100")),
    }
    stored["evil"] = cache.store(standin_result(workloads.resolve("gqa:ci"), "h100"))
    stored["queued"] = queue.submit(workloads.resolve("lora:ci"), target="a100").id
    stored["evil_queued"] = queue.submit(workloads.resolve("ntrans:ci"), target="h100").id
    with db.write() as s:
        s.execute(update(Workload).where(Workload.program_hash == stored["evil"]["program"]["hash"]).values(name=EVIL))
        s.execute(update(Job).where(Job.id == stored["evil_queued"]).values(target=EVIL))
    resign(db)
    yield db, stored
    db.close()


def client(db: Database, token: str | None = None) -> TestClient:
    return TestClient(create_app(db, token=token), base_url="http://127.0.0.1")


def test_jobs_page_lists_jobs_with_state_and_polls(filled):
    db, stored = filled
    res = client(db).get("/")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/html")
    assert f'data-id="{stored["queued"]}"' in res.text and "lora:ci" in res.text and "queued" in res.text
    assert f'href="/ui/kernels/{stored["rms_h100"]["kernel_id"]}"' in res.text
    assert '<script src="/ui/static/jobs.js">' in res.text and "http" not in res.text.split("<body>")[1].replace(
        "http://www.w3.org", "")  # no CDN, no absolute URL
    jobs = client(db).get("/ui/jobs.json").json()["jobs"]
    by_id = {j["id"]: j for j in jobs}
    assert by_id[stored["queued"]]["state"] == "queued"
    done = by_id[KernelCache(db).kernel(stored["rms_h100"]["kernel_id"])["job_id"]]
    assert done["state"] == "succeeded" and done["speedup"] == pytest.approx(stored["rms_h100"]["speedup"])
    assert len(client(db).get("/ui/jobs.json", params={"limit": 2}).json()["jobs"]) == 2


def test_static_assets_are_served_locally(filled):
    db, _ = filled
    c = client(db)
    assert c.get("/ui/static/dashboard.css").headers["content-type"].startswith("text/css")
    js = c.get("/ui/static/jobs.js")
    assert js.status_code == 200 and "setTimeout(poll, 2000)" in js.text and "innerHTML" not in js.text
    for bad in ("../service.py", "..%2Fservice.py", "nope.css", ".hidden.js", "dashboard.py"):
        assert c.get(f"/ui/static/{bad}").status_code == 404, bad


def test_submit_form_queues_a_job_and_reports_errors(filled):
    db, _ = filled
    c = client(db)
    form = c.get("/ui/submit")
    assert form.status_code == 200 and 'name="program"' in form.text and '<option value="h100"' in form.text
    res = c.post("/ui/submit", data={"program": "lora:ci", "target": "h100", "budget_s": "7"}, follow_redirects=False)
    assert res.status_code == 303
    job_id = int(res.headers["location"].rsplit("=", 1)[1])
    job = JobQueue(db).get(job_id)
    assert job.program_name == "lora:ci" and job.target == "h100" and job.budget_s == 7
    pasted = workloads.resolve("ntrans:ci").to_json()
    res = c.post("/ui/submit", data={"program": json.dumps(pasted), "target": "auto"}, follow_redirects=False)
    assert res.status_code == 303 and JobQueue(db).get(int(res.headers["location"].rsplit("=", 1)[1])).program_name == "ntrans:ci"
    for data, field in [({"program": "nope:ci"}, "program"), ({"program": "gqa:ci", "budget_s": "soon"}, "budget_s"),
                        ({"program": "gqa:ci", "target": "tpu"}, "target"), ({"program": "{bad"}, "program")]:
        bad = c.post("/ui/submit", data=data)
        assert bad.status_code == 422 and f"{field}:" in bad.text, (data, bad.text)
    other_site = c.post("/ui/submit", data={"program": "gqa:ci"}, headers={"origin": "http://evil.example"})
    assert other_site.status_code == 403


def test_cache_page_groups_filters_and_shows_the_best(filled):
    db, stored = filled
    c = client(db)
    res = c.get("/ui/cache")
    assert res.status_code == 200
    assert res.text.count("rmsnorm_matmul:ci") == 2 and "proved" in res.text  # one row per target
    assert f'/ui/kernels/{stored["rms_a100"]["kernel_id"]}"' in res.text
    only = c.get("/ui/cache", params={"program": "RMSNORM", "target": "a100"}).text
    assert only.count("rmsnorm_matmul:ci") == 1 and "gqa" not in only
    h = stored["rms_h100"]["program"]["hash"]
    by_hash = c.get("/ui/cache", params={"hash": h[:8]}).text
    assert by_hash.count("<td><a href=\"/ui/kernels/") == 2 and f"{stored['rms_h100']['speedup']:.2f}×" in by_hash
    bad = c.get("/ui/cache", params={"hash": "XYZ"})
    assert bad.status_code == 422 and "hash: expected 4 to 64 lowercase hex digits" in bad.text


def test_kernel_page_shows_picture_source_parameters_and_verdict(filled):
    db, stored = filled
    c = client(db)
    kid = stored["rms_h100"]["kernel_id"]
    kernel = KernelCache(db).kernel(kid)
    res = c.get(f"/ui/kernels/{kid}")
    assert res.status_code == 200
    assert re.search(r'<div class="figure" id="sgraph"><svg ', res.text)
    for name, value in kernel["params"].items():
        assert f"<td>{name}</td><td>{value}</td>" in res.text
    assert 'id="verdict"' in res.text and "finite_field" in res.text and "X [4, 32]" in res.text
    assert "estimated" in res.text and "by the cost model" in res.text
    if kernel["cuda"]:
        assert '<span class="ln">1</span>' in res.text and f"/ui/kernels/{kid}/kernel.cu" in res.text
        cu = c.get(f"/ui/kernels/{kid}/kernel.cu")
        assert cu.text == kernel["cuda"] and "attachment" in cu.headers["content-disposition"]
    else:
        assert "No CUDA source" in res.text and c.get(f"/ui/kernels/{kid}/kernel.cu").status_code == 404
    assert c.get("/ui/kernels/99999").status_code == 404


def test_kernel_page_numbers_the_cuda_lines(filled, monkeypatch):
    db, stored = filled
    kid = stored["rms_h100"]["kernel_id"]
    real = KernelCache.kernel
    source = "__global__ void k() {\n  // a < b && c\n}\n"
    monkeypatch.setattr(KernelCache, "kernel", lambda self, i: {**real(self, i), "cuda": source})
    c = client(db)
    res = c.get(f"/ui/kernels/{kid}")
    assert '<span class="ln">3</span>}' in res.text and "// a &lt; b &amp;&amp; c" in res.text
    cu = c.get(f"/ui/kernels/{kid}/kernel.cu")
    assert cu.text == source and f'filename="kernel_{kid}.cu"' in cu.headers["content-disposition"]


def test_chart_is_an_svg_bar_per_program_and_target(filled):
    db, stored = filled
    res = client(db).get("/ui/chart")
    assert res.status_code == 200 and '<svg xmlns="http://www.w3.org/2000/svg" class="chart"' in res.text
    assert res.text.count("<rect ") == 3 and "rmsnorm_matmul:ci @ a100" in res.text
    assert f"{stored['rms_h100']['speedup']:.2f}×" in res.text
    assert client(db).get("/ui/chart", params={"target": "a100"}).text.count("<rect ") == 1


def test_names_are_escaped_everywhere(filled):
    db, stored = filled
    c = client(db)
    kid = stored["evil"]["kernel_id"]
    for path in ("/", "/ui/cache", "/ui/chart", f"/ui/kernels/{kid}", f"/ui/cache?program={EVIL}",
                 f"/ui/chart?target={EVIL}"):
        res = c.get(path)
        assert res.status_code == 200, path
        assert "<script>alert" not in res.text, path
        assert "&lt;script&gt;alert(" in res.text, path
    assert EVIL in [j["program"] for j in c.get("/ui/jobs.json").json()["jobs"]]  # JSON: the name as it is
    res = c.post("/ui/submit", data={"program": EVIL})
    assert res.status_code == 422 and "<script>alert" not in res.text and "&lt;script&gt;" in res.text


def test_the_token_is_required_and_kept_in_a_cookie(filled):
    db, _ = filled
    c = client(db, TOKEN)
    for path in ("/", "/ui/submit", "/ui/cache", "/ui/chart", "/ui/kernels/1", "/ui/kernels/1/kernel.cu"):
        res = c.get(path)
        assert res.status_code == 401 and 'name="token"' in res.text and "kernel 1" not in res.text, path
    assert c.get("/ui/jobs.json").status_code == 401 and c.get("/ui/jobs.json").json()["field"] == "authorization"
    assert c.post("/ui/submit", data={"program": "gqa:ci"}).status_code == 401
    assert c.get("/", params={"token": "wrong"}).status_code == 401
    assert c.get("/ui/static/dashboard.css").status_code == 200  # the login page's look is no secret
    # the API's bearer header opens the pages too
    assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # ?token= once: a cookie and a redirect to the address without the token
    res = c.get("/ui/cache", params={"token": TOKEN, "program": "rms"}, follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/ui/cache?program=rms"
    cookie = res.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and TOKEN not in cookie
    assert c.cookies.get(COOKIE) == session_value(TOKEN)
    assert c.get("/ui/cache").status_code == 200 and c.get("/ui/jobs.json").status_code == 200
    assert c.get("/jobs/1").status_code == 401  # the cookie is for the dashboard, not the API
    # the login form, and signing out
    other = client(db, TOKEN)
    assert other.post("/ui/login", data={"token": "nope", "next": "/ui/chart"}).status_code == 401
    res = other.post("/ui/login", data={"token": TOKEN, "next": "/ui/chart"}, follow_redirects=False)
    assert res.status_code == 303 and res.headers["location"] == "/ui/chart"
    assert other.get("/ui/chart").status_code == 200
    outside = other.post("/ui/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False)
    assert outside.headers["location"] == "/"
    other.post("/ui/logout")
    assert other.get("/ui/chart").status_code == 401
    # a forged cookie
    forged = client(db, TOKEN)
    forged.cookies.set(COOKIE, session_value("guess"))
    assert forged.get("/").status_code == 401


def test_the_host_allow_list_covers_the_dashboard(filled):
    db, _ = filled
    res = TestClient(create_app(db), base_url="http://rebound.example").get("/")
    assert res.status_code == 421
