"""`superopt batch`: a 10-line file run in-process, then again from the cache; through workers;
a bad line queues nothing."""

from __future__ import annotations

import json
import threading

from db_fixtures import NOT_FINITE, optimize
from sqlalchemy import func, select
from typer.testing import CliRunner

from superopt import workloads
from superopt.batch import read_batch
from superopt.cli import app
from superopt.db.engine import open_database
from superopt.db.models import Candidate, Job, Winner
from superopt.worker import Worker

runner = CliRunner()


def write_batch(tmp_path) -> str:
    (tmp_path / "lora.json").write_text(workloads.resolve("lora:ci").dumps())
    lines = [
        "# every form a line can take; ten jobs, ten different cache keys",
        "gqa:ci",
        '"lora:ci"',
        json.dumps(workloads.resolve("ntrans:ci").to_json()),
        json.dumps({"program": "rmsnorm_matmul:ci", "target": "a100", "budget_s": 10}),
        "",
        json.dumps({"program": "gated_mlp:ci", "target": "h200"}),
        json.dumps({"program": "rmsnorm_mlp:ci"}),
        json.dumps({"program": "qknorm_gqa:ci", "target": "a100"}),
        json.dumps({"program": "lora.json", "target": "h200"}),
        json.dumps({"program": "gqa:ci", "target": "a100"}),
        json.dumps({"program": "ntrans:ci", "target": "h200", "config": {"max_kernel_ops": 4}}),
    ]
    f = tmp_path / "batch.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return str(f)


def counts(url: str) -> tuple[int, int, int]:
    db = open_database(url)
    with db.read() as s:
        n = tuple(s.scalar(select(func.count()).select_from(m)) for m in (Job, Candidate, Winner))
    db.close()
    return n  # type: ignore[return-value]


def test_batch_of_ten_then_all_cache_hits(tmp_path):
    batch = write_batch(tmp_path)
    db = str(tmp_path / "superopt.db")
    args = ["batch", batch, "--local", "--db", db, "--optimizer", "db_fixtures:optimize"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "10 jobs: 10 searched, 0 from the cache, 0 not succeeded" in first.stdout
    assert counts(db) == (10, 20, 10)
    second = runner.invoke(app, [*args, "--json"])
    assert second.exit_code == 0, second.output
    rows = json.loads(second.stdout)
    assert len(rows) == 10 and all(r["state"] == "succeeded" and r["cache_hit"] for r in rows)
    assert [r["line"] for r in rows] == [2, 3, 4, 5, 7, 8, 9, 10, 11, 12]
    assert [r["target"] for r in rows[:4]] == ["auto", "auto", "auto", "a100"]
    assert rows[7]["program"] == "lora:ci" and rows[7]["target"] == "h200"
    assert counts(db) == (20, 20, 10)  # ten more jobs, no new candidates or winners
    third = runner.invoke(app, args)
    assert "10 jobs: 0 searched, 10 from the cache, 0 not succeeded" in third.stdout


def test_a_stopped_local_batch_cancels_what_it_had_not_finished(tmp_path):
    """Ctrl-C or SIGTERM on `batch --local` left its jobs queued (a later worker ran them, and the
    batch run again queued them twice) and the one running under a dead worker. Those not ended
    are cancelled; the batch exits 130."""
    db = str(tmp_path / "superopt.db")
    f = tmp_path / "b.jsonl"
    f.write_text("ntrans:ci\nlora:ci\ngqa:ci\n")
    res = runner.invoke(app, ["batch", str(f), "--local", "--db", db, "--optimizer", "db_fixtures:interrupted_optimize"])
    assert res.exit_code == 130 and res.stderr.strip().endswith("batch stopped: its unfinished jobs are cancelled")
    with open_database(db).read() as s:
        states = dict(s.execute(select(Job.id, Job.state)).all())
    assert states == {1: "succeeded", 2: "cancelled", 3: "cancelled"}


def test_batch_through_workers(tmp_path):
    db_path = str(tmp_path / "superopt.db")
    f = tmp_path / "b.jsonl"
    f.write_text("ntrans:ci\nlora:ci\n" + json.dumps({"program": "gqa:ci", "target": "a100"}) + "\n")
    db = open_database(db_path)
    stop = threading.Event()
    worker = threading.Thread(target=Worker(db, optimize=optimize, poll_s=0.05).run, kwargs={"stop": stop})
    worker.start()
    try:
        res = runner.invoke(app, ["batch", str(f), "--db", db_path, "--target", "h200"])
    finally:
        stop.set()
        worker.join()
        db.close()
    assert res.exit_code == 0, res.output
    assert "3 jobs queued; workers run them" in res.stderr
    assert "3 jobs: 3 searched, 0 from the cache, 0 not succeeded" in res.stdout
    assert counts(db_path) == (3, 6, 3)


def test_a_bad_line_is_named_and_nothing_is_queued(tmp_path):
    db = str(tmp_path / "superopt.db")
    f = tmp_path / "b.jsonl"
    cases = {
        json.dumps({"program": "gqa:ci", "target": "tpu"}): "line 3: target: unknown target 'tpu'",
        json.dumps({"program": "gqa:ci", "budget_s": 0}): "line 3: budget_s: Input should be greater than 0",
        json.dumps({"program": "missing.json"}): "line 3: program: 'missing.json' is neither a built-in workload",
        "{not json": "line 3: not valid JSON",
        '{"program": ' + "[" * 5000: "line 3: not valid JSON: nested too deeply",
        '{"program": "gqa:ci", "max_states": ' + "9" * 5000 + "}": "line 3: not valid JSON: Exceeds the limit",
        "nope:ci": "line 3: program: 'nope:ci' is neither a built-in workload",
        json.dumps({"program": "lora:ci", "max_states": 10**20}): "line 3: max_states: Input should be less than",
        json.dumps({"program": NOT_FINITE}): "line 3: program: big_scale: node 'O' (mul) is not finite in f16",
    }
    for bad, message in cases.items():
        f.write_text(f"gqa:ci\nlora:ci\n{bad}\nntrans:ci\n")
        res = runner.invoke(app, ["batch", str(f), "--local", "--db", db, "--optimizer", "db_fixtures:optimize"])
        assert res.exit_code == 2 and message in res.stderr and "Traceback" not in res.output, (bad, res.output)
    f.write_text("# nothing\n\n")
    res = runner.invoke(app, ["batch", str(f), "--db", db])
    assert res.exit_code == 2 and "holds no job" in res.stderr
    res = runner.invoke(app, ["batch", str(tmp_path / "none.jsonl"), "--db", db])
    assert res.exit_code == 2 and "no such file" in res.stderr
    f.write_bytes("gqa:ci\n# caf\u00e9\n".encode("latin-1"))
    res = runner.invoke(app, ["batch", str(f), "--db", db])
    assert res.exit_code == 2 and "not UTF-8 text (invalid continuation byte at byte 12)" in res.stderr
    for option, value, message in (("--target", "tpu", "--target: unknown target 'tpu'"),
                                   ("--budget-s", "-1", "--budget-s: Input should be greater than 0")):
        res = runner.invoke(app, ["batch", str(f), option, value, "--db", db])
        assert res.exit_code == 2 and message in res.stderr, res.output  # the option, not a line, is wrong
    f.write_text("\ufeffgqa:ci\n", encoding="utf-8")  # a byte-order mark, as some editors write
    assert [e.program.name for e in read_batch(f)] == ["gqa:ci"]
    assert not (tmp_path / "superopt.db").exists()  # nothing was even opened
