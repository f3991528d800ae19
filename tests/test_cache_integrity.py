"""The cache cannot be forged: keyed MACs, re-proof, regenerated CUDA and canonical names.

An editor of the database used to turn a stored winner's sGraph into another computation (square
-> exp), recompute the sha256 beside the row, and have it served as a proved cache hit; edited
times and results were served unnoticed. Every row is now signed with a key the database does not
hold, a kernel is proved again before it is served (a wrong sGraph signed with the key is refused
too), and its CUDA is generated again from the sGraph served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import stat
import warnings
from contextlib import closing

import pytest
from alembic import command
from db_fixtures import BACKENDS, cli_env, database_url, resign, standin_result, superopt_process
from sqlalchemy import select, update
from typer.testing import CliRunner

import superopt
from superopt import workloads
from superopt.cli import app
from superopt.core.result import Result
from superopt.db import recheck
from superopt.db.cache import KernelCache
from superopt.db.engine import open_database
from superopt.db.errors import CacheIntegrityWarning, NotFound, StoreError
from superopt.db.integrity import KEY_FILE, SECRET_ENV
from superopt.db.jobs import JobQueue
from superopt.db.migrate import alembic_config
from superopt.db.models import Candidate, Job, Winner
from superopt.program import Program
from superopt.targets import TARGETS, fingerprint
from superopt.verifier.verify import verify

H100 = fingerprint(TARGETS["h100"])
runner = CliRunner()


@pytest.fixture(autouse=True)
def own_key(tmp_path, monkeypatch):
    """Keys made for these tests stay in their folders (PostgreSQL's in the cache directory)."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))


def with_cuda(result: Result) -> Result:
    """The stand-in result with its winner's CUDA, as `superopt.api` attaches it."""
    code = recheck.generate_code(result.best.sgraph, result.best.params, TARGETS["h100"])
    assert code is not None
    result.best.cuda, result.best.launch = code
    return result


def stored(db) -> tuple[KernelCache, Program, dict]:
    """rms_norm(X) @ W stored, its kernel averaging squares of X: what the forger turns into exp."""
    cache = KernelCache(db)
    program = workloads.resolve("rmsnorm_matmul:ci")
    summary = cache.store(with_cuda(standin_result(program)))
    return cache, program, summary


def clean(cache: KernelCache, program: Program) -> Result:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hit = cache.lookup(program, H100)
    assert hit is not None
    return hit


def forge_kernel(db, kernel_id: int) -> None:
    """square -> exp in the stored sGraph, with the plain sha256 beside the row recomputed."""
    with db.write() as s:
        row = s.get_one(Candidate, kernel_id)
        assert '"op":"square"' in row.data
        row.data = row.data.replace('"op":"square"', '"op":"exp"')
        row.digest = hashlib.sha256(row.data.encode()).hexdigest()


def test_a_clean_hit_is_served_with_its_verdict(db):
    cache, program, summary = stored(db)
    hit = clean(cache, program)
    assert hit.cache_hit and hit.best.verdict is not None and hit.best.verdict.proved
    assert hit.best.cuda is not None and hit.best.launch[0]["args"] == ["X", "W", "O"]
    kernel = cache.kernel(summary["kernel_id"])
    assert kernel["verdict"]["proved"] and kernel["cuda"] == hit.best.cuda
    assert [e.kernel_id for e in cache.entries()] == [summary["kernel_id"]]


def test_a_forged_sgraph_with_its_sha256_recomputed_is_refused(db):
    cache, program, summary = stored(db)
    forge_kernel(db, summary["kernel_id"])
    with pytest.warns(CacheIntegrityWarning, match=f"candidate row {summary['kernel_id']} fails its MAC"):
        assert cache.lookup(program, H100) is None
    with pytest.raises(NotFound, match="failed its integrity check"), pytest.warns(CacheIntegrityWarning):
        cache.kernel(summary["kernel_id"])


EDITS = {
    "winner time": lambda ids: update(Winner).values(time_us=0.001),
    "kernel time": lambda ids: update(Candidate).where(Candidate.id == ids["kernel_id"]).values(time_us=0.001),
    "baseline time": lambda ids: update(Candidate).where(Candidate.id == ids["baseline_id"]).values(time_us=1e9),
    "winner pointed at the baseline": lambda ids: update(Winner).values(candidate_id=ids["baseline_id"]),
    "verdict": lambda ids: update(Candidate).where(Candidate.id == ids["kernel_id"]).values(proved=False),
    "result summary": lambda ids: update(Job).values(result={**ids, "speedup": 1000.0}),
}
@pytest.mark.parametrize("edit", EDITS)
def test_edited_times_and_results_are_refused(db, edit):
    """Each edit is refused by a lookup and left out of the listing (`cache ls`, GET /cache), which
    listed a winner whose kernel row failed its MAC and so named a kernel `cache show` refused."""
    cache, program, summary = stored(db)
    with db.write() as s:
        s.execute(EDITS[edit](summary))
    with pytest.warns(CacheIntegrityWarning, match="fails its MAC"):
        assert cache.lookup(program, H100) is None
    with pytest.warns(CacheIntegrityWarning, match="not listed"):
        assert cache.entries() == []
    cache.store(with_cuda(standin_result(program)))  # a forged winner (0.001 us) keeps no new one out
    clean(cache, program)


def test_a_wrong_sgraph_signed_with_the_key_is_refused_by_its_proof(db):
    """A leaked key signs anything: the kernel is proved again before it is served."""
    cache, program, summary = stored(db)
    forge_kernel(db, summary["kernel_id"])
    resign(db)
    with pytest.warns(CacheIntegrityWarning, match="not proved again"):
        assert cache.lookup(program, H100) is None
    with pytest.raises(NotFound, match="not proved again"), pytest.warns(CacheIntegrityWarning):
        cache.kernel(summary["kernel_id"])


def test_a_ranked_row_taken_from_the_winner_is_noticed(db):
    """Each ranked row is signed, and the winner names them: one dropped from the ranking (here by
    a holder of the key, who signs the rows again) no longer matches."""
    cache, program, summary = stored(db)
    with db.write() as s:
        s.execute(update(Candidate).where(Candidate.id == summary["baseline_id"]).values(rank=None))
    resign(db)
    with pytest.warns(CacheIntegrityWarning, match="ranked candidates are not rows"):
        assert cache.lookup(program, H100) is None


def test_a_kernel_is_proved_again_once_per_row_and_mac(db, monkeypatch):
    cache, program, _ = stored(db)
    proofs: list[str] = []
    prove = recheck._prove
    monkeypatch.setattr(recheck, "_prove", lambda *a: proofs.append("proof") or prove(*a))
    clean(cache, program)
    clean(cache, program)
    assert len(proofs) == 1
    resign(db)  # the same content signed again with the same key: the same MAC, no second proof
    clean(cache, program)
    assert len(proofs) == 1


def test_the_command_line_says_a_refused_row_in_one_warning_line(db, url):
    """`superopt cache ls` over a forged winner: one `warning:` line naming the row on stderr,
    not Python's warning with its file, line and source text."""
    _, program, summary = stored(db)
    with db.write() as s:
        s.execute(EDITS["winner time"](summary))
    listing = superopt_process(["cache", "ls", "--db", url], cli_env(url))
    out, err = listing.communicate(timeout=120)
    assert listing.returncode == 0 and out.strip() == "the cache holds no winner", (out, err)
    refused = [line for line in err.splitlines() if "fails its MAC" in line]  # (PostgreSQL logs its key's place too)
    assert refused == [f"warning: kernel cache entry 1 (rmsnorm_matmul:ci, {program.canonical_hash()[:12]}, h100): "
                       "winner row 1 fails its MAC (edited, or signed with another key); not listed"], err
    assert "CacheIntegrityWarning" not in err and "warnings.warn" not in err


def test_cache_verify_lists_the_bad_rows(db, url):
    cache, _, summary = stored(db)
    other = cache.store(standin_result(workloads.resolve("lora:ci")))
    res = runner.invoke(app, ["cache", "verify", "--db", url])
    assert res.exit_code == 0 and "rows checked: none is bad" in res.stdout, res.output
    forge_kernel(db, summary["kernel_id"])
    with db.write() as s:
        s.execute(update(Winner).where(Winner.candidate_id == other["kernel_id"]).values(time_us=0.001))
    res = runner.invoke(app, ["cache", "verify", "--db", url])
    assert res.exit_code == 1 and "bad rows" in res.stdout and "fails its MAC" in res.stdout, res.output
    report = json.loads(runner.invoke(app, ["cache", "verify", "--db", url, "--json"]).stdout)
    bad = {(b["table"], b["id"]) for b in report["bad"]}
    assert bad == {("winner", 1), ("winner", 2), ("candidate", summary["kernel_id"])}
    resign(db)  # signed with the key: the proof and the CUDA regeneration still find the forged kernel
    report = json.loads(runner.invoke(app, ["cache", "verify", "--db", url, "--json"]).stdout)
    problems = {(b["table"], b["id"]): " ".join(b["problems"]) for b in report["bad"]}
    assert set(problems) == {("winner", 1), ("candidate", summary["kernel_id"])}
    assert "not proved again" in problems["winner", 1]
    assert "not proved again" in problems["candidate", summary["kernel_id"]]
    assert "differ from those its sGraph generates" in problems["candidate", summary["kernel_id"]]


def test_an_edited_job_result_is_withheld_and_listed_by_cache_verify(db, url, caplog):
    """GET /jobs/{id} and `superopt status` serve a job's result summary: one edited in the
    database (a speedup of 1000) is withheld with the reason, and `cache verify` lists the job."""
    _, _, summary = stored(db)
    queue = JobQueue(db)
    job_id = 1  # the job `KernelCache.store` recorded
    assert queue.get(job_id).result == summary
    with db.write() as s:
        s.execute(update(Job).values(result={**summary, "speedup": 1000.0}))
    with caplog.at_level(logging.WARNING, logger="superopt.db.jobs"):
        view = queue.get(job_id)
    assert view.result is None and "fails its MAC" in view.error and "withheld" in view.error
    assert f"job {job_id}" in caplog.text
    report = json.loads(runner.invoke(app, ["cache", "verify", "--db", url, "--json"]).stdout)
    assert ("job", job_id) in {(b["table"], b["id"]) for b in report["bad"]}
    resign(db)
    assert queue.get(job_id).result == {**summary, "speedup": 1000.0}  # an insider with the key: signed


@pytest.mark.parametrize("edit", [
    {"state": "failed", "error": "forged: the kernel crashed the GPU"},
    {"error": "forged note"},
    {"state": "cancelled"},
])
def test_how_a_job_ended_cannot_be_edited_unnoticed(db, url, edit):
    """A succeeded job edited to 'failed: forged' was served so (status, GET /jobs, watch exiting
    1) and cache verify said none is bad: the state and error a job ended with are signed with its
    result, and an edit withholds both, saying why; cache verify lists the job."""
    stored(db)
    queue = JobQueue(db)
    with db.write() as s:
        s.execute(update(Job).where(Job.id == 1).values(**edit))
    view = queue.get(1)
    assert view.result is None and "forged" not in (view.error or "")
    assert view.error == "how the job ended fails its MAC (edited, or signed with another key); its stored error " \
        "and result are withheld"
    report = json.loads(runner.invoke(app, ["cache", "verify", "--db", url, "--json"]).stdout)
    assert {(b["table"], b["id"]) for b in report["bad"]} == {("job", 1)}


def test_the_dashboard_withholds_what_the_api_withholds(db):
    """The dashboard's jobs page read a job's error and result straight from its row: an edited
    one (a forged error, a speedup of 999) was shown there while GET /jobs/{id} withheld it. One
    rule serves both (`served_ending`). Unsigned columns edited to another JSON kind (progress as a
    list) show nothing, not a failed page."""
    from superopt.dashboard_data import recent_jobs

    _, _, summary = stored(db)
    assert recent_jobs(db)[0]["speedup"] == summary["speedup"]
    with db.write() as s:
        s.execute(update(Job).where(Job.id == 1).values(
            state="failed", error="FORGED: contact evil.example", result={**summary, "speedup": 999.0}, progress=[1, 2]))
    [row] = recent_jobs(db)
    assert row["speedup"] is None and row["kernel_id"] is None and row["states"] is None
    assert row["error"] == JobQueue(db).get(1).error and "FORGED" not in row["error"] and "fails its MAC" in row["error"]


def test_a_job_that_ended_without_a_result_is_signed_too(db):
    """A failed or cancelled job has no result, but how it ended is signed as well."""
    queue = JobQueue(db)
    program = workloads.resolve("ntrans:ci")
    job = queue.submit(program, target="h100")
    queue.cancel(job.id)
    assert queue.get(job.id).state.value == "cancelled" and queue.get(job.id).error is None
    with db.write() as s:
        s.execute(update(Job).where(Job.id == job.id).values(error="forged"))
    assert "fails its MAC" in (queue.get(job.id).error or "")


def test_rows_written_before_rows_were_signed_are_misses(db):
    cache, program, _ = stored(db)
    cfg = alembic_config()
    with db.writer.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
        command.upgrade(cfg, "head")
        conn.commit()
    with pytest.warns(CacheIntegrityWarning, match="has no MAC"):
        assert cache.lookup(program, H100) is None
    view = JobQueue(db).get(1)
    assert view.result is None and "has no MAC" in view.error


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_key(backend, tmp_path, monkeypatch, caplog):
    """SQLite: a key file made 0600 beside the database. PostgreSQL without SUPEROPT_SECRET: the
    key file in the user's cache directory, said in a log line. SUPEROPT_SECRET: that key."""
    with database_url(backend, tmp_path) as u, caplog.at_level(logging.WARNING, "superopt.db.integrity"):
        db = open_database(u)
        cache, program, _ = stored(db)
        key = (tmp_path if backend == "sqlite" else tmp_path / "cache") / KEY_FILE
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_text().strip()) == 64
        logged = [r.getMessage() for r in caplog.records]
        if backend == "sqlite":
            assert logged == []
        else:
            assert len(logged) == 1 and SECRET_ENV in logged[0] and str(key) in logged[0]
        clean(cache, program)
        monkeypatch.setenv(SECRET_ENV, "another key, long enough to sign rows")
        with pytest.warns(CacheIntegrityWarning, match="fails its MAC"):
            assert cache.lookup(program, H100) is None
        cache.store(standin_result(program))
        clean(cache, program)
        db.close()


