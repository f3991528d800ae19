"""optimize() and `superopt optimize`: shape reuse, the cache, the limits and the report."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from superopt import Program, workloads
from superopt.api import optimize
from superopt.cli import app
from superopt.config import SearchConfig

pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_single_matmul_gets_an_answer_not_an_error():
    p = Program("mm")
    x = p.input("X", (32, 64), "f16")
    w = p.input("W", (64, 48), "f16")
    p.output(x @ w)
    result = optimize(p, target="h100", budget_s=60)
    assert result.best.verdict.proved
    assert result.best.time_us <= result.baseline.time_us


def test_an_unfused_winner_is_not_checked_again_at_the_real_shapes(monkeypatch):
    """The unfused baseline is the program's own ops: checking it at the real shapes checked the
    program against itself, in float64 and field products (a 4096-square matmul: 100 s after a
    0.02 s search). A fused winner still is (`test_shape_reuse_searches_again_when_...`)."""
    from superopt.verifier import verify as verifier

    checked: list[str] = []
    verify_at = verifier.verify_at
    monkeypatch.setattr(verifier, "verify_at", lambda p, sg, *a, **k: checked.append(sg.name) or verify_at(p, sg, *a, **k))
    p = Program("mm")
    x, w = p.input("X", (2048, 2048), "f16"), p.input("W", (2048, 2048), "f16")
    p.output(x @ w)
    result = optimize(p, target="h100", budget_s=60, cache=False, reuse=False)
    assert result.best.sgraph.name.endswith(".unfused") and result.best.verdict.proved and checked == []


def test_shape_reuse_reinstantiates_without_searching():
    w = workloads.get("rmsnorm_matmul")
    first = optimize(w.build(n=4, d=64, e=48), target="h100", budget_s=60, cache=False)
    assert not first.search.reused and first.search.states > 0
    second = optimize(w.build(n=8, d=32, e=24), target="h100", budget_s=60, cache=False)
    assert second.search.reused and second.search.states == 0 and second.search.depth == first.search.depth
    assert second.best.verdict.proved
    same_structure = [(k.kind, getattr(k, "op", None)) for k in first.best.sgraph.kernels]
    assert [(k.kind, getattr(k, "op", None)) for k in second.best.sgraph.kernels] == same_structure
    forced = optimize(w.build(n=8, d=32, e=24), target="h100", budget_s=60, cache=False, force=True)
    assert not forced.search.reused and forced.search.states > 0  # --force searches again


def test_the_api_refuses_the_limits_the_command_line_refuses():
    """optimize(budget_s=-1) and optimize(max_states=0) returned the unfused baseline."""
    p = workloads.resolve("ntrans:ci")
    for limits, message in (({"budget_s": -1}, "budget_s: must be greater than 0"),
                            ({"budget_s": float("nan")}, "budget_s: must be greater than 0"),
                            ({"max_states": 0}, "max_states: must be at least 1"),
                            ({"budget_s": "10"}, "budget_s: must be a number of seconds .* got '10'"),
                            ({"max_states": 1.5}, "max_states: must be an integer .* got 1.5"),
                            ({"workers": 0}, "workers: must be an integer of at least 1 .* got 0")):
        with pytest.raises(ValueError, match=message):
            optimize(p, target="h100", cache=False, **limits)


@pytest.mark.parametrize(("bounds", "message"), [
    ({"max_kernel_ops": 0}, r"config.max_kernel_ops: must be an integer from 1 to 32 \(kernels per kernel graph\), got 0"),
    ({"max_block_ops": -1}, "config.max_block_ops: must be an integer from 1 to 64"),
    ({"max_grid_axes": 2.0}, "config.max_grid_axes: must be an integer from 1 to 3 .* got 2.0"),
    ({"max_block_inputs": True}, "config.max_block_inputs: must be an integer .* got True"),
    ({"concrete": "yes"}, "config.concrete: must be true or false, got 'yes'"),
])
def test_search_bounds_out_of_range_are_refused_in_python_as_on_the_command_line(bounds, message):
    """SearchConfig(max_kernel_ops=0) searched nothing and returned the unfused baseline; the
    CLI and the HTTP schema refused it."""
    with pytest.raises(ValueError, match=message):
        SearchConfig(**bounds)


def test_no_cache_neither_reads_nor_keeps_the_sgraphs_of_other_shapes(tmp_path, monkeypatch):
    """`--no-cache` kept the searched sGraphs for shape reuse, and the next `--no-cache` run took
    them instead of searching ("re-instantiated from an earlier search" at the same shape)."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    for _ in range(2):
        res = CliRunner().invoke(app, ["optimize", "ntrans:ci", "--target", "h100", "--json", "--no-cache"])
        assert res.exit_code == 0, res.output
        search = json.loads(res.stdout)["search"]
        assert not search["reused"] and search["states"] > 0
    assert not any(tmp_path.iterdir())


