"""Distributed search on Ray: same winner with 1 and 2 workers, retries a killed worker, reports errors."""

from __future__ import annotations

import pytest

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search import distributed
from superopt.search.distributed import ShardFailed, is_small, run_distributed
from superopt.search.driver import run_search

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one worker starts the one local Ray


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    """One local Ray for these tests (starting one costs seconds)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def signature(outcome) -> tuple[list[str], str, dict[str, int]]:
    texts = sorted(v.sgraph.dumps() for v in outcome.verified)
    return texts, outcome.best.sgraph.dumps(), outcome.best.best.params


@pytest.mark.parametrize("name", ["rmsnorm_matmul:ci", "gated_mlp:ci", "lora:ci"])
def test_one_and_two_workers_return_the_same_winner(name, h100):
    program = workloads.resolve(name)
    config = SearchConfig(max_kernel_ops=2)
    local = run_search(program, h100, config, budget_s=300)
    one = run_distributed(program, h100, config, budget_s=300, workers=1)
    two = run_distributed(program, h100, config, budget_s=300, workers=2)
    assert one.stats.executor == two.stats.executor == "ray"
    assert not (local.stats.budget_exhausted or one.stats.budget_exhausted or two.stats.budget_exhausted)
    assert signature(one) == signature(two) == signature(local)


def test_a_killed_worker_is_retried_and_the_winner_is_unchanged(h100, tmp_path, monkeypatch):
    program = workloads.resolve("gated_mlp:ci")
    config = SearchConfig(max_kernel_ops=1)
    clean = run_distributed(program, h100, config, budget_s=300, workers=2)
    marker = tmp_path / "killed"
    monkeypatch.setenv(distributed.FAULT_KILL_ONCE, str(marker))
    crashed = run_distributed(program, h100, config, budget_s=300, workers=2)
    assert marker.exists()  # a worker process died mid-shard
    assert signature(crashed) == signature(clean)


def test_a_shard_that_raises_fails_the_search_naming_it(h100, monkeypatch):
    program = workloads.resolve("gated_mlp:ci")
    monkeypatch.setattr(Program, "to_json", lambda self: {"schema": "broken"})
    with pytest.raises(ShardFailed, match=r"shard depth 1, first kernel graph \(0, 1, 2\).*unknown program schema"):
        run_distributed(program, h100, SearchConfig(max_kernel_ops=1), budget_s=120, workers=2)


def test_small_jobs_do_not_start_ray(h100):
    p = Program("mm")
    x = p.input("X", (8, 16), "f16")
    p.output(x @ p.input("W", (16, 8), "f16"))
    assert is_small(p)
    outcome = run_distributed(p, h100, SearchConfig(), budget_s=60, workers=2)
    assert outcome.stats.executor == "in-process (small job)"
    assert outcome.best.verdict.proved


def test_batch_spreads_jobs_over_ray_workers(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from superopt.cli import app

    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(["lora:ci", "ntrans:ci", "gated_mlp:ci", "rmsnorm_matmul:ci"]) + "\n")
    db = f"sqlite:///{tmp_path / 'jobs.db'}"
    args = ["batch", str(batch), "--workers", "2", "--target", "h100", "--db", db, "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    import json

    rows = json.loads(first.stdout)
    assert [r["state"] for r in rows] == ["succeeded"] * 4
    assert not any(r["cache_hit"] for r in rows) and all(r["speedup"] > 1 for r in rows)
    again = json.loads(CliRunner().invoke(app, args).stdout)
    assert all(r["cache_hit"] for r in again)
