"""Small programs whose ops the search fuses into one proved kernel."""

from __future__ import annotations

import pytest
from search_helpers import graph_kernels

from superopt import Program
from superopt.config import SearchConfig
from superopt.search.block import Generator, InputSpec
from superopt.search.driver import run_search
from superopt.search.floors import Floors
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_two_outputs_of_one_matmul_come_from_one_proved_kernel(h100):
    """A last kernel may write several program outputs at once: each of its outputs is matched
    to a missing one by value, shape and dim classes (the bound on last kernels assumes the
    classes), so exp(X @ W) and the row sums of X @ W come from one fused kernel."""
    p = Program("two_outputs")
    y = p.input("X", (8, 64), "f16") @ p.input("W", (64, 32), "f16")
    p.output(p.op("exp", y, name="E"))
    p.output(p.op("sum", y, name="S", dim=-1, keepdim=True))
    outcome = run_search(p, h100, SearchConfig(), budget_s=60)
    best = outcome.best
    assert len(best.sgraph.kernels) == 1 and graph_kernels(best.sgraph)
    assert len(best.sgraph.kernels[0].outputs) == 2 and best.verdict.proved
    assert not outcome.stats.budget_exhausted


@pytest.mark.parametrize("widths", [(1024, 1024), (1024, 1024, 1024), (2048, 512, 512)])
def test_independent_projections_are_fused_side_by_side(h100, monkeypatch, widths):
    """(X @ Wq, X @ Wk[, X @ Wv]): the outputs share no column class, yet one grid axis may split
    the columns of every weight side by side; one kernel reads X once per block and replaces the
    library matmuls. Also when the widths differ (grouped-query attention's narrower K and V:
    each weight's tile is its width over the axis size, which divides every width). The bounds
    know such axes (`_output_axes`): the search with bounds keeps the kernel a search without
    any bound finds (with two weights they cut it before)."""
    weights = len(widths)

    def program() -> Program:
        p = Program("projections")
        x = p.input("X", (16, 1024), "f16")
        p.output(*[x @ p.input(f"W{i}", (1024, width), "f16") for i, width in enumerate(widths)])
        return p

    outcome = run_search(program(), h100, SearchConfig())
    sg = outcome.best.sgraph
    assert outcome.best.verdict.proved and [type(k) for k in sg.kernels] == [GraphKernel]
    (kernel,) = sg.kernels
    split = [a for a in range(len(kernel.block.grid)) if all(i.imap[a] == 1 for i in kernel.block.inputs[1:])]
    assert len(split) == 1 and kernel.block.inputs[0].imap[split[0]] is None  # X whole in every block
    assert [o.omap[split[0]] for o in kernel.block.outputs] == [1] * weights
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert outcome.best.best.estimate.time_s < baseline.best.estimate.time_s
    monkeypatch.setattr(Floors, "bound_s", property(lambda self: float("inf"), lambda self, value: None), raising=False)
    exhaustive = run_search(program(), h100, SearchConfig(max_kernel_ops=1))
    assert exhaustive.best.sgraph.dumps() == sg.dumps()


@pytest.mark.parametrize("reduce", ["both dims", "one dim each", "one dim per output"])
def test_a_program_that_leaves_no_dim_to_split_runs_as_one_block(h100, reduce):
    """sum(sum(exp(X))) reduces every dim, softmax over rows after an rms_norm over columns reduces
    one dim each, the column and row sums of X @ W each reduce the dim the other keeps: no class
    is left for a grid axis to split, and such block graphs had no tiling (two or three library
    kernels). One block computes them, on a grid axis of size 1 that splits nothing, its loop
    walking X where it can. (A loop walking the rows of X and the columns of W at once computes
    only the diagonal blocks of X @ W: such tilings are refused, where one crashed the search.)"""
    p = Program("whole")
    x = p.input("X", (16, 32), "f32")
    if reduce == "both dims":
        p.output(p.sum(p.sum(p.exp(x), 0, keepdim=True), 1, keepdim=True))
    elif reduce == "one dim each":
        p.output(p.softmax(p.rms_norm(x, 0), 1))
    else:
        h = x @ p.input("W", (32, 16), "f32")
        p.output(p.sum(h, 0, keepdim=True), p.sum(h, 1, keepdim=True))
    outcome = run_search(p, h100, SearchConfig())
    sg = outcome.best.sgraph
    assert outcome.best.verdict.proved and [type(k) for k in sg.kernels] == [GraphKernel]
    (axis,) = sg.kernels[0].block.grid
    assert axis.size.is_const() and axis.size.int_value() == 1
    assert all(i.imap == (None,) for i in sg.kernels[0].block.inputs)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert outcome.best.best.estimate.time_s < baseline.best.estimate.time_s


def test_a_value_the_kernel_computes_from_and_returns_is_written_by_the_same_kernel(h100):
    """A residual sum returned with its rms_norm (and exp(X) returned with exp(X) @ W): the block
    graph reads the sum, so it is no sink, yet it is a program output, so it may be accumulated
    and written too: one proved kernel instead of the two-launch baseline."""
    add_norm = Program("add_rmsnorm")
    h = add_norm.op("add", add_norm.input("X", (8, 4096), "f16"), add_norm.input("R", (8, 4096), "f16"))
    add_norm.output(h, add_norm.rms_norm(h, -1))
    with_product = Program("exp_and_product")
    e = with_product.op("exp", with_product.input("X", (4, 16), "f16"))
    with_product.output(e @ with_product.input("W", (16, 8), "f16"), e)
    for p in (add_norm, with_product):
        outcome = run_search(p, h100, SearchConfig())
        best = outcome.best
        baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
        assert best.verdict.proved and len(best.sgraph.kernels) == 1, best.sgraph.dumps()
        assert len(best.sgraph.kernels[0].outputs) == 2
        assert best.best.estimate.time_us < baseline.best.estimate.time_us


