"""Kernel graphs: which kernels are grown, in what order, and which first kernels are kept."""

from __future__ import annotations

import itertools
import time

import pytest
from search_helpers import f32_workload

from superopt import Program, workloads
from superopt.build import SGraphBuilder
from superopt.config import SearchConfig
from superopt.search.fingerprint import fingerprint, random_inputs
from superopt.search.instantiation import rank
from superopt.search.kernel import BudgetExhausted, KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_deeper_graphs_are_not_grown_from_kernels_that_finish_or_go_unused(h100):
    """After a kernel that already computes every output, no second kernel is searched (it could
    only add a launch); and the last kernel must read what an earlier kernel computed, so a first
    kernel whose results nothing uses leaves no subset of raw inputs to search: the last kernel
    reads every one of them (a candidate reads or returns every tensor)."""
    program = workloads.resolve("gated_mlp:ci")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
    firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1, 2)))
    done = next(st for st in firsts if not ks.floors.missing(st))
    before = ks.total_states
    assert list(ks._at_depth(done, 2)) == [] and ks.total_states == before + 1
    partial = next(st for st in firsts if ks.floors.missing(st) and st.tensors[-1].chunk is None)
    new = {t.id for t in partial.tensors[len(program.inputs):]}
    assert len(new) == 2 and ks.floors.unused(partial) == list(range(len(program.inputs), len(partial.tensors)))
    lasts = [nxt.kernels[-1] for nxt in ks._graph_moves(partial, True)]
    assert lasts and all(new <= set(k.tensor_inputs) for k in lasts)


def test_a_last_kernel_writes_the_missing_outputs_and_nothing_else():
    """A last kernel's block graph with an output besides the missing program outputs would
    leave a tensor nothing reads: such kernels are not built, though the same block space (as a
    first kernel of a deeper graph) has them."""
    program = workloads.resolve("gqa:ci")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
    root = ks.initial()
    lasts = [st.kernels[-1] for st in ks._graph_moves(root, True, only=(0, 1, 2))]
    firsts = [st.kernels[-1] for st in ks._graph_moves(root, False, only=(0, 1, 2))]
    assert lasts and all(len(k.outputs) == 1 for k in lasts)
    assert any(len(k.outputs) == 2 for k in firsts)


@pytest.mark.parametrize(("spec", "depth", "first"), [("gqa:ci", 2, (0, 1, 2)), ("lora:ci", 3, (0, 2))])
def test_graphs_whose_last_kernel_merges_computed_tensors_come_first(spec, depth, first):
    """Within a shard, graphs whose last kernel reads only computed tensors (a merge, a division)
    are produced before those whose last kernel reads program inputs again (from three kernels
    on, within each kind of second kernel: library ones first; with a graph-defined second
    kernel, within each first kernel, whose middle block spaces are then replayed, not generated
    again); the candidates are the same as one pass over the subtree produces (kernels before
    the last one are not filtered)."""
    from superopt.search.kernel import MIDDLES

    program = f32_workload(spec)  # f32: partial sums may be handed on
    inputs = {n.id for n in program.inputs}
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
    two_pass = list(ks.candidates_in(depth, ("graph", first)))
    passes = [list(ks.candidates_in(depth, ("graph", first), middle=kind)) for kind in MIDDLES] \
        if depth >= 3 else [two_pass]
    assert [sg.dumps() for sg in two_pass] == [sg.dumps() for part in passes for sg in part]
    for kind, part in zip(MIDDLES if depth >= 3 else (None,), passes, strict=True):
        first_kernel = (lambda sg: repr(sg.kernels[0])) if kind == "graph" else (lambda sg: None)
        for _, run in itertools.groupby(part, first_kernel):
            rereads = [bool(set(sg.kernels[-1].tensor_inputs) & inputs) for sg in run]
            assert rereads == sorted(rereads)
    assert {bool(set(sg.kernels[-1].tensor_inputs) & inputs) for sg in passes[-1]} == {False, True}
    firsts = ks._graph_moves(ks.initial(), False, only=first)
    one_pass = [sg for st in firsts for sg in ks._at_depth(st, depth)]
    assert sorted(sg.dumps() for sg in two_pass) == sorted(sg.dumps() for sg in one_pass)


