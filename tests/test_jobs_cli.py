"""The job and cache commands: submit, worker, status, watch, cancel, cache ls/show/export/invalidate."""

from __future__ import annotations

import json
import threading

from db_fixtures import slow_optimize
from typer.testing import CliRunner

from superopt.cli import app
from superopt.core.result import Result
from superopt.db.engine import open_database
from superopt.db.jobs import JobQueue
from superopt.worker import Worker

runner = CliRunner()


def invoke(db: str, *args: str):
    return runner.invoke(app, [*args, "--db", db])


def test_submit_work_and_query(tmp_path):
    db = str(tmp_path / "superopt.db")
    res = invoke(db, "submit", "gqa:ci", "--target", "h100", "--budget-s", "20", "--json")
    assert res.exit_code == 0, res.output
    job = json.loads(res.stdout)
    assert job["state"] == "queued" and job["budget_s"] == 20 and job["target"] == "h100"
    res = invoke(db, "worker", "--once", "--optimizer", "db_fixtures:optimize")
    assert res.exit_code == 0, res.output
    assert f"job {job['id']} succeeded:" in res.stdout and "1 job(s), queue empty" in res.stderr
    status = json.loads(invoke(db, "status", str(job["id"]), "--json").stdout)
    assert status["state"] == "succeeded" and status["result"]["cached"]
    kernel_id = status["result"]["kernel_id"]
    assert "speedup" in invoke(db, "status", str(job["id"])).stdout
    res = invoke(db, "submit", "gqa:ci", "--target", "h100")
    assert res.stdout.strip() == f"job {job['id'] + 1} succeeded from the cache (kernel {kernel_id})"

    entries = json.loads(invoke(db, "cache", "ls", "--json").stdout)
    assert [e["kernel_id"] for e in entries] == [kernel_id] and entries[0]["target"] == "h100"
    assert "gqa:ci" in invoke(db, "cache", "ls", "--target", "h100").stdout
    assert json.loads(invoke(db, "cache", "ls", "--target", "a100", "--json").stdout) == []
    assert invoke(db, "cache", "ls", "--target", "a100").stdout.strip() == "no cached winner matches"
    by_hash = json.loads(invoke(db, "cache", "ls", "--hash", entries[0]["program_hash"][:4], "--json").stdout)
    assert [e["kernel_id"] for e in by_hash] == [kernel_id]
    shown = invoke(db, "cache", "show", str(kernel_id))
    assert shown.exit_code == 0 and "cached winner" in shown.stdout and "graph-defined" in shown.stdout
    assert json.loads(invoke(db, "cache", "show", str(kernel_id), "--json").stdout)["verdict"]["proved"]
    out = tmp_path / "report.json"
    assert invoke(db, "cache", "export", str(kernel_id), "--out", str(out)).exit_code == 0
    assert Result.from_report(json.loads(out.read_text())).cache_hit
    res = invoke(db, "cache", "invalidate")
    assert res.exit_code == 2 and "name a kernel id, --hash, --target or --all" in res.stderr
    for narrowed in ((str(kernel_id),), ("--target", "a100")):  # --all with a filter: which one was meant?
        res = invoke(db, "cache", "invalidate", "--all", *narrowed)
        assert res.exit_code == 2 and "--all forgets every winner: name no kernel id, --hash or --target" in res.stderr
    assert invoke(db, "cache", "invalidate", "--all").stdout.strip() == "invalidated 1 cached winner(s)"
    assert json.loads(invoke(db, "cache", "ls", "--json").stdout) == []
    assert invoke(db, "cache", "ls").stdout.strip() == "the cache holds no winner"


def test_one_hash_prefix_rule_in_every_cache_command(tmp_path):
    """`cache invalidate --hash zz` answered "invalidated 0" and `cache ls --hash zz` "no cached
    winner matches": a typo read as a query. 4 to 64 lowercase hex digits, as `GET /cache?hash=`."""
    db = str(tmp_path / "superopt.db")
    open_database(db).close()
    for bad in ("zz", "abc", "ABCDEF", "0" * 65, "12 34"):
        for args in (("cache", "ls", "--hash", bad), ("cache", "invalidate", "--hash", bad)):
            res = invoke(db, *args)
            assert res.exit_code == 2, (args, res.output)
            assert res.stderr.strip() == ("error: hash: expected 4 to 64 lowercase hex digits (a canonical program "
                                          f"hash or a prefix), got {bad!r}")
    assert invoke(db, "cache", "invalidate", "--hash", "abcd").stdout.strip() == "invalidated 0 cached winner(s)"


