"""The probe of small block graphs and the program's own block graph, searched ahead of the rest."""

from __future__ import annotations

import pytest
from search_helpers import program_ops, tile_ops

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search.block import Generator
from superopt.search.driver import Searcher, run_search
from superopt.search.instantiation import rank
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_large_search_finds_a_deeper_winner_in_small_block_graphs_first(h100, monkeypatch):
    """qknorm_gqa's one-kernel search is large, and its 3-kernel winner's first kernel alone
    takes some 20,000 more states to generate among all block graphs over Q and K. The value
    paths show one kernel slower than three may be (23.0 us at least, against 12.6:
    `Driver.paths_favour_deeper`), so the probe of small block graphs comes before any
    one-kernel state, and proves the winner within a few hundred. Without the probe, 40,000
    states reach nothing as fast as the reference's flash-decoding schedule (which stores
    partial sums in f16: no searched schedule does, `KernelSearch._overflows`)."""
    from superopt.search import driver

    program, reference = workloads.reference_for("qknorm_gqa")
    ref_us = rank(reference, h100)[0].estimate.time_us
    events: list[dict] = []
    probed = run_search(program, h100, SearchConfig(), max_states=20_000, progress=events.append)
    assert probed.best.verdict.proved and len(probed.best.sgraph.kernels) == 3
    assert probed.best.best.estimate.time_us < ref_us - 1.5  # 12.87 against 14.79 us
    assert "probe" in {e["phase"] for e in events}  # the progress display says so
    found = [e for e in events if e["phase"] == "found"]
    assert found[-1]["states"] < 1_000
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 10**9)
    monkeypatch.setattr(driver.Driver, "paths_favour_deeper", lambda self, ks: False)
    unprobed = run_search(program, h100, SearchConfig(), max_states=40_000)
    assert unprobed.best.best.estimate.time_us > ref_us


def test_a_probe_finds_a_one_kernel_schedule_the_whole_one_kernel_search_reaches_late(h100, monkeypatch):
    """The one-kernel search walks the post-loop graphs of every small loop body before any larger
    body: for sum(rms_norm(-rsqrt(X)) @ W) (found by fuzz_optimize) the fused kernel needs a 5-op
    body and comes after some 150,000 states. The probe, at most 5 ops per block graph, proves
    it within 60,000 states; without the probe those states leave the unfused baseline. (The
    program's own block graph, searched first, would find it at once: left out here.)"""
    from superopt.search import driver

    _no_program_shard(monkeypatch)
    p = Program("chain")
    x, w = p.input("X", (2, 2, 16), "f16"), p.input("W", (2, 16, 8), "f16")
    p.output(p.sum(p.rms_norm(-p.rsqrt(x), -1) @ w, -1, keepdim=True))
    probed = run_search(p, h100, SearchConfig(), max_states=60_000)
    assert probed.best.verdict.proved and len(probed.best.sgraph.kernels) == 1
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 10**9)
    unprobed = run_search(p, h100, SearchConfig(), max_states=60_000)
    assert unprobed.best.sgraph.name.endswith(".unfused")


def _two_products() -> Program:
    """rms_norm and row sums of (gelu(sigmoid(X + 3)) @ W) * (X @ V) (found by fuzz_optimize):
    8 ops over 3 inputs, a one-kernel search of hundreds of thousands of states."""
    p = Program("two_products")
    x, w, v = p.input("X", (2, 16, 32), "f16"), p.input("W", (2, 32, 8), "f16"), p.input("V", (2, 32, 8), "f16")
    prod = p.op("mul", p.op("gelu", p.op("sigmoid", p.op("add", x, 3.0))) @ w, x @ v)
    p.output(p.rms_norm(prod, -1), p.sum(prod, -1, keepdim=True))
    return p


def _no_program_shard(monkeypatch) -> None:
    monkeypatch.setattr(Generator, "program_graphs", lambda self, start, program, tiles: iter(()))


def test_the_program_itself_as_one_kernel_is_searched_first(h100, monkeypatch):
    """Before the one-kernel search, the program itself as one block graph (its ops in canonical
    order, `Generator.program_graphs`) is tiled, verified and bounds the rest: a program whose
    one-kernel search outlasts the budget still gets its fused kernel, and with it the bound.
    Without that first shard, the same states leave the unfused baseline."""
    p = _two_products()
    seeded = run_search(p, h100, SearchConfig(), max_states=3_000)
    best = seeded.best
    assert best.verdict.proved and len(best.sgraph.kernels) == 1 and seeded.stats.budget_exhausted
    kernel = best.sgraph.kernels[0]
    assert isinstance(kernel, GraphKernel)
    assert sorted(op.op for op in (*kernel.block.body, *kernel.block.post) if op.op != "const") == program_ops(p)
    baseline = next(v for v in seeded.verified if v.sgraph.name.endswith(".unfused"))
    assert best.best.estimate.time_us < baseline.best.estimate.time_us / 3
    _no_program_shard(monkeypatch)
    unseeded = run_search(p, h100, SearchConfig(), max_states=3_000)
    assert unseeded.best.sgraph.name.endswith(".unfused")