def test_three_kernel_graphs_with_a_library_middle_kernel_come_first(h100):
    """From three kernels on, graphs whose second kernel is a library op (a few moves) come
    before those whose second kernel is graph-defined (a block space per first kernel): a cheap
    winner found early tightens the bound for the costly ones. Same candidates, each once."""
    program = workloads.resolve("gqa:ci")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    candidates = list(ks.candidates_in(3, ("graph", (0, 1))))
    kinds = [type(sg.kernels[1]).__name__ for sg in candidates]
    assert kinds.count("LibraryKernel") >= 2 and kinds.count("GraphKernel") >= 2
    assert kinds == sorted(kinds, key=lambda kind: kind != "LibraryKernel")
    assert len({sg.dumps() for sg in candidates}) == len(candidates)


@pytest.mark.parametrize("name", ["lora:ci", "gqa:ci"])
def test_first_kernels_made_in_parts_and_dealt_out_give_the_whole_shard(h100, name):
    """Split into parts, a graph choice's first kernels are made by part, cut across parts and
    dealt out (how the driver runs deeper graphs): the same first kernels as the whole choice's,
    and together the dealt shares produce exactly the candidates of the whole shard."""
    program = f32_workload(name)  # f32: partial sums may be handed on
    choice = ("graph", tuple(range(len(program.inputs))))
    whole_ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    whole = sorted(sg.dumps() for sg in whole_ks.candidates_in(3, choice))
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    by_part = [ks.first_kernels(choice, (3, i)) for i in range(3)]
    gathered = ks.floors.undominated([f for firsts in by_part for f in firsts])
    assert sorted(f.text for f in gathered) == sorted(f.text for f in whole_ks.first_kernels(choice))
    assert sum(len(firsts) for firsts in by_part) >= len(gathered) > 0
    dealt = [tuple(f.state for f in gathered[i::3]) for i in range(3)]
    shares = [[sg.dumps() for sg in ks.candidates_in(3, choice, (3, i), dealt[i])] for i in range(3)]
    assert sum(map(bool, dealt)) >= 2 and whole and sorted(itertools.chain.from_iterable(shares)) == whole


def test_ranking_first_kernels_keeps_the_deadline(h100, monkeypatch):
    """Ranking a choice's first kernels (their least times, for deeper graphs) makes no state, so
    no tick: qknorm_gqa ranked for 20 s past a 120 s budget. The deadline is asked between first
    kernels too; with time left the same first kernels come out."""
    program = workloads.resolve("gqa:ci")
    choice = ("graph", tuple(range(len(program.inputs))))
    fresh = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    whole = [f.text for f in fresh.first_kernels(choice)]
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ranked: list[object] = []
    rank = ks.floors.ranked_first

    def slow(st):  # the deadline passes while the first one is ranked
        ks.deadline = time.time() - 1
        ranked.append(st)
        return rank(st)

    monkeypatch.setattr(ks.floors, "ranked_first", slow)
    with pytest.raises(BudgetExhausted):
        ks.first_kernels(choice)
    assert len(ranked) == 1 and len(whole) > 1
    monkeypatch.setattr(ks.floors, "ranked_first", rank)
    ks.deadline = float("inf")
    assert [f.text for f in ks.first_kernels(choice)] == whole


@pytest.mark.parametrize("choice", [(0, 1), (0, 1, 2)])
def test_first_kernels_beaten_by_a_retiling_lead_to_no_better_graph(h100, choice):
    """A first kernel that another one doing the same computation into the same tensors beats (no
    slower at any chunk count, and first in the ties) is not grown: the best-ranked candidate of
    the shard is the same as when every first kernel is grown, from fewer candidates."""
    program = f32_workload("gqa:ci")  # f32: partial sums may be handed on

    def ranked_candidates(keep: int) -> list[tuple[float, str]]:
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
        ks.floors.keep = keep
        return [(r[0].estimate.time_s, sg.dumps()) for sg in ks.candidates_in(2, ("graph", choice))
                if (r := rank(sg, h100))]

    everything, kept = ranked_candidates(10**6), ranked_candidates(1)
    assert min(kept) == min(everything)
    assert len(kept) < len(everything) and set(kept) <= set(everything)


def _scaled_matmul() -> Program:
    p = Program("scaled")
    x, w = p.input("X", (4, 64), "f32"), p.input("W", (64, 48), "f32")
    p.output(p.exp((x * 0.25) @ w))
    return p


