"""`POST /jobs` for a program the cache answers is done at once, with its result and no worker,
as `superopt optimize` is; an uncached one is still queued."""

from __future__ import annotations

from db_fixtures import optimize
from fastapi.testclient import TestClient

from superopt.db.engine import open_database
from superopt.service import create_app
from superopt.worker import Worker


def test_a_cached_program_is_answered_at_once_and_an_uncached_one_queued(tmp_path):
    db = open_database(str(tmp_path / "superopt.db"))
    with TestClient(create_app(db), base_url="http://127.0.0.1") as client:
        first = client.post("/jobs", json={"program": "lora:ci"})  # the default target: auto
        assert first.status_code == 201 and first.json()["state"] == "queued" and first.json()["result"] is None
        assert Worker(db, optimize=optimize, poll_s=0.01).run(once=True) == 1
        searched = client.get(f"/jobs/{first.json()['id']}").json()
        assert searched["state"] == "succeeded" and not searched["cache_hit"]

        again = client.post("/jobs", json={"program": "lora:ci"})
        assert again.status_code == 201, again.text
        job = again.json()
        assert job["state"] == "succeeded" and job["cache_hit"] and job["attempts"] == 0
        assert job["result"]["kernel_id"] == searched["result"]["kernel_id"]
        assert job == client.get(f"/jobs/{job['id']}").json()  # the answer is the job as GET shows it

        other = client.post("/jobs", json={"program": "ntrans:ci"})
        assert other.json()["state"] == "queued" and not other.json()["cache_hit"]
        forced = client.post("/jobs", json={"program": "lora:ci", "force": True})
        assert forced.json()["state"] == "queued"
    db.close()