def test_lookups_on_a_fresh_machine_make_no_database(tmp_path, monkeypatch):
    """`superopt status 3` with no --db created ~/.cache/superopt/superopt.db to say "no job 3":
    the default database is looked up, as a named one is, and made by the commands that write."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SUPEROPT_DB_URL", raising=False)
    default = tmp_path / "cache" / "superopt.db"
    for args in (["status", "3"], ["cancel", "3"], ["cache", "ls"], ["cache", "show", "3"], ["cache", "verify"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and res.stderr.strip() == (
            f"error: no database at {default} (nothing was queued or cached there)"), (args, res.output)
        assert not default.exists(), args
    assert runner.invoke(app, ["submit", "gqa:ci"]).exit_code == 0 and default.is_file()
    assert runner.invoke(app, ["status", "1"]).exit_code == 0


def test_user_errors_are_one_line_and_exit_2(tmp_path):
    db = str(tmp_path / "superopt.db")
    res = invoke(db, "status", "42")  # looking up names a database that is not there, and makes none
    assert res.exit_code == 2 and f"no database at {db}" in res.stderr and not (tmp_path / "superopt.db").exists()
    open_database(db).close()
    cases = [
        (["submit", "nope"], "neither a built-in workload"),
        (["submit", "gqa:ci", "--target", "tpu"], "target: unknown target 'tpu'"),
        (["submit", "gqa:ci", "--budget-s", "-1"], "budget_s: Input should be greater than 0"),
        (["status", "42"], "no job 42"),
        (["watch", "42"], "no job 42"),
        (["cancel", "42"], "no job 42"),
        (["cache", "show", "42"], "no kernel 42"),
        (["cache", "export", "42"], "kernel 42 is not a cached winner"),
        (["worker", "--once", "--optimizer", "nowhere:optimize"], "optimizer: cannot load 'nowhere:optimize'"),
        (["status", "99999999999999999999"], "no job 99999999999999999999"),  # past any stored id
        (["cache", "invalidate", "42"], "invalidate: kernel 42 is not a cached winner"),
        (["cancel", "99999999999999999999"], "no job 99999999999999999999"),
        (["cache", "show", "99999999999999999999"], "no kernel 99999999999999999999"),
        (["submit", "lora:ci", "--max-states", "99999999999999999999"], "max_states: Input should be less than"),
        (["submit", "lora:ci", "--budget-s", "nan"], "budget_s: Input should be a finite number"),
    ]
    for args, message in cases:
        res = invoke(db, *args)
        assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.output, (args, res.output)
    not_a_database = tmp_path / "notes.txt"
    not_a_database.write_text("plain text, not SQLite\n" * 100)
    res = runner.invoke(app, ["cache", "ls", "--db", str(not_a_database)])
    assert res.exit_code == 2 and "cannot open database" in res.stderr and "file is not a database" in res.stderr
    res = runner.invoke(app, ["status", "1", "--db", "mysql://u@h/d"])
    assert res.exit_code == 2 and "unsupported database 'mysql'" in res.stderr
    res = runner.invoke(app, ["status", "1", "--db", "postgresql://u:secret@127.0.0.1:9/d?connect_timeout=2"])
    assert res.exit_code == 2 and "cannot open database" in res.stderr and "secret" not in res.stderr


def test_watch_follows_a_running_job_and_cancel_stops_one(tmp_path, monkeypatch):
    monkeypatch.setenv("SUPEROPT_TEST_DELAY_S", "0.8")
    db = str(tmp_path / "superopt.db")
    job_id = json.loads(invoke(db, "submit", "lora:ci", "--json").stdout)["id"]
    database = open_database(db)
    worker = threading.Thread(target=Worker(database, optimize=slow_optimize, lease_s=2).run_one)
    worker.start()
    res = invoke(db, "watch", str(job_id), "--interval", "0.1")
    worker.join()
    assert res.exit_code == 0, res.output
    assert f"job {job_id} succeeded:" in res.stdout and "states / pruned / verified" in res.stdout
    queued = json.loads(invoke(db, "submit", "ntrans:ci", "--json").stdout)["id"]
    assert invoke(db, "cancel", str(queued)).stdout.strip() == f"job {queued} cancelled"
    res = invoke(db, "watch", str(queued))
    assert res.exit_code == 1 and f"job {queued} cancelled" in res.stdout
    res = invoke(db, "cancel", str(queued))
    assert res.exit_code == 2 and "already finished (cancelled)" in res.stderr
    assert JobQueue(database).get(queued).state.value == "cancelled"
    database.close()


def test_submit_takes_the_search_bounds_post_jobs_takes(tmp_path):
    """`submit` had no --max-kernel-ops, --max-block-ops, --max-block-inputs nor --concrete: a job
    with other bounds could be queued over HTTP only. Its config hash is what POST /jobs gives."""
    from superopt.config import SearchConfig

    db = str(tmp_path / "superopt.db")
    res = invoke(db, "submit", "gqa:ci", "--target", "h100", "--max-kernel-ops", "3", "--max-block-ops", "7",
                 "--max-block-inputs", "3", "--concrete", "--json")
    assert res.exit_code == 0, res.output
    want = SearchConfig(max_kernel_ops=3, max_block_ops=7, max_block_inputs=3, concrete=True).hash()
    assert json.loads(res.stdout)["config_hash"] == want
    plain = json.loads(invoke(db, "submit", "gqa:ci", "--target", "h100", "--json").stdout)
    assert plain["config_hash"] == SearchConfig().hash()
    bad = invoke(db, "submit", "gqa:ci", "--max-kernel-ops", "0")
    assert bad.exit_code == 2 and "config.max_kernel_ops" in bad.stderr