def test_shape_reuse_searches_again_when_deeper_graphs_could_win(monkeypatch):
    """gqa:ci stops after one kernel (launches dominate tiny shapes); at the published shape a
    split-KV schedule of more kernels can beat what the :ci search kept, so reuse is refused, and
    before any kept sGraph is re-verified: their ranking alone says so (proofs are the cost)."""
    from superopt.search import driver
    from superopt.verifier import verify as verifier

    first = optimize(workloads.resolve("gqa:ci"), target="h100", budget_s=60, cache=False)
    assert not first.search.reused and first.search.depth == 1
    calls: list[str] = []
    verify, verify_at, search = verifier.verify, verifier.verify_at, driver.run_search
    monkeypatch.setattr(verifier, "verify", lambda *a, **k: calls.append("verify") or verify(*a, **k))
    monkeypatch.setattr(verifier, "verify_at", lambda *a, **k: calls.append("verify_at") or verify_at(*a, **k))
    monkeypatch.setattr(driver, "run_search", lambda *a, **k: calls.append("search") or search(*a, **k))
    second = optimize(workloads.resolve("gqa"), target="h100", budget_s=10, cache=False)
    assert not second.search.reused and second.search.states > 0
    assert second.best.time_us < second.baseline.time_us
    assert calls == ["search", "verify_at"]  # the winner is checked again at its real shapes


def test_report_has_every_documented_field():
    report = optimize(workloads.resolve("ntrans:ci"), target="h100", budget_s=60).report()
    assert report["program"]["name"] == "ntrans:ci"
    assert report["program"]["hash"] == workloads.resolve("ntrans:ci").canonical_hash()
    assert report["target"] == {"name": "h100", "measured": False, "fingerprint": report["target"]["fingerprint"]}
    s = report["search"]
    assert s["symbolic"] is True and s["states"] > 0 and s["verified"] >= 2 and s["seconds"] > 0
    assert 0 < s["best_found_s"] <= s["seconds"]
    assert isinstance(s["pruned"], int)
    b = report["best"]
    assert b["verdict"]["egraph"] == "proved" and b["verdict"]["finite_field_trials"] >= 6
    assert 0 < b["verdict"]["float_max_rel_err"] <= b["verdict"]["float_tolerance"]
    assert b["time_source"] == "estimated" and b["time_us"] > 0
    assert b["speedup"] == pytest.approx(b["baseline_time_us"] / b["time_us"])
    assert b["graph_defined_kernels"] == 1 and b["kernels"] == 1
    assert b["dram_bytes"] >= b["floor_dram_bytes"] > 0
    assert set(b["params"]) == {"gx0"} and b["sgraph"]["schema"] == "superopt.sgraph/1"
    assert "__global__" in b["cuda"]


def test_second_optimize_is_a_cache_hit():
    p = workloads.resolve("gated_mlp:ci")
    first = optimize(p, target="h100", budget_s=60)
    again = optimize(p, target="h100", budget_s=60)
    assert not first.cache_hit and again.cache_hit
    assert again.best.sgraph.dumps() == first.best.sgraph.dumps()


def test_a_search_cut_short_answers_no_larger_budget_and_keeps_no_slower_winner(tmp_path):
    """`--max-states 1` cached rmsnorm_mlp:ci's unfused baseline, served then to every later
    search whatever its budget; and a forced search cut that short replaced a faster winner."""
    p, db = workloads.resolve("rmsnorm_mlp:ci"), f"sqlite:///{tmp_path / 'cache.db'}"
    cut = optimize(p, target="h100", max_states=1, db=db, reuse=False)
    assert cut.search.budget_exhausted and cut.best.sgraph.name.endswith(".unfused")
    full = optimize(p, target="h100", budget_s=60, db=db, reuse=False)
    assert not full.cache_hit and full.best.time_us < cut.best.time_us
    optimize(p, target="h100", max_states=1, force=True, db=db, reuse=False)
    again = optimize(p, target="h100", budget_s=60, db=db, reuse=False)
    assert again.cache_hit and again.best.sgraph.dumps() == full.best.sgraph.dumps()


def test_optimize_command_line_json():
    res = CliRunner().invoke(app, ["optimize", "lora:ci", "--target", "h100", "--json", "--no-cache"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["best"]["verdict"]["proved"] and report["best"]["speedup"] > 1


def test_the_progress_line_shows_its_phase():
    """The phase was once read as Rich markup and vanished from the bar's text."""
    import io

    from rich.console import Console

    from superopt.cli_progress import search_progress

    shown = io.StringIO()
    console = Console(file=shown, force_terminal=True, width=160)
    with search_progress(console, budget_s=10.0) as update:
        update({"phase": "[probe]", "seconds": 1.5, "states": 10, "pruned": 3, "verified": 1, "best_time_us": 2.5,
                "depth": 2})
    assert "[probe]: 1.5 s, 10 states, 3 pruned, 1 verified, depth 2, best 2.50 us" in shown.getvalue()


def test_optimize_command_line_summary():
    res = CliRunner().invoke(app, ["optimize", "ntrans:ci", "--target", "h100", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert "verdict: PROVED" in res.stdout and "speedup over the unfused baseline" in res.stdout


def test_a_winner_no_cuda_can_be_generated_for_gives_way_to_the_next(monkeypatch):
    """A proved winner whose kernels code generation refuses was returned without CUDA (and a
    search on a GPU crashed timing it): the next proved candidate that generates is the winner."""
    import superopt.codegen as codegen

    generate = codegen.generate

    def refusing(inst):  # type: ignore[no-untyped-def]
        if not inst.sgraph.name.endswith(".unfused"):
            raise codegen.CodegenError("kernel k0: refused for this test")
        return generate(inst)

    monkeypatch.setattr(codegen, "generate", refusing)
    result = optimize(workloads.resolve("rmsnorm_matmul:ci"), target="h100", cache=False, reuse=False)
    assert result.best.sgraph.name.endswith(".unfused") and result.best.cuda is not None
    assert result.best.verdict.proved and result.speedup == 1.0
