"""The kernel cache on SQLite and PostgreSQL: key, round trip, integrity checks, migrations."""

from __future__ import annotations

import json
import sqlite3
import threading
import warnings

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from db_fixtures import resign, standin_result
from sqlalchemy import func, select, text, update

from superopt import workloads
from superopt.config import SearchConfig
from superopt.core import version as superopt_version
from superopt.db.cache import KernelCache
from superopt.db.engine import default_path, open_database, resolve_url
from superopt.db.errors import CacheIntegrityWarning, NotFound, StoreError
from superopt.db.keys import CacheKey
from superopt.db.migrate import alembic_config, current_revision, head_revision
from superopt.db.models import Base, Candidate, Job, Winner, Workload
from superopt.program import Program
from superopt.targets import TARGETS, fingerprint

H100 = fingerprint(TARGETS["h100"])


def count(db, model) -> int:
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(model))


def test_a_cut_short_winner_answers_no_larger_limits_and_a_faster_winner_stays(db):
    """A search cut short by its budget was cached and served to any later search, however
    large its budget, and a forced search cut shorter (--max-states 1: the unfused baseline)
    replaced a faster winner."""
    cache = KernelCache(db)
    program = workloads.resolve("gqa:ci")
    cut = standin_result(program)
    cut.search.budget_exhausted, cut.search.budget_s, cut.search.max_states = True, 10.0, None
    assert cache.store(cut)["cached"]
    assert cache.lookup(program, H100, budget_s=10) is not None
    assert cache.lookup(program, H100, budget_s=5, max_states=100) is not None  # cut no later
    assert cache.lookup(program, H100, budget_s=60) is None  # may find a faster one
    assert cache.lookup(program, H100, budget_s=None) is None
    slower = standin_result(program)
    slower.best.time_us *= 2
    assert not cache.store(slower)["cached"]
    assert cache.lookup(program, H100, budget_s=10).best.time_us == cut.best.time_us
    tie = standin_result(program)  # as fast, cut shorter: the cached one answers more budgets
    tie.search.budget_exhausted, tie.search.budget_s, tie.search.max_states = True, 10.0, 20
    assert not cache.store(tie)["cached"] and cache.lookup(program, H100, budget_s=10) is not None
    finished = standin_result(program)  # as fast, and complete: it replaces the cut-short one
    assert cache.store(finished)["cached"] and count(db, Winner) == 1
    assert cache.lookup(program, H100, budget_s=None) is not None


def test_store_lookup_round_trip(db):
    cache = KernelCache(db)
    program = workloads.resolve("gqa:ci")
    result = standin_result(program)
    assert cache.lookup(program, H100) is None
    summary = cache.store(result)
    assert summary["cached"] and summary["proved"] and summary["kernel_id"] > 0
    got = cache.lookup(program, H100)
    assert got is not None and got.cache_hit
    want = result.report()
    have = got.report()
    assert have.pop("cache_hit") is True and want.pop("cache_hit") is False
    assert have == want
    [entry] = cache.entries(program.canonical_hash()[:10], "h100")
    assert entry.kernel_id == summary["kernel_id"] and entry.target_fingerprint == H100
    kernel = cache.kernel(entry.kernel_id)
    assert kernel["winner"] and kernel["sgraph"] == result.best.sgraph.to_json() and kernel["params"] == result.best.params
    assert cache.report(entry.kernel_id)["best"]["time_us"] == result.best.time_us


def _renamed(program: Program) -> Program:
    """The same computation with every node renamed and the name changed."""
    data = json.loads(json.dumps(program.to_json()).replace('"X"', '"input_x"').replace('"W"', '"weights"'))
    data["name"] = "renamed"
    return Program.from_json(data)


def test_a_hit_for_a_program_with_other_names_reads_that_programs_inputs(db):
    """Names are not part of the key, so a kernel cached for X (4, 64), W (64, 48) answers a
    program whose inputs are named the other way round, or after the kernel's own tensors: the
    answer must read the asking program's tensors by its names, or a caller binding by name
    would swap them."""
    from superopt.instantiate import instantiate
    from superopt.interpreter import run_float
    from superopt.reference import inputs_and_reference, max_rel_err
    from superopt.sgraph import check_matches

    cache = KernelCache(db)
    program = workloads.resolve("rmsnorm_matmul:ci")
    stored = standin_result(program)
    cache.store(stored)
    kernel_outputs = {t for k in stored.best.sgraph.kernels for t in k.outputs}
    clash = sorted(kernel_outputs)[0]
    for first, second in (("W", "X"), (clash, "X")):
        asking = Program("asking")
        a = asking.input(first, (4, 64), "f16")
        b = asking.input(second, (64, 48), "f16")
        asking.output(asking.op("matmul", asking.rms_norm(a), b, name="Y"))
        assert asking.canonical_hash() == program.canonical_hash()
        hit = cache.lookup(asking, H100)
        assert hit is not None and hit.program is asking
        sg = hit.best.sgraph
        assert {d.id: d.shape for d in sg.inputs} == {first: (4, 64), second: (64, 48)}
        check_matches(sg, asking)
        assert hit.best.cuda is None or first in hit.best.cuda  # code for the old names is not kept
        inputs, refs = inputs_and_reference(asking, seed=3)
        [out] = run_float(instantiate(sg, hit.best.params, TARGETS["h100"]), inputs)
        assert max_rel_err(out, refs[0]) < 1e-2
        assert hit.best.verdict is not None and hit.best.verdict.proved
    # The stored entry itself is untouched: the original program still gets its own names.
    assert {d.id for d in cache.lookup(program, H100).best.sgraph.inputs} == {"X", "W"}