@pytest.mark.parametrize(("plant", "problem"), [
    (lambda key: (key.write_text(""), key.chmod(0o600)), "holds 0 characters; a key needs at least 32 (delete it: a new one is made)"),
    (lambda key: (key.write_text("abc\n"), key.chmod(0o600)), "holds 3 characters"),
    (lambda key: (key.write_text("k" * 64), key.chmod(0o666)), "can be read or written by others (mode 666"),
    (lambda key: (key.write_text("k" * 64), key.chmod(0o640)), "can be read or written by others (mode 640"),
    (lambda key: key.mkdir(), "is not a regular file"),
    (lambda key: (key.with_name("elsewhere").write_text("k" * 64), key.with_name("elsewhere").chmod(0o600),
                  key.symlink_to(key.with_name("elsewhere"))), "cannot be read"),
])
def test_a_key_file_that_others_could_have_written_is_not_used(tmp_path, plant, problem):
    """An empty key file, world-writable, planted beside the database, signed rows with the key
    b"": whoever planted it could sign forged times, served as hits and passed by cache verify."""
    key = tmp_path / KEY_FILE
    plant(key)
    db = open_database(str(tmp_path / "superopt.db"))
    with pytest.raises(StoreError, match=f"key file {key}.*{re.escape(problem)}"):
        stored(db)
    res = runner.invoke(app, ["cache", "ls", "--db", str(tmp_path / "superopt.db")])
    assert res.exit_code == 2 and res.stderr.startswith(f"error: key file {key}") and problem in res.stderr
    db.close()


