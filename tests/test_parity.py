"""One behaviour across the CLI, HTTP and Python: the same program gives the same hash, winner
sGraph, parameters and times through `superopt optimize --json`, `POST /jobs` run by a worker, and
`superopt.api.optimize`; `GET /cache` lists the rows `superopt cache ls` lists."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from typer.testing import CliRunner

from superopt import api, workloads
from superopt.cli import app
from superopt.db.engine import open_database
from superopt.service import create_app
from superopt.worker import Worker

SPEC = "gqa:ci"


def winner_fields(best: dict[str, Any]) -> dict[str, Any]:
    """What must agree wherever the winner comes from (a report's `best`, a stored kernel)."""
    return {k: best[k] for k in ("sgraph", "params", "time_us", "time_source", "dram_bytes", "flops")}


def test_cli_http_and_python_give_the_same_winner(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    program = workloads.resolve(SPEC)
    db_url = str(tmp_path / "cli.db")
    res = CliRunner().invoke(app, ["optimize", SPEC, "--target", "h100", "--db", db_url, "--json"])
    assert res.exit_code == 0, res.output
    cli = json.loads(res.stdout)

    python = api.optimize(program, target="h100", cache=False, reuse=False)
    assert python.to_json() == python.report()
    assert cli["program"]["hash"] == python.program.canonical_hash() == program.canonical_hash()
    assert winner_fields(cli["best"]) == winner_fields(python.to_json()["best"])

    db = open_database(str(tmp_path / "http.db"))
    with TestClient(create_app(db), base_url="http://127.0.0.1") as client:
        job = client.post("/jobs", json={"program": SPEC, "target": "h100"})
        assert job.status_code == 201, job.text
        assert Worker(db, poll_s=0.01).run(once=True) == 1
        result = client.get(f"/jobs/{job.json()['id']}").json()["result"]
        kernel = client.get(f"/kernels/{result['kernel_id']}").json()
    assert kernel["program"]["hash"] == cli["program"]["hash"]
    assert winner_fields(kernel) == winner_fields(cli["best"])
    db.close()


def test_get_cache_lists_the_rows_cache_ls_lists(tmp_path, monkeypatch):
    """`GET /cache` needed a hash; `cache ls` listed everything: a client could not see the cache."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    db_url = str(tmp_path / "superopt.db")
    runner = CliRunner()
    for spec in (SPEC, "lora:ci"):
        assert runner.invoke(app, ["optimize", spec, "--target", "h100", "--db", db_url]).exit_code == 0

    def cli_rows(*args: str) -> list[dict[str, Any]]:
        res = runner.invoke(app, ["cache", "ls", "--db", db_url, "--json", *args])
        assert res.exit_code == 0, res.output
        return list(json.loads(res.stdout))

    db = open_database(db_url)
    with TestClient(create_app(db), base_url="http://127.0.0.1") as client:
        def http_rows(**params: Any) -> list[dict[str, Any]]:
            res = client.get("/cache", params=params)
            assert res.status_code == 200, res.text
            return list(res.json()["entries"])

        everything = http_rows()
        assert len(everything) == 2 and everything == cli_rows()
        assert http_rows(program="lora:ci") == cli_rows("--program", "lora:ci") == everything[:1]
        assert http_rows(limit=1, offset=1) == cli_rows("--limit", "1", "--offset", "1") == everything[1:]
        assert http_rows(target="a100") == cli_rows("--target", "a100") == []
        prefix = everything[0]["program_hash"][:4]
        assert http_rows(hash=prefix) == cli_rows("--hash", prefix)
        assert client.get("/cache", params={"hash": "zz"}).json()["detail"] == runner.invoke(
            app, ["cache", "ls", "--db", db_url, "--hash", "zz"]).stderr.strip().removeprefix("error: ")
    db.close()


def test_result_summary_says_what_optimize_says_first(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    result = api.optimize(workloads.resolve(SPEC), target="h100", cache=False, reuse=False)
    lines = result.summary().splitlines()
    assert lines[0].startswith(f"program: {SPEC} ({result.program.canonical_hash()[:16]}), searched")
    assert lines[1] == "target: h100"
    assert lines[2].startswith("best: ") and f"({result.best.time_source}), {result.best.kernels} kernel(s)" in lines[2]
    assert lines[3].startswith(f"speedup: {result.speedup:.2f}x over the unfused baseline")
    assert lines[4] == "verdict: PROVED (e-graph proved)"