def _other_dtype(program: Program) -> Program:
    return Program.from_json(json.loads(json.dumps(program.to_json()).replace('"f16"', '"bf16"')))


def test_hit_on_identical_key_miss_on_any_key_field_change(db, monkeypatch):
    cache = KernelCache(db)
    program = workloads.resolve("rmsnorm_matmul:ci")
    cache.store(standin_result(program))
    assert cache.lookup(program, H100) is not None
    assert cache.lookup(workloads.resolve("rmsnorm_matmul:ci"), H100, SearchConfig()) is not None
    renamed = _renamed(program)
    assert renamed.canonical_hash() == program.canonical_hash()
    assert cache.lookup(renamed, H100) is not None  # names are not part of the identity

    key = CacheKey.of(program, H100)
    changed = {
        "program_hash": workloads.resolve("gated_mlp:ci"),  # another computation
        "shapes": workloads.resolve("rmsnorm_matmul:prism-8x1024"),  # same computation, other shapes
        "dtypes": _other_dtype(program),
    }
    for field, other in changed.items():
        other_key = CacheKey.of(other, H100)
        assert getattr(other_key, field) != getattr(key, field), field
        assert cache.lookup(other, H100) is None, field
    assert cache.lookup(program, fingerprint(TARGETS["h200"])) is None  # target fingerprint
    assert cache.lookup(program, H100, SearchConfig(max_kernel_ops=4)) is None  # search config hash
    monkeypatch.setattr(superopt_version, "__version__", "9.9.9")  # superopt version
    assert CacheKey.of(program, H100).version == "9.9.9"
    assert cache.lookup(program, H100) is None


def test_tampered_program_json_is_a_miss_with_a_warning(db):
    """Edited, the program fails the winner's MAC; signed again by a holder of the key, it still
    has to re-hash to the key it is filed under."""
    cache = KernelCache(db)
    program = workloads.resolve("lora:ci")
    cache.store(standin_result(program))
    data = program.to_json()
    data["nodes"][0]["shape"] = [8, 32]  # twice the rows of X: still a valid program, but another one
    with db.write() as s:
        s.execute(update(Workload).values(program_json=json.dumps(data)))
    with pytest.warns(CacheIntegrityWarning, match="winner row 1 fails its MAC"):
        assert cache.lookup(program, H100) is None
    resign(db)
    with pytest.warns(CacheIntegrityWarning, match="re-hashes to a different key"):
        assert cache.lookup(program, H100) is None
    with db.write() as s:
        s.execute(update(Workload).values(program_json="{not json"))
    resign(db)
    with pytest.warns(CacheIntegrityWarning, match="stored program does not load"):
        assert cache.lookup(program, H100) is None


def test_tampered_kernel_row_is_a_miss_and_a_new_search_replaces_it(db):
    cache = KernelCache(db)
    program = workloads.resolve("ntrans:ci")
    first = cache.store(standin_result(program))
    with db.read() as s:
        data = s.get(Candidate, first["kernel_id"]).data
    with db.write() as s:
        s.execute(update(Candidate).where(Candidate.id == first["kernel_id"]).values(data=data.replace('"gx"', '"gy"')))
    with pytest.warns(CacheIntegrityWarning, match=f"candidate row {first['kernel_id']} fails its MAC"):
        assert cache.lookup(program, H100) is None
    with pytest.raises(NotFound, match="failed its integrity check"), pytest.warns(CacheIntegrityWarning):
        cache.kernel(first["kernel_id"])
    second = cache.store(standin_result(program))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.lookup(program, H100) is not None
    assert count(db, Winner) == 1
    [entry] = cache.entries()
    assert entry.kernel_id == second["kernel_id"]


