"""The concrete (Mirage-style) search: its grids, its first kernels and its state counts."""

from __future__ import annotations

import pytest
from search_helpers import f32_workload

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.search.block import InputSpec
from superopt.search.driver import run_search
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_symbolic_search_visits_fewer_states_than_concrete(h100, searched):
    _, symbolic = searched("rmsnorm_matmul:ci", max_kernel_ops=1)
    program = workloads.resolve("rmsnorm_matmul:ci")
    concrete = run_search(program, h100, SearchConfig(max_kernel_ops=1, concrete=True),
                          max_states=5 * symbolic.stats.states)
    assert not symbolic.stats.budget_exhausted
    assert concrete.stats.budget_exhausted  # concrete needs more than five times the states
    assert concrete.stats.states >= 5 * symbolic.stats.states


def test_concrete_grids_include_one_block_as_the_symbolic_search_does():
    """`--concrete` enumerates Mirage's grid sizes (n / tile); a one-block kernel (a symbolic
    grid instantiated at 1, which attention's merge kernels and whole-reduction kernels use)
    was missing. It comes first, once, with every loop."""
    from superopt.search.kernel import concrete_tilings

    specs = [InputSpec(0, (16, 4096), ("inp", "X"), (0, 1)), InputSpec(1, (4096, 6144), ("inp", "W"), (1, 2))]
    tilings = list(concrete_tilings(specs))
    grids = [axes for axes, loop in tilings if loop == (frozenset(), 1)]
    one = [(frozenset({0}), 1)]
    assert grids[0] == one and grids.count(one) == 1
    assert [loop for axes, loop in tilings if axes == one][:3] == [
        (frozenset(), 1), (frozenset({0}), 4), (frozenset({1}), 4)]
    assert [(frozenset({2}), 6144 // 8)] in grids and all(1 <= len(g) <= 3 for g in grids)
    assert all(len(classes) == 1 for g in grids for classes, _ in g)  # X rows, W columns: extents differ


def test_concrete_grids_split_what_a_tile_divides_within_the_axis_limit():
    """A class no tile of Mirage's divides (12 rows) is not split: an axis of size 1 over it was
    the grid without it again (the same schedules searched twice). `max_grid_axes` bounds the
    concrete grids as it bounds the symbolic ones."""
    from superopt.search.kernel import concrete_tilings

    specs = [InputSpec(0, (12, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    grids = [axes for axes, loop in concrete_tilings(specs) if loop == (frozenset(), 1)]
    assert grids[0] == [(frozenset({0}), 1)] and all(size > 1 for g in grids[1:] for _, size in g)
    assert {(min(c), size) for g in grids[1:] for c, size in g} == {(1, 8), (1, 4), (1, 2), (2, 6), (2, 3)}
    assert len({tuple(g) for g in grids}) == len(grids) == 1 + 5 + 3 * 2
    one_axis = [axes for axes, loop in concrete_tilings(specs, max_axes=1) if loop == (frozenset(), 1)]
    assert one_axis == grids[:6]


def test_concrete_search_splits_independent_projections_side_by_side(h100):
    """`--concrete` had no side-by-side axis: (X @ W0, X @ W1) fused otherwise (2.712 us at X
    (16, 64); at X (16, 1024) not at all: 5.519 us, the library matmuls, against 5.150). Its grids
    now include one axis over the columns of both weights (classes of one input each, of one
    extent, no two of one input), as Mirage's per-input maps allow: 2.700 us (the symbolic search,
    whose grid sizes are any divisor, 2.679 over 256 blocks)."""
    from superopt.search.kernel import concrete_tilings

    specs = [InputSpec(0, (16, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 64), ("inp", "W0"), (1, 2)),
             InputSpec(2, (64, 32), ("inp", "W1"), (1, 3)), InputSpec(3, (64, 64), ("inp", "W2"), (1, 4))]
    groups = {classes for axes, _ in concrete_tilings(specs) for classes, _ in axes if len(classes) > 1}
    assert groups == {frozenset({2, 4})}  # W1's columns are narrower
    p = Program("projections")
    x = p.input("X", (16, 64), "f16")
    p.output(*[x @ p.input(f"W{i}", (64, 64), "f16") for i in range(2)])
    symbolic = run_search(p, h100, SearchConfig(max_kernel_ops=1))
    concrete = run_search(p, h100, SearchConfig(max_kernel_ops=1, concrete=True))
    assert concrete.best.verdict.proved
    assert symbolic.best.best.estimate.time_s <= concrete.best.best.estimate.time_s < 2.712e-6
    (kernel,) = concrete.best.sgraph.kernels
    side = [a for a in range(len(kernel.block.grid)) if all(i.imap[a] == 1 for i in kernel.block.inputs[1:])]
    assert len(side) == 1 and kernel.block.inputs[0].imap[side[0]] is None  # X whole in every block


def test_concrete_first_kernels_are_compared_at_their_fixed_chunk_counts(h100):
    """In concrete search a kernel's chunk count is a number, not a symbol: kernels writing
    partial results are compared as they are, and only beaten ones are cut."""
    program = f32_workload("gqa:ci")  # f32: where a kernel may write partial sums
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(concrete=True), target=h100)
    firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1)))
    kept = [f.state for f in ks.floors.undominated([ks.floors.ranked_first(st) for st in firsts])]
    assert any(t.chunk is not None for st in kept for t in st.tensors)
    assert 0 < len(kept) < len(firsts)