@pytest.mark.parametrize(("secret", "message"), [
    ("hunter2", "SUPEROPT_SECRET is 7 characters long (blanks aside); a key that signs cache rows needs at least 32"),
    (" " * 40, "SUPEROPT_SECRET is 0 characters long (blanks aside)"),  # 40 spaces are no key
    ("\udcff" * 40, "SUPEROPT_SECRET holds bytes that are not text"),  # b"\xff" * 40 as the environment reads it
])
def test_a_short_blank_or_binary_secret_is_refused(db, monkeypatch, secret, message):
    monkeypatch.setenv(SECRET_ENV, secret)
    with pytest.raises(StoreError, match=re.escape(message)):
        stored(db)


def _edited_database_is_one_error(tmp_path, statement: str, message: str) -> None:
    """A fresh SQLite database, `statement` run on it behind superopt's back: reading and writing
    commands alike print `message` as their one error line (exit 2)."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'superopt.db'}"
    open_database(url).close()
    with closing(sqlite3.connect(tmp_path / "superopt.db")) as conn:
        conn.execute(statement)
        conn.commit()
    for args in (["cache", "ls"], ["submit", "lora:ci"]):
        res = runner.invoke(app, [*args, "--db", url])
        assert res.exit_code == 2 and res.stderr.strip() == f"error: {message.format(url=url)}", res.output


def test_a_schema_from_a_newer_version_or_a_nul_in_a_url_is_one_error(tmp_path):
    """A database stamped with a revision this version does not know printed alembic's traceback
    from every command; a %00 in a SQLite URL Python's "embedded null byte"."""
    _edited_database_is_one_error(
        tmp_path, "UPDATE alembic_version SET version_num = '0099'",
        f"the database's schema is at revision '0099', which superopt {superopt.__version__} does not know "
        "(written by a newer superopt?); nothing was changed")
    res = runner.invoke(app, ["submit", "lora:ci", "--db", f"sqlite:///{tmp_path}/%00x.db"])
    assert res.exit_code == 2 and res.stderr.strip() == (
        "error: bad database URL: it holds a NUL byte, which no file name or server name has")