def test_only_proved_winners_are_cached(db):
    cache = KernelCache(db)
    program = workloads.resolve("gated_mlp:ci")
    summary = cache.store(standin_result(program, proved=False))
    assert not summary["cached"] and not summary["proved"]
    assert cache.lookup(program, H100) is None
    assert count(db, Winner) == 0
    assert count(db, Candidate) == 2  # the search's candidates are still recorded
    assert not cache.kernel(summary["kernel_id"])["winner"]


def test_invalidate(db):
    cache = KernelCache(db)
    for spec, t in [("gqa:ci", "h100"), ("gqa:ci", "a100"), ("lora:ci", "h100")]:
        cache.store(standin_result(workloads.resolve(spec), t))
    gqa = workloads.resolve("gqa:ci").canonical_hash()
    assert cache.invalidate(program_hash=gqa[:8], target="a100") == 1
    assert {(e.program_name, e.target) for e in cache.entries()} == {("gqa:ci", "h100"), ("lora:ci", "h100")}
    assert cache.invalidate(target="h100") == 2
    assert cache.entries() == [] and count(db, Candidate) == 6


def test_migrations_create_exactly_the_models(db):
    assert current_revision(db) == head_revision() is not None
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    cfg = alembic_config()
    with db.writer.connect() as conn:  # the migration also runs backwards
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
        conn.commit()
    assert current_revision(db) is None
    again = open_database(db.url.render_as_string(hide_password=False))  # first use again: upgraded
    assert current_revision(again) == head_revision()
    assert KernelCache(again).entries() == []
    again.close()


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path):
    db = open_database(str(tmp_path / "c.db"))
    for _ in range(2):  # a fresh connection each time, beside the pooled one
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        db.engine.dispose()
    with pytest.raises(Exception, match="FOREIGN KEY"), db.write() as s:
        s.execute(text("INSERT INTO job (workload_id, program_json, target, config, config_hash, force, state, "
                       "progress, attempts, max_attempts, cache_hit, created_at) VALUES "
                       "(999, '{}', 'h100', '{}', 'x', 0, 'queued', '{}', 0, 3, 0, '2026-01-01')"))
    assert count(db, Job) == 0
    db.close()


def test_opening_a_fresh_file_waits_for_a_writer_instead_of_failing(tmp_path):
    """SQLite refuses the WAL switch at once while another process writes the fresh file (the
    race of a service and workers started together); opening must wait for it, then migrate."""
    path = tmp_path / "race.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE other_writer (x)")
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # what SQLite does on its own
        sqlite3.connect(path, timeout=30).execute("PRAGMA journal_mode = WAL")
    release = threading.Timer(0.3, other.execute, ["COMMIT"])
    release.start()
    db = open_database(str(path))
    release.join()
    assert current_revision(db) == head_revision()
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("SELECT count(*) FROM other_writer").scalar() == 0
    db.close()
    other.close()


def test_database_urls(tmp_path, monkeypatch):
    monkeypatch.delenv("SUPEROPT_DB_URL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "superopt" / "superopt.db"
    assert resolve_url().database == str(default_path())
    monkeypatch.setenv("SUPEROPT_DB_URL", f"sqlite:///{tmp_path}/env.db")
    assert resolve_url().database == f"{tmp_path}/env.db"
    assert resolve_url(str(tmp_path / "flag.db")).database == str(tmp_path / "flag.db")  # the flag wins
    assert resolve_url("postgresql://u:p@h/d").drivername == "postgresql+psycopg"
    with pytest.raises(StoreError, match="unsupported database 'mysql'"):
        resolve_url("mysql://u@h/d")
    with pytest.raises(StoreError, match="in-memory SQLite"):
        resolve_url("sqlite://")
    with pytest.raises(StoreError, match=r"cannot open database postgresql\+psycopg://u:\*\*\*@127.0.0.1:9/d"):
        open_database("postgresql://u:secret@127.0.0.1:9/d?connect_timeout=2")


def test_a_winner_an_older_cost_model_ranked_answers_no_request(db, monkeypatch):
    """make demo served every row from a cache filled before the cost model changed (a :ci
    winner at 2.700 us where the model now says 2.609): the model's revision is in the target
    fingerprint, so such a winner is a miss and the program is searched again."""
    from superopt import targets

    program = workloads.resolve("rmsnorm_matmul:ci")
    revision = targets.MODEL_REVISION
    monkeypatch.setattr(targets, "MODEL_REVISION", revision - 1)
    older = targets.fingerprint(TARGETS["h100"])
    KernelCache(db).store(standin_result(program))
    assert KernelCache(db).lookup(program, older) is not None
    monkeypatch.setattr(targets, "MODEL_REVISION", revision)
    current = targets.fingerprint(TARGETS["h100"])
    assert current != older and current.endswith(f":m{targets.MODEL_REVISION}")
    assert KernelCache(db).lookup(program, current) is None