@pytest.mark.parametrize("first,second", [("sqrt", "rsqrt"), ("square", "gelu"), ("neg", "sigmoid"),
                                          ("silu", "sigmoid"), ("sigmoid", "silu")])
def test_two_ops_on_one_tensor_fuse_when_one_contains_the_other(h100, first, second):
    """rsqrt(X) is 1 / sqrt(X) to the prover: beside a sqrt(X) tile it contains that tile's value
    without being built from it. That is a recomputation only when one op of the space builds it
    from the tile; with no division in the program, computing it from X is the only way (found by
    probing optimize: these programs got two kernels). Likewise sigmoid(X) lies inside silu(X)
    (X * sigmoid(X)), which the space cannot rebuild from it without a product."""
    p = Program("pair")
    x = p.input("X", (8, 16), "f32")
    p.output(p.op("add", p.op(first, x), p.op(second, x)))
    out = run_search(p, h100, SearchConfig(), budget_s=60)
    assert not out.stats.budget_exhausted and out.best.verdict.proved
    assert len(out.best.sgraph.kernels) == 1 and isinstance(out.best.sgraph.kernels[0], GraphKernel)


def test_a_negation_is_fused_wherever_the_schedule_takes_it(h100):
    """Abstract values used to drop signs: -t looked like a recomputation of t, so no block graph
    could negate, and -(X·0.5) @ W stayed four library kernels; the same conflation kept only the
    first of two loop bodies whose values differ by a sign. Signs are now kept (the oracle holds
    each one before and after products, quotients and sums), -(-t) is t, and the prover moves
    signs outward."""
    p = Program("negated")
    x, w = p.input("X", (4, 8), "f16"), p.input("W", (8, 6), "f16")
    p.output(p.neg(p.mul(x, 0.5)) @ w)
    best = run_search(p, h100, SearchConfig()).best
    assert len(best.sgraph.kernels) == 1 and best.verdict.proved
    (kernel,) = graph_kernels(best.sgraph)
    assert [op.op for op in (*kernel.block.body, *kernel.block.post)].count("neg") == 1
    gen = Generator(space_of(p), Oracle(p), 4)
    specs = [InputSpec(0, (4, 8), ("inp", "X"), (0, 1)), InputSpec(1, (8, 6), ("inp", "W"), (1, 2))]
    for s in gen.complete_graphs(gen.start(specs)):
        assert not any(t.op == "neg" and s.tiles[t.args[0]].op == "neg" for t in s.tiles)
    q = Program("negated_silu")  # silu(-X) is not -silu(X): negated before the silu, in the loop
    y = q.input("X", (2, 4, 8), "f16")
    q.output(q.op("silu", q.neg(y)) @ q.input("W", (2, 8, 6), "f16"))
    best = run_search(q, h100, SearchConfig()).best
    assert len(best.sgraph.kernels) == 1 and best.verdict.proved


@pytest.mark.parametrize(("name", "build"), [
    ("softmax_over_mean", lambda p, x, w: (p.softmax(x, -1) / p.mean(x, -1, keepdim=True)) @ w),
    ("sum_and_mean", lambda p, x, w: (p.sum(x, -1, keepdim=True) + p.mean(x, -1, keepdim=True)) * x @ w),
])
def test_a_mean_is_told_from_a_sum(h100, name, build):
    """Abstract values drop a mean's 1/n: sum(X) and mean(X) are one. A loop body dividing by
    one stood for the body dividing by the other, and only the first generated (the sum, refuted)
    was kept; a block graph could not hold both either. Tiles now carry numeric fingerprints:
    each program fuses into one proved kernel (before: two kernels, after 8-27 refuted ones)."""
    p = Program(name)
    x, w = p.input("X", (4, 16), "f16"), p.input("W", (16, 8), "f16")
    p.output(build(p, x, w))
    outcome = run_search(p, h100, SearchConfig(), budget_s=60)
    assert not outcome.stats.budget_exhausted
    assert outcome.best.verdict.proved and len(outcome.best.sgraph.kernels) == 1


def test_an_added_constant_is_told_from_a_norms_epsilon(h100):
    """(rms_norm(X) + 0.5) @ W: with every added constant one abstract atom, x + 0.5 and x + eps
    (the norm's) were one value; the generator kept the first loop body per accumulated value,
    the one adding eps, which the finite fields refuted, and the program stayed three library
    kernels. The program's constants are leaves of their own: only the right one is generated."""
    p = Program("biased")
    x, w = p.input("X", (8, 4), "f16"), p.input("W", (4, 12), "f16")
    p.output(p.op("add", p.rms_norm(x), 0.5) @ w)
    outcome = run_search(p, h100, SearchConfig())
    assert len(outcome.best.sgraph.kernels) == 1 and outcome.best.verdict.proved
    (kernel,) = graph_kernels(outcome.best.sgraph)
    assert [op.attrs for op in kernel.block.body if op.op == "const"] == [{"value": 0.5}]
    assert not outcome.rejected  # the eps variant is not even generated