def test_a_database_missing_a_table_is_one_error(tmp_path):
    """A table dropped from a database at the current revision gave SQLAlchemy's traceback from
    every command that read it."""
    _edited_database_is_one_error(
        tmp_path, "DROP TABLE winner", "database {url} lacks its table(s) winner (damaged, or its schema version edited)")


def _renamed(program: Program, names: dict[str, str]) -> Program:
    data = program.to_json()
    text = json.dumps(data)
    for old, new in names.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    return Program.from_json(json.loads(text))


def test_one_winner_answers_every_naming_of_its_program(db):
    """Optimize P (X, W), then force a search of the same program named (A, B): the forced
    search's winner replaced the first, and every later lookup of P under X, W missed. Winners
    are stored under canonical names and renamed for whoever asks."""
    from superopt.api import optimize

    cache = KernelCache(db)
    p = workloads.resolve("rmsnorm_matmul:ci")
    q = _renamed(p, {"X": "A", "W": "B", "O": "Out", "rms_norm_1": "n", p.name: "another.block"})
    assert q.canonical_hash() == p.canonical_hash() and q.name == "another.block"
    cache.store(optimize(p, target="h100", cache=False, reuse=False))  # what `optimize` stores
    cache.store(optimize(q, target="h100", cache=False, reuse=False, force=True))
    [entry] = cache.entries()
    assert entry.job_id == 2  # the forced search's winner is the one stored
    with db.read() as s:
        assert '"id":"$0"' in s.scalars(select(Candidate.data).where(Candidate.id == entry.kernel_id)).one()
    for program in (p, q):
        hit = clean(cache, program)
        names = {n.id for n in program.inputs}
        assert hit.program is program and {d.id for d in hit.best.sgraph.inputs} == names
        # named for the program asking, not the one whose search stored it
        assert (hit.best.sgraph.name, hit.baseline.sgraph.name) == (f"{program.name}.searched", f"{program.name}.unfused")
        assert hit.best.cuda is not None and set(hit.best.launch[0]["args"]) & {"X", "W", "A", "B"} == names
        assert verify(program, hit.best.sgraph, target=TARGETS["h100"]).proved