def test_the_program_as_one_block_graph_respects_the_op_bound_and_is_in_the_whole_space(h100):
    """`program_graphs` builds the program's own ops in one block graph (all in the loop body, or
    those that only finish its products after the loop), nothing when they exceed the block op bound; and what it builds the whole one-kernel search builds too (the same
    candidates, so a complete search's answer does not change)."""
    p = _two_products()
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]
    tiles = {n.id: k for k, n in enumerate(p.inputs)}
    graphs = list(ks._gen.program_graphs(ks._gen.start(specs), p, tiles))
    assert graphs
    for g in graphs:
        assert sorted(tile_ops(t for t in g.tiles if t.op not in ("input", "acc"))) == program_ops(p)
    # every op in the loop body, or the ops that only finish the products after the loop
    assert {tuple(sorted(t.op for t in g.tiles if t.phase == 1 and t.op != "acc")) for g in graphs} == {
        (), ("mul", "rms_norm", "sum")}
    small = Generator(space_of(p), Oracle(p), 5)  # 6 steps: its chain X + 3, sigmoid, gelu is one
    assert not list(small.program_graphs(small.start(specs), p, tiles))

    q = workloads.resolve("rmsnorm_matmul:ci")
    ks = KernelSearch(q, space_of(q), Oracle(q), SearchConfig(), target=h100)
    program, graph = ks.first_choices(1)[0], ("graph", tuple(range(len(q.inputs))))
    assert program[0] == "program"
    own = {sg.dumps() for sg in ks.candidates_in(1, program)}
    assert own and own <= {sg.dumps() for sg in ks.candidates_in(1, graph)}


def test_a_probe_after_a_one_kernel_search_run_elsewhere_starts_at_two_kernels(h100, monkeypatch):
    """When workers run the one-kernel search, the driver's progress callback never sees it: the
    probe runs between depths, from two kernels on (the one-kernel graphs were all searched)."""
    from superopt.search import driver

    program = workloads.resolve("gqa")
    probed: list[int] = []
    run = Searcher.run

    def recording(self, shard, deadline, max_states):
        if self.config.max_block_ops == driver.PROBE_BLOCK_OPS:
            probed.append(shard.depth)
        return run(self, shard, deadline, max_states)

    def elsewhere(shards, deadline, max_states):  # every shard in a searcher of its own, as a worker would
        for shard in shards:
            yield Searcher(program, h100, SearchConfig()).run(shard, deadline, max_states)

    monkeypatch.setattr(Searcher, "run", recording)
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 0)
    outcome = run_search(program, h100, SearchConfig(), executor=elsewhere)
    assert probed and min(probed) == 2
    assert outcome.best.sgraph.dumps() == run_search(program, h100, SearchConfig()).best.sgraph.dumps()


def test_the_probe_comes_early_when_two_kernels_have_much_room(h100, monkeypatch):
    """`probe_due`: qknorm_gqa's value paths show one kernel slower than deeper graphs may be, so
    its probe starts before any one-kernel state. Without that (the f16 paths left out), its
    best so far (the unfused baseline, 27.9 us) takes over `PROBE_ROOM` times what two kernels
    can (4.7 us): its probe starts after a quarter of `PROBE_AFTER_STATES` one-kernel states.
    rmsnorm_mlp's (at most 31.8 us against 24.1) starts after all of them, and with no more room
    than that, qknorm_gqa's too."""
    from superopt.search import driver

    probed: list[str] = []
    run = Searcher.run

    def recording(self, shard, deadline, max_states):
        if self.config.max_block_ops == driver.PROBE_BLOCK_OPS:
            probed.append(self.program.name)
        return run(self, shard, deadline, max_states)

    monkeypatch.setattr(Searcher, "run", recording)
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 10**9)
    for name in ("qknorm_gqa", "rmsnorm_mlp"):
        run_search(workloads.resolve(name), h100, SearchConfig(), max_states=500)
    assert set(probed) == {"qknorm_gqa"}  # at once, whatever `PROBE_AFTER_STATES`
    probed.clear()
    monkeypatch.setattr(driver.Driver, "paths_favour_deeper", lambda self, ks: False)
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 4_000)
    for name in ("qknorm_gqa", "rmsnorm_mlp"):
        run_search(workloads.resolve(name), h100, SearchConfig(), max_states=2_500)
    assert set(probed) == {"qknorm_gqa"}
    probed.clear()
    monkeypatch.setattr(driver, "PROBE_ROOM", 7.0)
    run_search(workloads.resolve("qknorm_gqa"), h100, SearchConfig(), max_states=2_500)
    assert probed == []


def test_a_probe_shares_the_oracle_and_value_paths_of_the_search(h100):
    """A probe's searchers (`Driver.probe`) take the oracle and the value paths of the search they
    interrupt: neither depends on the block size or the bound, and the paths' memos are costly."""
    from dataclasses import replace

    program = workloads.resolve("qknorm_gqa")
    whole = Searcher(program, h100, SearchConfig())
    small = Searcher(program, h100, replace(SearchConfig(), max_block_ops=5), shared=whole)
    assert whole.search.floors.paths is not None
    assert small.search.oracle is whole.search.oracle and small.search.floors.paths is whole.search.floors.paths
    assert Searcher(program, h100, SearchConfig()).search.floors.paths is not whole.search.floors.paths


def test_a_probe_changes_no_complete_search(h100, monkeypatch):
    """The probe only finds schedules early: a search that runs to its end returns the same
    winner and the same searched depths with it (cut short by its own state cap, too), and the
    cap does not count as an exhausted budget."""
    from superopt.search import driver

    program = workloads.resolve("gqa")
    plain = run_search(program, h100, SearchConfig())
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 0)
    splits: list[bool] = []  # the probe starts with the split of the whole program
    split = KernelSearch.program_split
    monkeypatch.setattr(KernelSearch, "program_split", lambda self, whole=False: splits.append(whole) or split(self, whole))
    for cap in (driver.PROBE_STATES, 50):
        monkeypatch.setattr(driver, "PROBE_STATES", cap)
        splits.clear()
        probed = run_search(program, h100, SearchConfig())
        assert probed.best.sgraph.dumps() == plain.best.sgraph.dumps() and True in splits
        assert (probed.stats.depth, probed.stats.generic_depth) == (plain.stats.depth, plain.stats.generic_depth)
        assert not probed.stats.budget_exhausted
