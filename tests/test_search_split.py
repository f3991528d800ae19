"""The program split: a program too large for one kernel cut into fused parts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from kernel_shapes import attention_block, llama_mlp, norm_projections
from search_helpers import program_ops

from superopt import Program
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.loading import load_program
from superopt.search.block import _norms_after_products
from superopt.search.driver import run_search
from superopt.search.instantiation import rank
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel, LibraryKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


SMALL = SearchConfig(max_block_ops=3)  # block graphs `_long_chain` outgrows


def _long_chain(stages: int) -> Program:
    """t = t + unary(binary(t, Y)), `stages` times from t = X: two inputs, 3 x `stages` ops, each
    stage one chain (`Chain`: one block op), beyond one block graph of `SMALL_BLOCKS` ops from 4
    stages on. (A chain of any length is one block op: t = unary(binary(t, Y)) alone, found by
    probing optimize, is one chain, and no longer too large for one block graph.)"""
    p = Program("long_chain")
    x, y = p.input("X", (8, 16), "f32"), p.input("Y", (8, 16), "f32")
    t = x
    for i in range(stages):
        t = t + p.op(["sigmoid", "silu", "neg", "square", "relu"][i % 5], p.op(["add", "mul", "sub"][i % 3], t, y))
    p.output(t)
    return p


def test_a_program_too_large_for_one_kernel_is_cut_into_fused_parts_at_once(h100, monkeypatch):
    """Five chains over two inputs do not fit one block graph of three ops. Cut into consecutive
    parts that each fit one kernel (`program_split`), the program has a 2-kernel schedule, proved,
    before any shard runs, and bounds the rest. (A 14-op chain, before chains were one block op,
    did not fit 11 ops, and its one-kernel search outlasted any budget: without the cut it got
    the unfused baseline.)"""
    p = _long_chain(5)
    ks = KernelSearch(p, space_of(p), Oracle(p), SMALL, target=h100)
    parts = ks._split(ks._split_orders()[0])[0]
    assert len(parts) == 2 and all(ks._block_steps(part) <= SMALL.max_block_ops for part in parts)
    assert [n.id for part in parts for n in part] == [n.id for n in p.topological() if n.op != "input"]
    split = ks.program_split()
    assert split and min(len(sg.kernels) for sg in split) == 2
    assert all(isinstance(k, GraphKernel) for sg in split if len(sg.kernels) == 2 for k in sg.kernels)
    seeded = run_search(p, h100, SMALL)
    assert not seeded.stats.budget_exhausted and seeded.best.verdict.proved
    assert len(seeded.best.sgraph.kernels) == 2 and seeded.best.sgraph.dumps() in {sg.dumps() for sg in split}
    # Part programs name their inputs by the tensors' ids: a program node named like one is renamed.
    clash = _long_chain(5)
    last = next(n for n in reversed(clash.topological()) if n.op != "input")
    clash = Program.from_json(json.loads(json.dumps(clash.to_json()).replace(f'"{last.id}"', '"k0_out0"')))
    assert clash.outputs == ["k0_out0"]
    assert KernelSearch(clash, space_of(clash), Oracle(clash), SMALL, target=h100).program_split()
    monkeypatch.setattr(KernelSearch, "program_split", lambda self, whole=False: [])
    unseeded = run_search(p, h100, SMALL)  # the search finds as good a schedule itself, later
    assert unseeded.best.best.estimate.time_s == seeded.best.best.estimate.time_s
    assert unseeded.stats.states > seeded.stats.states
    # A program that fits one kernel has its own block graph instead: no parts to cut.
    small = _long_chain(3)
    assert KernelSearch(small, space_of(small), Oracle(small), SMALL, target=h100).program_split() == []


def test_a_concrete_search_cuts_a_large_program_into_its_parts_own_graphs_within_its_budgets(h100):
    """`--concrete` cut a program into parts over every block graph of each concrete tiling, not
    only the part's own, and before any budget applied: a 14-op program's split took 176,000
    states (85 s) to find nothing, a state budget of 3,000 ran 109 s for the unfused baseline,
    and attention_projections' split ran minutes past a 60 s budget. Now each part's own graph is
    tiled concretely, and the split's states count against the search's budgets."""
    p = _long_chain(5)
    ks = KernelSearch(p, space_of(p), Oracle(p), replace(SMALL, concrete=True), target=h100)
    split = ks.program_split()
    assert split and ks.total_states < 1_000
    assert all(len(sg.kernels) == 2 and all(isinstance(k, GraphKernel) for k in sg.kernels) for sg in split)
    assert all([op.op for k in sg.kernels for op in k.block.body if op.op != "const"] ==
               [n.op for n in p.topological() if n.op not in ("input", "const")] for sg in split)
    seeded = run_search(p, h100, replace(SMALL, concrete=True), max_states=3_000)
    assert seeded.best.verdict.proved and seeded.best.sgraph.dumps() in {sg.dumps() for sg in split}
    projections = load_program("scripts/programs/attention_projections.json")
    capped = run_search(projections, h100, SearchConfig(concrete=True), max_states=2_000)
    assert capped.stats.budget_exhausted and 2_000 <= capped.stats.states < 2_100
    assert capped.best.sgraph.name.endswith(".unfused")  # the split alone took the states


def test_a_reshape_between_fused_parts_is_a_library_kernel_of_the_split(h100, monkeypatch):
    """rms_norm per head of (rms_norm(softmax(X)) - rowmax(X)) @ W, split into heads by a reshape
    (found by fuzz_optimize): no block graph holds the reshape, so the program needs three
    kernels, which the search reaches after some 160,000 states (60 s): the unfused baseline
    within 15 s. Cut at the reshape (a library kernel of its own, `_split`), it has a
    proved schedule of two launches and a view before any shard runs."""
    p = Program("heads")
    x, w = p.input("X", (2, 16, 32), "f16"), p.input("W", (2, 32, 8), "f16")
    t = p.op("sub", p.rms_norm(p.softmax(x, -1), -1), p.max(x, -1, keepdim=True))
    p.output(p.rms_norm(p.reshape(t @ w, (2, 16, 2, 4)), -1))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    assert [[n.op for n in part] for part in ks._split(ks._split_orders()[0])[0]] == [
        ["softmax", "rms_norm", "max", "sub", "matmul"], ["reshape"], ["rms_norm"]]
    split = ks.program_split()
    # the last part, one rms_norm, is a graph kernel or the library's
    assert split and all([type(k) for k in sg.kernels][:2] == [GraphKernel, LibraryKernel] for sg in split)
    seeded = run_search(p, h100, SearchConfig(), max_states=3_000)
    baseline = next(v for v in seeded.verified if v.sgraph.name.endswith(".unfused"))
    assert seeded.best.verdict.proved and seeded.best.sgraph.dumps() in {sg.dumps() for sg in split}
    assert seeded.best.best.estimate.time_us < baseline.best.estimate.time_us / 2  # 5.9 us against 12.0
    monkeypatch.setattr(KernelSearch, "program_split", lambda self, whole=False: [])
    unseeded = run_search(p, h100, SearchConfig(), max_states=3_000)
    assert unseeded.best.sgraph.name.endswith(".unfused")


def test_a_split_part_no_kernel_can_hold_is_cut_shorter(h100):
    """A gated MLP whose residual add follows the down projection, after a reshape of a scaled
    input (so the program is cut into parts): as one part it needs every weight whole in one
    block (the add reads the finished product: no loop over the hidden dim), 768 KB of shared
    memory, and every split schedule was refused ("no valid instantiation"). Parts now have valid
    sizes, and of the two longest from each point the cut whose kernels the cost model ranks
    fastest is kept: before the down projection (cut before the add instead, each block of rows
    would read all three weights)."""
    p = Program("mlp_residual")
    x = p.reshape(p.input("X", (2, 16, 256), "f16") * 0.5, (32, 256))
    wg, wu, wd = p.input("Wg", (256, 512), "f16"), p.input("Wu", (256, 512), "f16"), p.input("Wd", (512, 256), "f16")
    xn = p.rms_norm(x, -1)
    p.output(p.op("add", x, (p.silu(xn @ wg) * (xn @ wu)) @ wd, name="O"))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    [order] = ks._split_orders()
    assert [[n.op for n in part] for part in ks._split(order)[0]] == [
        ["mul"], ["reshape"], ["rms_norm", "matmul", "silu", "matmul", "mul"], ["matmul", "add"]]
    split = ks.program_split()
    assert split and all(rank(sg, h100) for sg in split)


def test_a_program_one_kernel_cannot_hold_is_split_by_the_probe(h100):
    """The same MLP without the reshape fits one block graph by its op and input counts, so the
    split was skipped, though no one-kernel schedule has valid sizes; its one-kernel search runs
    tens of thousands of states. `program_split(whole=True)` cuts it anyway, and the probe (after
    the first 5,000 states) runs it first: the 2-kernel schedule is the winner at 6,000 states."""
    p = Program("mlp_residual")
    x = p.input("X", (32, 256), "f16")
    wg, wu, wd = p.input("Wg", (256, 512), "f16"), p.input("Wu", (256, 512), "f16"), p.input("Wd", (512, 256), "f16")
    xn = p.rms_norm(x, -1)
    p.output(p.op("add", x, (p.silu(xn @ wg) * (xn @ wu)) @ wd, name="O"))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    assert ks.fits_one_part() and ks.program_split() == []
    assert {len(sg.graph_kernels) for sg in ks.program_split(whole=True)} == {2}
    result = run_search(p, h100, SearchConfig(), max_states=6000)
    assert result.best.verdict.proved and len(result.best.sgraph.graph_kernels) == 2
    [baseline] = [v for v in result.verified if v.sgraph.name.endswith(".unfused")]
    assert result.best.best.estimate.time_s < baseline.best.estimate.time_s / 2


def test_a_split_part_finishes_its_products_after_a_loop_over_their_shared_dim(h100):
    """A llama MLP block at its real width (X (16, 4096), 11008 hidden): silu of a partial sum is
    not the sum, so with every op in the loop body no loop can walk the 4096 columns of the
    normalized X, each block must read whole weight columns, and every split schedule took longer
    than the unfused 110.4 us (the best 321.9 us). Placed after the loop over the products'
    accumulators (`Generator.program_graphs`), silu and the product finish them once, and so does
    the norm (X's mean square taken in the loop beside the products: `_norms_after_products`):
    the gated kernel loops, the one-op parts are the library's, 96.9 us (99.0 with the norm a
    library kernel of its own), proved."""
    p = llama_mlp(16, 4096, 11008)
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    best = min(ks.program_split(whole=True), key=lambda sg: rank(sg, h100)[0].estimate.time_s)
    assert [k.op if isinstance(k, LibraryKernel) else "graph" for k in best.kernels] == ["graph", "matmul", "add"]
    [gated] = best.graph_kernels
    assert sorted(o.op for o in gated.block.body) == ["matmul", "matmul", "mean", "square"]
    assert sorted(o.op for o in gated.block.post if o.op != "const") == ["add", "div", "div", "mul", "silu", "sqrt"]
    ranked = rank(best, h100)[0]
    assert ranked.params[gated.block.loop.name] > 1
    assert ranked.estimate.time_s < 0.9 * rank(unfused_baseline(p), h100)[0].estimate.time_s
    from superopt.verifier.verify import verify

    assert verify(p, best, target=h100).proved


def test_a_norm_and_the_three_products_reading_it_are_one_split_part(h100):
    """rms_norm before a decoder's Q, K and V projections (X (16, 4096)): applied to the products
    after the loop (`_norms_after_products`), the part needs four accumulators, X's mean square
    beside the three products, one more than a grown block graph takes (`MAX_ACCUMULATORS`); a
    given part may take it (`PART_ACCUMULATORS`), so the norm is no library kernel of its own:
    37.2 us against 39.3 with it, proved."""
    p = norm_projections(16, 4096, 4096)
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    timed = sorted(((rank(sg, h100)[0].estimate.time_s, n), sg) for n, sg in enumerate(ks.program_split(whole=True)))
    best = timed[0][1]
    [fused] = best.kernels
    assert isinstance(fused, GraphKernel) and len(fused.block.accumulators) == 4
    assert sorted(o.op for o in fused.block.body) == ["matmul", "matmul", "matmul", "mean", "square"]
    with_library_norm = [t for (t, _), sg in timed if [getattr(k, "op", "graph") for k in sg.kernels] == ["rms_norm", "graph"]]
    assert with_library_norm and timed[0][0][0] < min(with_library_norm)
    from superopt.verifier.verify import verify

    assert verify(p, best, target=h100).proved


def test_a_norm_only_products_read_is_applied_to_the_products():
    """`_norms_after_products` rewrites rms_norm(X) @ W as (X @ W) / sqrt(mean(X^2) + eps), for
    every product reading the norm (its value unchanged, in float64 on fresh inputs); a norm the
    program also returns, or reads otherwise, stays."""
    from superopt.reference import evaluate, max_rel_err, random_inputs

    p = llama_mlp(4, 32, 64)
    q = _norms_after_products(p)
    assert q is not None and program_ops(q).count("div") == 2 and "rms_norm" not in program_ops(q)
    inputs = random_inputs(p, 7)
    for want, got in zip(evaluate(p, inputs), evaluate(q, inputs), strict=True):
        assert max_rel_err(got, want) < 1e-12
    returned = Program("returned_norm")
    xn = returned.rms_norm(returned.input("X", (4, 32), "f16"), -1)
    returned.output(xn @ returned.input("W", (32, 8), "f16"), xn)
    scaled = Program("scaled_norm")
    xn = scaled.rms_norm(scaled.input("X", (4, 32), "f16"), -1)
    scaled.output(xn @ scaled.input("W", (32, 8), "f16"), scaled.sum(xn, -1, keepdim=True))
    assert _norms_after_products(returned) is None and _norms_after_products(scaled) is None


def test_split_parts_read_a_value_and_its_transpose_and_write_every_value_they_keep(h100):
    """Found by a fuzz of split programs. A part reading a square value and its transpose (a Gram
    matrix a @ a^T, whose transpose is computed from views of the inputs) took one tensor for
    both, the value and its transpose agreeing in shape and value class: the part program got
    one input twice and optimize failed ("duplicate node id"). Operands now match by their dims'
    classes too, and two operands take two tensors where there are two. And a part's kernel that
    did not write a value the part returns (gelu(X @ W0 + X), returned and read by the rest) was
    kept, the cheapest schedules were all such, and the split gave none."""
    gram = Program("gram")
    a = gram.input("X", (16, 64), "f16") @ gram.input("Wa", (64, 16), "f16")
    gram.output(a @ gram.transpose(a, (1, 0)))
    ks = KernelSearch(gram, space_of(gram), Oracle(gram), SearchConfig(), target=h100)
    assert ks.program_split()
    assert run_search(gram, h100, SearchConfig(), max_states=300).best.verdict.proved
    p = Program("returned_and_read")
    x = p.input("X", (12, 32), "f32")
    h = p.op("gelu", x @ p.input("W0", (32, 32), "f32") + x)
    o = p.rms_norm(p.rms_norm(h @ p.input("W1", (32, 96), "f32"), -1) @ p.input("W2", (96, 32), "f32"), -1)
    p.output(h, o @ p.input("W3", (32, 64), "f32"))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    split = ks.program_split()
    assert split and all(len(sg.graph_kernels) <= 3 for sg in split)
    result = run_search(p, h100, SearchConfig(), max_states=300)
    assert result.best.verdict.proved and not result.best.sgraph.name.endswith(".unfused")


def test_the_split_moves_library_ops_early_so_independent_projections_share_a_kernel(h100):
    """A multi-head attention block cannot be one kernel. Cut in the order the program lists its
    ops, a reshape and a transpose fall between every two projections: each projection is a part
    of its own (a library matmul), 12.1 us at X (64, 256) on the cost model. With each library op
    as early as its operands allow (`_split_orders`), the projections come first and share one
    kernel side by side (a part writes as many values as it accumulates: the search grows block
    graphs of two), the scale joins the attention, and the output projection is a graph kernel
    reading the merged heads in place (`SGraph.reshaped_views`; 8.5 us)."""
    p = attention_block(16, 64, 2)
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    listed, leveled = ks._split_orders()
    assert [[n.op for n in part] for part in ks._split(leveled)[0]] == [
        ["matmul", "matmul", "matmul"], *[["reshape"]] * 3, *[["transpose"]] * 3,
        ["mul", "matmul", "exp", "sum", "div", "matmul"], ["transpose"], ["reshape"], ["matmul"]]
    assert [len(part) for part in ks._split(listed)[0]] == [1, 1, 1, 2, 1, 1, 1, 1, 1, 5, 1, 1, 1]
    split = ks.program_split()
    # the listed order: the Q, K and V projections are library matmuls (one-op parts)
    assert {sum(isinstance(k, GraphKernel) for k in sg.kernels) for sg in split} == {3}
    out = run_search(p, h100, SearchConfig(), max_states=600)
    kinds = [k.op if isinstance(k, LibraryKernel) else "graph" for k in out.best.sgraph.kernels]
    assert out.best.verdict.proved and kinds[0] == kinds[-4] == kinds[-1] == "graph" and kinds[-2] == "reshape"
    assert out.best.best.estimate.launches == 3
    listed_best = min(rank(sg, h100)[0].estimate.time_s for sg in split if len(sg.kernels) == 13)
    assert out.best.best.estimate.time_s < 0.8 * listed_best