def test_text_edited_into_a_time_column_reads_as_no_time(tmp_path):
    """SQLite stores times as text: a job's created_at edited to 'garbage' made GET /jobs/{id} and
    the dashboard's job list answer 500 (the row failed to parse). An unreadable time reads as
    none: the job, the cache listing and the CLI are served, that time shown as null or '-'."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from superopt.service import create_app

    url = f"sqlite:///{tmp_path / 'cache.db'}"
    db = open_database(url)
    _, _, summary = stored(db)
    job = JobQueue(db).submit(workloads.resolve("ntrans:ci"), target="h100")
    with db.writer.connect() as conn:
        conn.execute(text("UPDATE job SET created_at = 'garbage', started_at = 'soon' WHERE id = :id"), {"id": job.id})
        conn.execute(text("UPDATE winner SET created_at = 'yesterday'"))
        conn.commit()
    client = TestClient(create_app(db), base_url="http://127.0.0.1")
    got = client.get(f"/jobs/{job.id}")
    assert got.status_code == 200 and got.json()["created_at"] is None and got.json()["started_at"] is None
    assert got.json()["state"] == "queued"
    listed = client.get("/ui/jobs.json")
    assert listed.status_code == 200 and {r["id"]: r["created_at"] for r in listed.json()["jobs"]}[job.id] is None
    entries = client.get("/cache")
    assert entries.status_code == 200
    assert [(e["kernel_id"], e["created_at"]) for e in entries.json()["entries"]] == [(summary["kernel_id"], None)]
    for args in (["status", str(job.id)], ["cache", "ls"]):
        out = runner.invoke(app, [*args, "--db", url])
        assert out.exit_code == 0 and "Traceback" not in out.output, out.output
