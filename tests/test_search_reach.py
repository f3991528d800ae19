"""Reach: the values a kernel can compute from what it reads, and the states it lets the bounds cut."""

from __future__ import annotations

import itertools

import pytest
from search_helpers import sample_first_kernels, with_floors

from superopt import workloads
from superopt.config import SearchConfig
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def _block_graphs(ks: KernelSearch, s, subset: tuple[int, ...], count: int) -> list:
    """The first `count` complete block graphs of a graph kernel over these tensors of `s`, as
    `_graph_moves` makes them (inputs of per-chunk partials tied to the loop)."""
    chunked = {c.axis for i in subset if (c := s.tensors[i].chunk) is not None}
    if len(chunked) > 1:
        return []
    specs = [ks._spec(s.tensors[i], i, bool(chunked)) for i in subset]
    return list(itertools.islice(ks._blocks(specs), count))


@pytest.mark.parametrize("spec", ["qknorm_gqa:ci", "gqa:ci", "rmsnorm_mlp:ci", "lora:ci"])
def test_every_value_a_kernel_computes_is_in_the_reach_of_what_it_reads(h100, spec):
    """Every tile of every block graph the search builds over some tensors (first kernels and
    kernels after them, per-chunk partials among their inputs) has a value in the reach of those
    tensors' values (`Reach.of`), spanning at least the dim classes the reach gives it; so does
    every library kernel's output. The reach is no empty claim: some program outputs are outside
    the reach of some sets of tensors, and some values span several classes. In f32, where
    kernels may store per-chunk partial sums (`KernelSearch._overflows`)."""
    ks = with_floors(spec, h100, "f32")
    oracle = ks.oracle
    states = [ks.initial(), *sample_first_kernels(ks, depth=3, choices=4, each=3)]
    assert any(t.chunk is not None for s in states for t in s.tensors)
    checked, outside, wide = 0, 0, 0
    for s in states:
        for size in (1, 2, 3):
            for subset in itertools.combinations(range(len(s.tensors)), size):
                reach = ks.floors._reachable([s.tensors[i] for i in subset])
                outside += oracle.output_class(0) not in reach
                wide += sum(len(spans) >= 2 for spans in reach.values())
                for block in _block_graphs(ks, s, subset, 40):
                    for tile in block.tiles:
                        cls = oracle.class_of(tile.ae)
                        assert cls is not None or tile.ae == ("c",), tile
                        if cls is not None:
                            assert cls in reach, (subset, tile.ae)
                            assert reach[cls] <= set(tile.pdims) - {-1}, (tile.ae, reach[cls], tile.pdims)
                            checked += 1
        for nxt in ks._library_moves(s, False):
            out = nxt.tensors[-1]
            index = {t.id: n for n, t in enumerate(s.tensors)}
            reach = ks.floors._reachable([s.tensors[index[i]] for i in nxt.kernels[-1].tensor_inputs])
            assert reach[oracle.class_of(out.ae)] <= set(out.classes) - {-1}
    assert checked >= 1000 and outside and wide, (checked, outside, wide)


def test_a_middle_kernel_whose_outputs_cannot_carry_the_attention_is_cut_before_its_block_graphs(h100):
    """qknorm attention at its published shape, the winner's time as the bound, after a first
    kernel over Q and K writing whole Q K: a middle kernel over Q, K and Q K leaves the last
    kernel V to read, and what the middle can compute from them (`Reach`) lets the last compute O
    only from a value spanning the batch, query and key classes (softmax's numerator: a 4 MiB
    tensor written and read again) or from K again beside V (whose grid re-reads one of them per
    block). So that middle kernel is cut before any of its block graphs is made, where the bytes
    alone left 0.3 us to spare; no graph through it is faster."""
    program = workloads.resolve("qknorm_gqa")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    start = ks.initial()
    qk = next(f for f in ks._graph_moves(start, False, only=(0, 1))
              if len(f.tensors) == 4 and f.tensors[3].chunk is None and f.tensors[3].ae[0] == "sum"
              and len(set(f.tensors[3].classes) - {-1}) == 3)
    ks.floors.bound_s = 11.6595e-6
    floor = ks.floors.middle_floor(qk, 1)
    spent = ks.floors.spent(qk)
    after = ks.floors.launch_s + ks.floors.owed(qk)((0, 1, 3)) / ks.floors.bandwidth
    assert spent + ks.floors.middle_own(qk, (0, 1, 3)) + after < ks.floors.bound_s - 0.2e-6  # bytes alone: not cut
    assert floor((0, 1, 3)) > ks.floors.bound_s
    last = ks.floors._last_after(qk)
    assert last is not None and last((0, 1, 3)) >= ks.floors.launch_s + 4 * 2**20 / ks.floors.bandwidth
    ks.floors._reach, ks.floors.paths = False, None  # (the value paths cut it too: test_search_paths.py)
    assert ks.floors.middle_floor(qk, 1)((0, 1, 3)) < ks.floors.bound_s  # without the reach the floor stays below


@pytest.mark.parametrize(("spec", "bound_s"), [("gqa", 12.3e-6), ("gqa:ci", 8e-6)])
def test_bounding_last_kernels_by_what_they_can_compute_cuts_states_not_candidates(h100, spec, bound_s):
    """Bounding the last kernel after a middle kernel by the values the two can compute (`Reach`)
    leaves the candidates of a 3-kernel search under a bound as they were, from fewer states."""

    def search(reach: bool) -> tuple[list[str], int]:
        program = workloads.resolve(spec)
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.floors.bound_s, ks.floors._reach = bound_s, reach
        ks.floors.paths = None  # they cut most of these states before the reach is asked (test_search_paths.py)
        return [sg.dumps() for sg in ks.candidates()], ks.total_states

    found, states = search(reach=True)
    found_before, states_before = search(reach=False)
    assert found and found == found_before
    assert states < states_before, (states, states_before)