def _block_ops(k: GraphKernel) -> tuple:
    return tuple((o.op, o.inputs, tuple(sorted(o.attrs.items()))) for o in (*k.block.body, *k.block.post))


def test_first_kernels_computing_one_value_by_other_ops_are_compared(h100):
    """(X·c)@W, X@(W·c) and (X@W)·c are one value by different block ops: first kernels writing
    it are compared like retilings of one computation, so fewer are grown, and the best graph
    of the shard is the one found when every first kernel is grown."""
    program = _scaled_matmul()

    def search(keep: int) -> tuple[KernelSearch, list, list[tuple[float, str]]]:
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
        ks.floors.keep = keep
        firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1)))
        ranked = [(r[0].estimate.time_s, sg.dumps()) for sg in ks.candidates_in(2, ("graph", (0, 1)))
                  if (r := rank(sg, h100))]
        return ks, firsts, ranked

    ks, firsts, kept_ranked = search(1)
    by_value: dict = {}
    for st in firsts:
        value = tuple((ks.oracle.class_of(t.ae), t.shape, t.chunk) for t in st.tensors[2:])
        by_value.setdefault((value, ks.floors._fingerprint(st.kernels[0])), set()).add(_block_ops(st.kernels[0]))
    assert max(len(ops) for ops in by_value.values()) >= 2  # one value, several ways to compute it
    kept = [f.state for f in ks.floors.undominated([ks.floors.ranked_first(st) for st in firsts])]
    assert len(kept) <= len(by_value) < len(firsts)
    _, _, every_ranked = search(10**6)
    assert min(kept_ranked) == min(every_ranked) and len(kept_ranked) < len(every_ranked)


def test_fingerprints_tell_apart_values_with_equal_abstract_expressions():
    """Abstract expressions drop constants: X·0.5 and X/0.5 are one expression, not one value,
    and get different fingerprints; one value by other ops ((X·c)@W, X@(W·c)) gets one."""
    program = _scaled_matmul()
    b = SGraphBuilder.for_program(program, "forms")

    def kernel(scaled: str, op: str, value: float) -> GraphKernel:
        k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
        x, w = k.input("X", [None], 1), k.input("W", [1], 0)
        c = k.op("const", value=value)
        out = k.op("matmul", k.op(op, x, c), w) if scaled == "X" else k.op("matmul", x, k.op(op, w, c))
        k.output(k.acc(out), "O", [1])
        return k.kernel()

    inputs = random_inputs(program)
    assert fingerprint(kernel("X", "mul", 0.25), inputs) == fingerprint(kernel("W", "mul", 0.25), inputs)
    assert fingerprint(kernel("X", "mul", 0.5), inputs) != fingerprint(kernel("X", "div", 0.5), inputs)
    alg, x = Oracle(program).alg, (("inp", "X"), (0, 1))
    assert alg.mul(x, alg.const(0.5)) == alg.div(x, alg.const(0.5))


@pytest.mark.parametrize(("spec", "depth"), [("gqa:ci", 2), ("lora:ci", 3)])
def test_bounded_memos_change_what_is_searched_again_not_what_is_found(h100, monkeypatch, spec, depth):
    """The block graphs, floors, post-loop recipes and tilings a search keeps are bounded (a long
    search's memory stops growing); past the bounds, what was dropped is generated again. With
    bounds of a few entries, the same candidates come in the same order, from more states."""
    from superopt.search import block, floors, kernel

    def candidates() -> tuple[list[str], int]:
        program = f32_workload(spec)  # f32: partial sums may be handed on
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=depth), target=h100)
        return [sg.dumps() for sg in ks.candidates()], ks.total_states

    kept, kept_states = candidates()
    for name, limit in [("BLOCK_CACHE_ENTRIES", 2), ("BLOCK_CACHE_STATES", 10), ("PLAN_ENTRIES", 4)]:
        monkeypatch.setattr(kernel, name, limit)
    monkeypatch.setattr(block, "POST_ENTRIES", 2)
    monkeypatch.setattr(floors, "FLOOR_ENTRIES", 4)
    dropped, dropped_states = candidates()
    assert len(kept) > 50 and dropped == kept
    assert dropped_states > 1.5 * kept_states  # block graphs were dropped and generated again
