"""Symbolic search: finds and proves the fused schedules, reuses them across shapes, deterministic."""

from __future__ import annotations

import gc
import itertools
import json
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace

import pytest
from kernel_shapes import attention_block, llama_mlp, norm_projections
from typer.testing import CliRunner

from superopt import Program, workloads
from superopt.api import optimize
from superopt.build import SGraphBuilder, unfused_baseline
from superopt.cli import app
from superopt.config import SearchConfig
from superopt.loading import load_program
from superopt.program import Tensor
from superopt.search import kernel as kernel_module
from superopt.search.block import Generator, InputSpec, _norms_after_products
from superopt.search.driver import FULL_COLLECTION_AFTER, Searcher, Shard, run_search
from superopt.search.fingerprint import fingerprint, random_inputs
from superopt.search.instantiation import rank
from superopt.search.kernel import BudgetExhausted, KernelSearch
from superopt.search.space import space_of
from superopt.sgraph import GraphKernel, LibraryKernel
from superopt.verifier.oracle import Oracle


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory (kept sGraphs, SQLite kernel cache)."""
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SUPEROPT_DB_URL", raising=False)


def graph_kernels(sg) -> list[GraphKernel]:
    return [k for k in sg.kernels if isinstance(k, GraphKernel)]


def ops_of(k: GraphKernel, phase: str) -> list[str]:
    return sorted(o.op for o in getattr(k.block, phase))


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_search_finds_a_schedule_as_good_as_the_reference(name, h100, searched):
    program, outcome = searched(f"{name}:ci")
    ref = workloads.get(name).reference(program)
    ref_us = rank(ref, h100)[0].estimate.time_us
    best = outcome.best
    assert best.verdict.proved and best.verdict.egraph == "proved"
    assert best.best.estimate.time_us <= ref_us + 1e-9, (best.best.estimate.time_us, ref_us)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert best.best.estimate.time_us < baseline.best.estimate.time_us
    assert not outcome.stats.budget_exhausted


def test_rmsnorm_matmul_rediscovers_the_fused_family(searched):
    """One graph-defined kernel whose loop walks the hidden dim: both matmul operands walked, the
    product and the mean of squares accumulated, the division after the loop."""
    _, outcome = searched("rmsnorm_matmul:ci")
    fused = [v.sgraph for v in outcome.verified if len(v.sgraph.kernels) == 1 and graph_kernels(v.sgraph)]
    assert fused
    families = []
    for sg in fused:
        (k,) = graph_kernels(sg)
        fmap = {i.tensor: i.fmap for i in k.block.inputs}
        accs = sorted(a.kind for a in k.block.accumulators)
        families.append((fmap.get("X"), fmap.get("W"), accs, "matmul" in ops_of(k, "body"), ops_of(k, "post")))
    assert (1, 0, ["mean", "sum"], True, ["add", "const", "div", "sqrt"]) in families


def test_gated_mlp_rediscovers_the_fused_family(searched):
    _, outcome = searched("gated_mlp:ci")
    best = outcome.best.sgraph
    (k,) = graph_kernels(best)
    assert len(best.kernels) == 1
    assert ops_of(k, "body") == ["matmul", "matmul"]
    assert ops_of(k, "post") == ["mul", "silu"]
    assert {a.kind for a in k.block.accumulators} == {"sum"}
    assert {i.tensor: i.fmap for i in k.block.inputs} == {"X": 1, "W1": 0, "W2": 0}


def _ops(tiles: Iterator, consts: bool = False) -> list[str]:
    """The block ops of these tiles, each chain's (`Chain`) one by one; `consts`: a "const" for
    each op with constant operands too, as an sGraph lists them."""
    out = []
    for t in tiles:
        steps = dict(t.attrs)["ops"] if t.op == "chain" else [(t.op, t.args, t.consts)]
        out += [op for op, _, c in steps] + ["const"] * sum(1 for _, _, c in steps if c and consts)
    return out


def test_pruning_keeps_every_reference_block_graph(h100):
    """The generator, with the oracle pruning, produces the reference's block graph (up to naming)
    for every single-kernel reference: pruning never cuts its prefixes."""
    for name in ("rmsnorm_matmul", "gated_mlp", "rmsnorm_mlp", "ntrans"):
        program, ref = workloads.reference_for(f"{name}:ci")
        (k,) = graph_kernels(ref)
        want = (ops_of(k, "body"), sorted(a.kind for a in k.block.accumulators), ops_of(k, "post"))
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
        specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]
        gen = Generator(space_of(program), ks.oracle, len(k.block.body) + len(k.block.post))
        seen = set()
        for s in gen.complete_graphs(gen.start(specs)):
            body = sorted(_ops(t for t in s.tiles if t.phase == 0 and t.op != "input"))
            post = sorted(_ops((t for t in s.tiles if t.phase == 1 and t.op != "acc"), consts=True))
            seen.add((tuple(body), len([t for t in s.tiles if t.op == "acc"]), tuple(post)))
        assert (tuple(want[0]), len(want[1]), tuple(want[2])) in seen, name


def test_deeper_graphs_are_not_grown_from_kernels_that_finish_or_go_unused(h100):
    """After a kernel that already computes every output, no second kernel is searched (it could
    only add a launch); and the last kernel must read what an earlier kernel computed, so a first
    kernel whose results nothing uses leaves no subset of raw inputs to search: the last kernel
    reads every one of them (a candidate reads or returns every tensor)."""
    program = workloads.resolve("gated_mlp:ci")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig())
    firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1, 2)))
    done = next(st for st in firsts if not ks._missing(st))
    before = ks.total_states
    assert list(ks._at_depth(done, 2)) == [] and ks.total_states == before + 1
    partial = next(st for st in firsts if ks._missing(st) and st.tensors[-1].chunk is None)
    new = {t.id for t in partial.tensors[len(program.inputs):]}
    assert len(new) == 2 and ks._unused(partial) == list(range(len(program.inputs), len(partial.tensors)))
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


def test_attention_finds_a_fused_schedule_better_than_unfused(searched):
    _, outcome = searched("gqa:ci")
    best = outcome.best
    assert graph_kernels(best.sgraph)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert best.best.estimate.time_us < baseline.best.estimate.time_us


def test_lora_fuses_into_one_proved_kernel(searched):
    """Neither Mirage nor Prism finds a kernel for LoRA; the whole block fits one launch here."""
    _, outcome = searched("lora:ci")
    best = outcome.best.sgraph
    assert len(best.kernels) == 1 and graph_kernels(best)
    assert outcome.best.verdict.proved


def test_same_input_gives_the_same_winner(h100, searched):
    program, first = searched("gqa:ci")
    second = run_search(program, h100, SearchConfig(), budget_s=120)
    assert first.best.sgraph.dumps() == second.best.sgraph.dumps()
    assert first.best.best.params == second.best.best.params
    assert first.stats.states == second.stats.states


def test_symbolic_search_visits_fewer_states_than_concrete(h100, searched):
    _, symbolic = searched("rmsnorm_matmul:ci", max_kernel_ops=1)
    program = workloads.resolve("rmsnorm_matmul:ci")
    concrete = run_search(program, h100, SearchConfig(max_kernel_ops=1, concrete=True),
                          max_states=5 * symbolic.stats.states)
    assert not symbolic.stats.budget_exhausted
    assert concrete.stats.budget_exhausted  # concrete needs more than five times the states
    assert concrete.stats.states >= 5 * symbolic.stats.states


def test_a_free_view_kernel_after_a_fused_one_is_not_cut_by_the_bound(h100, monkeypatch):
    """A reshape is a view: its library kernel costs no launch and moves no bytes. Bounds that
    charge every kernel to come a launch and the outputs' bytes would cut the fused kernel that
    a reshape follows (a launch over the unfused baseline's time), leaving the baseline; the
    search finds the fused kernel and the view, as a search without any bound does."""
    from superopt.search.kernel import KernelSearch

    def program() -> Program:
        p = Program("viewed")
        x, w = p.input("X", (64, 256), "f16"), p.input("W", (256, 512), "f16")
        p.output(p.op("reshape", p.exp(x) @ w, name="O", shape=[128, 256]))
        return p

    config = SearchConfig(max_kernel_ops=3)
    outcome = run_search(program(), h100, config)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert [getattr(k, "op", "graph") for k in outcome.best.sgraph.kernels] == ["graph", "reshape"]
    assert outcome.best.verdict.proved
    assert outcome.best.best.estimate.time_s + h100.launch_overhead_s > baseline.best.estimate.time_s
    monkeypatch.setattr(KernelSearch, "bound_s", property(lambda self: float("inf"), lambda self, value: None))
    exhaustive = run_search(program(), h100, config)  # every graph generated: the same winner
    assert exhaustive.best.sgraph.dumps() == outcome.best.sgraph.dumps()


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
    monkeypatch.setattr(KernelSearch, "bound_s", property(lambda self: float("inf"), lambda self, value: None))
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


def test_a_transposed_value_times_an_input_reads_the_input_transposed(h100):
    """exp(transpose(X @ W)) * Y: one kernel computes exp(X @ W) * Y^T, reading Y through a view
    and viewed transposed itself (the prover undoes a transpose's inverse across the product),
    where the mul was a kernel of its own."""
    p = Program("scaled")
    x, w, y = p.input("X", (64, 512), "f16"), p.input("W", (512, 64), "f16"), p.input("Y", (64, 64), "f16")
    p.output(p.exp(p.transpose(x @ w, (1, 0))) * y)
    outcome = run_search(p, h100, SearchConfig(max_kernel_ops=3))
    sg = outcome.best.sgraph
    assert outcome.best.verdict.proved
    assert [getattr(k, "op", "graph") for k in sg.kernels] == ["transpose", "graph", "transpose"]
    assert sg.kernels[0].inputs == ("Y",) and sg.kernels[0].output in sg.kernels[1].tensor_inputs
    assert [e.time_s for e in outcome.best.best.estimate.kernels][::2] == [0.0, 0.0]


def test_a_transposed_input_is_read_in_place_as_fast_as_one_given_transposed(searched_attention):
    """`Q @ transpose(K)` gets the kernels that `Q @ Kt` with Kt given transposed gets, as fast:
    the transpose is a view (free) that the fused kernel reads in place, and the search sees it as
    an input (`ProgramViews`), not as a kernel to fuse around."""
    (_, natural), (_, given) = searched_attention(False), searched_attention(True)
    assert natural.best.verdict.proved and not natural.stats.budget_exhausted
    sg = natural.best.sgraph
    view = sg.kernels[0]
    assert isinstance(view, LibraryKernel) and view.op == "transpose" and view.inputs == ("K",)
    assert sg.views == {view.output: ("K", (0, 2, 1))}
    assert any(view.output in k.tensor_inputs for k in graph_kernels(sg))
    assert natural.best.best.estimate.kernels[0].time_s == 0.0
    assert [getattr(k, "op", "graph") for k in sg.kernels[1:]] == \
        [getattr(k, "op", "graph") for k in given.best.sgraph.kernels]
    assert natural.best.best.estimate.time_s == pytest.approx(given.best.best.estimate.time_s, rel=1e-9)
    assert natural.stats.depth == given.stats.depth


def test_a_reshaped_input_is_read_in_place_by_a_fused_kernel(h100):
    """A reshape of an input is the same memory: `exp(reshape(X)) * Y` is one fused kernel after
    the free reshape (the search's dim classes do not follow a reshape; the input they see is the
    reshaped one), not three library kernels."""
    p = Program("reshaped")
    x, y = p.input("X", (64, 256), "f16"), p.input("Y", (128, 128), "f16")
    p.output(p.exp(p.reshape(x, (128, 128))) * y)
    outcome = run_search(p, h100, SearchConfig())
    sg = outcome.best.sgraph
    assert [getattr(k, "op", "graph") for k in sg.kernels] == ["reshape", "graph"]
    assert sg.kernels[0].inputs == ("X",) and outcome.best.verdict.proved
    assert outcome.best.best.estimate.kernels[0].time_s == 0.0


@pytest.mark.parametrize("cols", [256, 64])
def test_a_transpose_between_ops_becomes_a_view_of_the_fused_kernels_output(h100, cols):
    """exp(transpose(X @ W)) is the transpose of exp(X @ W) (the e-graph's transpose rules): one
    fused kernel, then a free view of its output; not a matmul, a copy and an exp. Also when the
    product is square: its transpose has the shape and expression of the product itself, but not
    its dim classes, so it is not cut as a repeat (`KernelSearch._repeats`)."""
    p = Program("transposed_between")
    x, w = p.input("X", (64, 512), "f16"), p.input("W", (512, cols), "f16")
    p.output(p.exp(p.transpose(x @ w, (1, 0))))
    outcome = run_search(p, h100, SearchConfig())
    sg = outcome.best.sgraph
    assert [getattr(k, "op", "graph") for k in sg.kernels] == ["graph", "transpose"]
    assert sg.views == {sg.outputs[0]: (sg.kernels[0].outputs[0], (1, 0))}
    assert outcome.best.verdict.proved and outcome.best.verdict.egraph == "proved"


def test_views_at_the_edges_are_left_out_of_the_searched_program():
    """Views of inputs become inputs and views returned become the values they view, except a
    view returned of an input (nothing to compute) or of a value returned too; unfolded, the
    searched program's schedule is one of the program's, proved."""
    from superopt.search.views import ProgramViews
    from superopt.verifier.verify import verify

    p = Program("views")
    x, w = p.input("X", (8, 16), "f16"), p.input("W", (8, 16), "f16")
    xt = p.op("transpose", x, name="XT", perm=[1, 0])
    y = p.op("matmul", x, xt, name="Y")
    p.output(p.exp(xt) @ w, p.op("transpose", w, name="WT", perm=[1, 0]),
             p.op("reshape", p.exp(y), name="R", shape=[4, 16]))
    views = ProgramViews(p)
    assert [n.id for n in views.inputs] == ["XT"] and [(i, n.id) for i, n in views.outputs] == [(2, "R")]
    assert [(n.id, n.shape) for n in views.program.inputs] == [("X", (8, 16)), ("W", (8, 16)), ("XT", (16, 8))]
    searched = views.program.outputs
    assert searched[1] == "WT" and views.program.nodes[searched[2]].op == "exp"
    sg = views.unfold(unfused_baseline(views.program))
    assert [t.id for t in sg.inputs] == ["X", "W"]
    assert (sg.kernels[0].op, sg.kernels[-1].op, sg.outputs[2]) == ("transpose", "reshape", "R")
    assert verify(p, sg).proved
    twice = Program("twice")
    e = twice.exp(twice.input("X", (4, 8), "f16"))
    twice.output(twice.transpose(e, (1, 0)), twice.reshape(e, (8, 4)))
    assert ProgramViews(twice).program is twice  # both would return e
    plain = Program("plain")
    plain.output(plain.exp(plain.input("X", (4, 4), "f16")))
    assert ProgramViews(plain).program is plain and ProgramViews(plain).unfold(unfused_baseline(plain)).kernels[0].op == "exp"


def _moved_transposes(kind: str) -> Program:
    p = Program(kind.replace(" ", "_"))  # a program name has no spaces
    x, w = p.input("X", (2, 8, 12), "f32"), p.input("W", (2, 12, 6), "f32")
    if kind == "sunk":  # a softmax over the transposed product, a norm of it times an input
        e = p.exp(p.transpose(x @ w, (0, 2, 1)))
        s = e / p.sum(e, 1, keepdim=True)
        p.output(p.rms_norm(s, -1) * p.input("Y", (2, 6, 8), "f32"), s)
    elif kind == "sunk and cancelled":  # transposed back: returned as computed; returned and read
        m = p.transpose(x @ w, (0, 2, 1))
        p.output(p.transpose(p.exp(m), (0, 2, 1)), m, p.max(m, -1, keepdim=True))
    elif kind == "pushed up past an input":  # an input's operand before a reduction: not sunk
        e = p.exp(p.transpose(x @ w, (0, 2, 1))) * p.input("Y", (2, 6, 8), "f32")
        p.output(e / p.sum(e, 1, keepdim=True))
    elif kind == "pushed":  # read by a matmul: a projected K
        q, v = p.input("Q", (2, 5, 6), "f32"), p.input("V", (2, 8, 4), "f32")
        p.output(p.exp(q @ p.transpose(p.silu(x @ w) * 2.0, (0, 2, 1))) @ v)
    elif kind == "returned too":  # the product is returned: as a view of its pushed transpose
        m = x @ w
        p.output(p.exp(p.transpose(m, (0, 2, 1))) @ x, m)
    elif kind == "read twice":  # the product is read by another op too: both would be computed
        m = x @ w
        p.output(p.exp(p.transpose(m, (0, 2, 1))) @ x, p.exp(m))
    elif kind == "batch dim":  # a transpose of a batch dim with a row dim does not pass a matmul
        p.output(p.exp(p.transpose(x @ w, (1, 0, 2))) @ p.input("V", (8, 6, 4), "f32"))
    else:  # a reduction that drops its dim ends the way up, a matmul the way down
        p.output(p.transpose(p.sum(x @ w, 1), (1, 0)) @ p.input("V", (2, 4), "f32"))
    return p


@pytest.mark.parametrize("kind", ["sunk", "sunk and cancelled", "pushed", "pushed up past an input", "returned too",
                                  "read twice", "batch dim", "dropped dim"])
def test_transposes_of_computed_values_move_to_the_programs_edges(kind):
    """A transpose in the middle of a program sinks to the outputs (returned as views, the other
    operands on the way read as views of inputs) or is pushed up to views of inputs through
    matmuls, so the searched program has no free kernel inside; a value it transposes that is
    returned too is returned as a view of the pushed transpose; where a value is read twice, or
    an op does not commute with the transpose, it stays. The moved program computes the same
    values (float64 reference on random inputs) and its schedules are proved against the
    program itself."""
    from superopt.reference import evaluate, random_inputs
    from superopt.search.views import ProgramViews, _pushed
    from superopt.verifier.verify import verify

    p = _moved_transposes(kind)
    views = ProgramViews(p)
    computed = {n.id for n in p.topological() if n.op not in ("input", "const")}
    moved = [n for n in views.program.topological() if n.op == "transpose"]
    stays = [n.id for n in p.topological() if n.op == "transpose" and n.inputs[0] in computed]
    assert [n.id for n in moved] == ([] if kind.startswith(("sunk", "pushed", "returned")) else stays)
    if kind == "sunk":
        assert [n.id for n in views.inputs] == ["Y_t"] and [n.id for _, n in views.outputs] == p.outputs
    if kind == "sunk and cancelled":
        assert not views.inputs and [n.id for _, n in views.outputs] == p.outputs[1:]
        assert views.program.nodes[views.program.outputs[0]].inputs == (views.program.outputs[1],)  # exp(X @ W)
    if kind.startswith("pushed"):
        assert sorted(n.id for n in views.inputs) == ["W_t", "X_t"] and not views.outputs
    if kind == "returned too":  # X @ W returned as the view of W^T X^T, computed once
        assert sorted(n.id for n in views.inputs) == ["W_t", "X_t"]
        [(i, out)] = views.outputs
        assert (i, out.id, tuple(out.attrs["perm"])) == (1, p.outputs[1], (0, 2, 1))
        assert views.program.nodes[out.inputs[0]].inputs == ("W_t", "X_t")
    pushed = _pushed(p)
    inputs = random_inputs(p, seed=7)
    for got, want in zip(evaluate(pushed, inputs), evaluate(p, inputs), strict=True):
        assert got.shape == want.shape and abs(got - want).max() <= 1e-9 * max(1.0, abs(want).max())
    assert verify(p, views.unfold(unfused_baseline(views.program))).proved


@pytest.mark.parametrize("perms", [[(1, 0), (1, 0)], [(0, 1)]], ids=["cancelled", "identity"])
def test_transposes_returning_a_value_returned_already_stay(h100, perms):
    """(M, transpose(transpose(M))) and (M, transpose(M, identity)): moved, the transposes would
    return M twice, which a program cannot; they stay, and the search proves a schedule."""
    from superopt.search.views import ProgramViews

    p = Program("returned_twice")
    m = p.exp(p.input("X", (4, 6), "f32") @ p.input("W", (6, 5), "f32"))
    t = m
    for perm in perms:
        t = p.transpose(t, perm)
    p.output(m, t)
    assert len(set(ProgramViews(p).program.outputs)) == 2
    outcome = run_search(p, h100, SearchConfig(max_kernel_ops=3))
    assert outcome.best.verdict.proved


def test_a_program_at_the_node_limit_keeps_its_transposes():
    """Pushed up, a transpose adds the views of two inputs for itself and the product: a program
    at the node limit would pass it, so it is searched as written."""
    from superopt.program import MAX_NODES
    from superopt.search.views import ProgramViews

    p = Program("full")
    x, w, v = (p.input(n, (4, 4), "f32") for n in ("X", "W", "V"))
    t = p.transpose(x @ w, (1, 0)) @ v
    while len(p.nodes) < MAX_NODES:
        t = p.exp(t)
    p.output(t)
    assert ProgramViews(p).program is p


@pytest.mark.parametrize("returned", [False, True], ids=["attention", "K returned too"])
def test_attention_over_a_projected_k_searches_no_view_in_the_middle(h100, returned):
    """exp(Q @ transpose(X @ WK)) ...: the transpose is pushed up to views of X and WK, so the
    search's launch bounds hold (`Space.launches`) and one fused kernel computes the projection,
    the scores and their product with V (the transposed product was a free kernel between a
    library matmul and the fused one, and with the bounds off the search took minutes at the
    published shapes). Returned too (a KV cache write), the projected K is the view of the
    transposed product the fused kernel writes as a second output (with the transpose left in the
    middle, 178,023 states and 164 s at X (2, 1024, 256), Q (2, 64, 64); now 2,354 and 3.6 s)."""
    p = Program("projected_k")
    q, x = p.input("Q", (2, 16, 32), "f16"), p.input("X", (2, 64, 32), "f16")
    k = x @ p.input("WK", (2, 32, 32), "f16")
    e = p.exp(q @ p.transpose(k, (0, 2, 1)))
    p.output(p.matmul(e / p.sum(e, -1, keepdim=True), p.input("V", (2, 64, 32), "f16")), *([k] if returned else []))
    outcome = run_search(p, h100, SearchConfig())
    sg = outcome.best.sgraph
    assert outcome.best.verdict.proved and not outcome.stats.budget_exhausted
    assert [getattr(k, "op", "graph") for k in sg.kernels] == ["transpose", "transpose", "graph"] + ["transpose"] * returned
    views = [("WK", (0, 2, 1)), ("X", (0, 2, 1))] + [(sg.kernels[2].outputs[0], (0, 2, 1))] * returned
    assert sorted(sg.views.values()) == sorted(views)
    assert space_of(Searcher(p, h100, SearchConfig()).search.program).launches(2) == 2


def test_attention_over_the_heads_of_a_projected_k_is_fused(h100):
    """K = transpose(reshape(X @ WK, (n, heads, dh))): the reshape's dims take the program's dim
    classes, those the attention ties them to (`abstract_program`; a schedule's reshape of the
    same value gets them too), so one graph kernel computes the attention over the reshaped heads.
    They had none a block op could tie to Q's and V's, and the search returned the unfused
    baseline (`scripts/programs/attention_heads_k.json`: 12.3 us unfused, now 5.7 us)."""
    p = Program("heads_k")
    q, x = p.input("Q", (2, 8, 16), "f16"), p.input("X", (32, 32), "f16")
    k = p.transpose(p.reshape(x @ p.input("WK", (32, 32), "f16"), (32, 2, 16)), (1, 2, 0))
    e = p.exp(q @ k)
    p.output(p.matmul(e / p.sum(e, -1, keepdim=True), p.input("V", (2, 32, 16), "f16")))
    outcome = run_search(p, h100, SearchConfig(max_kernel_ops=4))
    best, baseline = outcome.best, next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert best.verdict.proved and not outcome.stats.budget_exhausted
    assert [getattr(k, "op", "graph") for k in best.sgraph.kernels] == ["matmul", "reshape", "transpose", "graph"]
    assert best.best.estimate.time_us < 0.6 * baseline.best.estimate.time_us


def test_a_reshape_between_kernels_takes_one_launch_off_the_bounds_not_all(h100):
    """A reshape of a computed value stays in the searched program as a free kernel. Each of the
    program's reshapes may be one free kernel of a provable schedule (no prover rule moves a
    reshape, and no value is computed twice), so the launch bounds charge the other kernels; they
    were off altogether (`rms_norm` of per-head slices of exp(X) * Y: 863,336 states and the
    whole 200 s budget, now a complete search of some 21,000). A transpose the program keeps in
    its middle still turns them off: the prover makes transposed values of many others."""
    p = Program("heads")
    x, y = p.input("X", (16, 1024), "f16"), p.input("Y", (16, 1024), "f16")
    p.output(p.rms_norm(p.reshape(p.exp(x) * y, (16, 8, 128)), -1))
    assert space_of(p).free_kernels == 1 and space_of(p).launches(3) == 2
    outcome = run_search(p, h100, SearchConfig(), budget_s=120)
    assert not outcome.stats.budget_exhausted and outcome.best.verdict.proved
    assert [getattr(k, "op", "graph") for k in outcome.best.sgraph.kernels] == ["graph", "reshape", "rms_norm"]
    kept = _moved_transposes("read twice")
    assert space_of(kept).free_kernels is None and space_of(kept).launches(3) == 0


def test_kernels_that_cannot_make_the_outputs_dims_are_not_grown(h100):
    """Block ops make no dims: a graph kernel's tensors have the dim classes of what it reads. So
    a last kernel whose inputs lack a class of the outputs (a head dim that a reshape made) is not
    generated, nor is any kernel but a reshape right before the last; and the only reshape searched
    is one of the value the program reshapes (no prover rule moves a reshape, so no other is
    proved). Two projections' product split into heads and normalized per head: a complete search,
    the fused product (one kernel, then the reshape and the norm), where a 15 s budget left the
    unfused schedule."""
    p = Program("heads_norm")
    x, w, v = p.input("X", (4, 8), "bf16"), p.input("W", (8, 6), "bf16"), p.input("V", (8, 6), "bf16")
    p.output(p.rms_norm(p.reshape(((x * p.sum(x, -1, keepdim=True)) @ w) * (x @ v), (4, 2, 3)), -1))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    start = ks.initial()
    assert ks._lacks_classes(start)
    walked = ks._gen.states
    assert not list(ks._graph_moves(start, True)) and ks._gen.states == walked  # no block graph walked
    xv = next(m for m in ks._library_moves(start, False) if m.kernels[-1].op == "matmul" and
              m.kernels[-1].inputs == ("X", "V"))
    assert [m.kernels[-1].op for m in ks._library_moves(xv, False)] and \
        not any(m.kernels[-1].op == "reshape" for m in ks._library_moves(xv, False))  # X @ V is 4 x 6 too
    assert not any(isinstance(m.kernels[-1], GraphKernel) for m in ks.moves(xv, later=1))
    outcome = run_search(p, h100, SearchConfig(), budget_s=120)
    assert not outcome.stats.budget_exhausted and outcome.best.verdict.proved
    assert [getattr(k, "op", "graph") for k in outcome.best.sgraph.kernels][:2] == ["graph", "reshape"]
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert outcome.best.best.estimate.time_s < baseline.best.estimate.time_s


def test_a_returned_reshape_of_a_fused_value_may_be_the_last_kernel(h100):
    """A missing output that is itself a reshape (here returned transposed, the transpose a view)
    is made by the reshape as the last kernel: the kernel before it computes, not reshapes
    (`_lacks_classes` asks only of outputs that are no reshape); found by
    `scripts/fuzz_optimize.py --seed 64 --heads --layouts`, which left such a program unfused
    when the kernel before the last had to be a reshape."""
    p = Program("heads_view")
    x, w = p.input("X", (4, 8), "f16"), p.input("W", (6, 8), "f16")
    centered = (x - p.mean(x, -1, keepdim=True)) / 3.0
    p.output(p.transpose(p.reshape(centered @ p.transpose(w, (1, 0)), (4, 2, 3)), (0, 2, 1)))
    outcome = run_search(p, h100, SearchConfig(), budget_s=120)
    baseline = next(v for v in outcome.verified if v.sgraph.name.endswith(".unfused"))
    assert not outcome.stats.budget_exhausted and outcome.best.verdict.proved
    assert outcome.best.best.estimate.time_s < baseline.best.estimate.time_s
    assert "reshape" in [getattr(k, "op", "graph") for k in outcome.best.sgraph.kernels]


def test_an_input_read_only_through_a_view_may_share_a_name_with_a_searched_tensor(h100):
    """The searched program does not take an input read only through views; the search may name
    a tensor of its own like it (`t0`), which unfolding renames instead of defining twice."""
    p = Program("clash")
    p.output(p.exp(p.transpose(p.input("t0", (8, 16), "f16"), (1, 0))))
    outcome = run_search(p, h100, SearchConfig())
    assert outcome.best.verdict.proved and [t.id for t in outcome.best.sgraph.inputs] == ["t0"]


def test_the_search_estimates_a_kernel_reading_a_folded_view_in_its_stored_layout(searched_attention, h100):
    """Kernels reading a transposed input are ranked (first kernels kept, floors) on the prefix
    sGraph with the view in it, so the cost model sees the stored layout's runs, as it does when
    the unfolded candidate is ranked."""
    program, _ = searched_attention(False)
    ks = Searcher(program, h100, SearchConfig()).search
    kt = ks.views.inputs[0].id
    first = next(st for st in ks._graph_moves(ks.initial(), False) if kt in st.kernels[0].tensor_inputs)
    sg, _ = ks._prefix(first)
    assert sg.views == {kt: ("K", (0, 2, 1))} and "K" in [t.id for t in sg.inputs]


def test_a_returned_transpose_costs_the_search_nothing(searched_attention, h100):
    """Attention whose output is returned transposed (heads before rows, as a layout change):
    the search sees the value itself, so it finds the same kernels with the same states, and a
    free view of the result; launches still bound its depth (the view is not in its program)."""
    program, plain = searched_attention(False)
    p = Program("attention_t")
    p.nodes = dict(program.nodes)
    p.output(p.transpose(Tensor(p, program.outputs[0]), (1, 0, 2)))
    outcome = run_search(p, h100, SearchConfig())
    sg = outcome.best.sgraph
    assert sg.kernels[-1].op == "transpose" and sg.views[sg.outputs[0]] == (sg.kernels[-1].inputs[0], (1, 0, 2))
    assert [k.id for k in sg.kernels[:-1]] == [k.id for k in plain.best.sgraph.kernels]
    assert outcome.best.verdict.proved and outcome.stats.states == plain.stats.states
    assert outcome.best.best.estimate.time_s == pytest.approx(plain.best.best.estimate.time_s, rel=1e-9)


def test_budget_returns_the_best_so_far(h100):
    program = workloads.resolve("gated_mlp:ci")
    outcome = run_search(program, h100, SearchConfig(), max_states=2)
    assert outcome.stats.budget_exhausted
    assert outcome.best.sgraph.name.endswith(".unfused")  # the baseline is verified before searching


def test_progress_reports_each_better_schedule_as_it_is_verified(h100, monkeypatch):
    """The best so far is reported when a candidate is verified, not when its shard ends (a shard
    can run for the whole budget); the report says when the winner was found (`best_found_s`).
    Candidates are proved as they are found here: none is held (`HOLD_STATES`)."""
    from superopt.search import driver

    monkeypatch.setattr(driver, "HOLD_STATES", 0)
    events: list[dict] = []
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), progress=events.append)
    found = [e["best_time_us"] for e in events if e["phase"] == "found"]
    assert found == sorted(found, reverse=True) and len(found) >= 2  # the baseline, then better ones
    assert found[-1] == outcome.best.best.estimate.time_us
    last_found = next(e for e in reversed(events) if e["phase"] == "found")
    assert 0 < outcome.stats.best_found_s < outcome.stats.seconds  # when the winner was held, not the end
    assert outcome.stats.best_found_s == pytest.approx(last_found["seconds"], abs=0.02)
    first_merge = next(i for i, e in enumerate(events) if e["phase"] == "verify")
    assert any(e["phase"] == "found" for e in events[1:first_merge])


def test_a_large_search_finds_a_deeper_winner_in_small_block_graphs_first(h100, monkeypatch):
    """qknorm_gqa's one-kernel search is large (33,524 states), and its 3-kernel winner's first
    kernel alone takes some 60,000 more to generate among all block graphs over Q and K. The
    probe of small block graphs that interrupts a one-kernel search that large finds it within
    80,000 states (the probe's included); without the probe those states only reach the
    reference's flash-decoding schedule."""
    from superopt.search import driver

    program, reference = workloads.reference_for("qknorm_gqa")
    ref_us = rank(reference, h100)[0].estimate.time_us
    events: list[dict] = []
    probed = run_search(program, h100, SearchConfig(), max_states=80_000, progress=events.append)
    assert probed.stats.depth == 1
    assert probed.stats.states < 80_100  # the probe's count (a shard's first state is counted before the check)
    assert probed.best.verdict.proved and len(probed.best.sgraph.kernels) == 3
    assert probed.best.best.estimate.time_us < ref_us - 4  # 11.66 against 15.86 us
    assert "probe" in {e["phase"] for e in events}  # the progress display says so
    found = [e for e in events if e["phase"] == "found"]
    assert found[-1]["states"] < 40_000  # before the one-kernel search ended
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 10**9)
    unprobed = run_search(program, h100, SearchConfig(), max_states=80_000)
    assert unprobed.best.best.estimate.time_us == pytest.approx(ref_us)


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


def _program_ops(p: Program) -> list[str]:
    return sorted(n.op for n in p.topological() if n.op not in ("input", "const"))


SMALL = SearchConfig(max_block_ops=3)  # block graphs `_long_chain` outgrows


def _long_chain(stages: int) -> Program:
    """t = t + unary(binary(t, Y)), `stages` times from t = X: two inputs, 3 x `stages` ops, each
    stage one chain (`Chain`: one block op), beyond one block graph of `SMALL_BLOCKS` ops from 4
    stages on. (A chain of any length is one block op: t = unary(binary(t, Y)) alone, found by
    probing optimize, is one chain, and no longer too large for one block graph.)"""
    p = Program("long_chain")
    x, y = p.input("X", (8, 16), "f16"), p.input("Y", (8, 16), "f16")
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
    assert q is not None and _program_ops(q).count("div") == 2 and "rms_norm" not in _program_ops(q)
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
    assert sorted(op.op for op in (*kernel.block.body, *kernel.block.post) if op.op != "const") == _program_ops(p)
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
        assert sorted(_ops(t for t in g.tiles if t.op not in ("input", "acc"))) == _program_ops(p)
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
    """`probe_after`: qknorm_gqa's best so far (the unfused baseline, 27.9 us) takes over
    `PROBE_ROOM` times what two kernels can (4.7 us): its probe starts after a quarter of
    `PROBE_AFTER_STATES` one-kernel states. rmsnorm_mlp's (at most 31.8 us against 24.1) starts
    after all of them, and with no more room than that, qknorm_gqa's too."""
    from superopt.search import driver

    probed: list[str] = []
    run = Searcher.run

    def recording(self, shard, deadline, max_states):
        if self.config.max_block_ops == driver.PROBE_BLOCK_OPS:
            probed.append(self.program.name)
        return run(self, shard, deadline, max_states)

    monkeypatch.setattr(Searcher, "run", recording)
    monkeypatch.setattr(driver, "PROBE_AFTER_STATES", 4_000)
    for name in ("qknorm_gqa", "rmsnorm_mlp"):
        run_search(workloads.resolve(name), h100, SearchConfig(), max_states=2_500)
    assert set(probed) == {"qknorm_gqa"}
    probed.clear()
    monkeypatch.setattr(driver, "PROBE_ROOM", 7.0)
    run_search(workloads.resolve("qknorm_gqa"), h100, SearchConfig(), max_states=2_500)
    assert probed == []


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
                            ({"max_states": 0}, "max_states: must be at least 1")):
        with pytest.raises(ValueError, match=message):
            optimize(p, target="h100", cache=False, **limits)


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


def test_the_progress_line_shows_its_phase(monkeypatch):
    """The phase, in brackets, was read as Rich markup and vanished from the line."""
    import io

    from rich.console import Console

    from superopt import cli

    shown = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=shown, force_terminal=True, width=120))
    with cli._progress_line(quiet=False) as update:
        update({"phase": "probe", "seconds": 1.5, "states": 10, "pruned": 3, "verified": 1, "best_time_us": 2.5})
    assert "[probe] 1.5s  states 10  pruned 3  verified 1  best 2.50 us" in shown.getvalue()


def test_optimize_command_line_summary():
    res = CliRunner().invoke(app, ["optimize", "ntrans:ci", "--target", "h100", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert "verdict: PROVED" in res.stdout and "speedup over the unfused baseline" in res.stdout


def test_layout_ops_stay_library_kernels(h100):
    p = Program("t")
    x = p.input("X", (8, 16), "f32")
    p.output(p.exp(p.transpose(x, [1, 0])))
    outcome = run_search(p, h100, SearchConfig(), budget_s=60)
    assert outcome.best.verdict.proved
    assert any(isinstance(k, LibraryKernel) and k.op == "transpose" for k in outcome.best.sgraph.kernels)


def test_generator_respects_op_budget():
    program = workloads.resolve("rmsnorm_matmul:ci")
    gen = Generator(space_of(program), Oracle(program), 3)
    specs = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    for s in gen.complete_graphs(gen.start(specs)):
        assert s.nops <= 3


def _every_step(gen: Generator, s, phase: int):
    """Every one-operand op on every tile and every binary op on every ordered pair of the
    phase's tiles (add and mul with their older operand first), each with its place in the
    generation order (by first operand; its one-operand ops, then its pairs by second operand
    and op): what a walk that remembers nothing tries."""
    mine = [k for k, t in enumerate(s.tiles) if t.phase == phase]
    for i in mine:
        admitted, rejected = gen._single_ops(s.tiles[i])
        for n, (op, _, attrs, consts) in enumerate(admitted):
            yield (i, 0, n), (op, (i,), attrs, consts)
        for op, _, attrs, consts in rejected:
            yield (i, 0, len(admitted)), (op, (i,), attrs, consts)  # never a child
        for j in mine:
            for op in gen._binary_ops:
                if not (j < i and op in ("add", "mul")):
                    yield (i, 1, j, gen._rank[op]), (op, (i, j), (), ())


def _tiles(s) -> tuple:
    """A state's tiles without their interned ids (each generator numbers expressions as it meets them)."""
    return tuple(t._replace(aid=-1, vid=-1) for t in s.tiles)


def _naive_walk(gen: Generator, start, phase: int, budget: int) -> list:
    walked, frontier = [], [((), start)]
    while frontier:
        level = []
        for path, s in frontier:
            walked.append((path, s))
            steps = [step for _, step in sorted(_every_step(gen, s, phase), key=lambda e: e[0])]
            children = [c for step in steps if (c := gen._try(s, *step)) is not None and c.nops <= budget]
            level += [((*path, n), c) for n, c in enumerate(children)]
        frontier = level
    return walked


def _walked(states: list) -> list:
    return [(path, _tiles(s)) for path, s in states]


@pytest.mark.parametrize(("spec", "budget"), [("rmsnorm_mlp:ci", 9), ("qknorm_gqa:ci", 8)])
def test_block_walk_equals_trying_every_op_on_every_state(spec, budget):
    """The walk skips the operand pairs whose ops the oracle rejects (memoized per operand
    values) and the ops the canonical order forbids, and counts what it skips as `_try` would:
    in the loop body and after the loop, it reaches exactly the states, in the same order, and
    counts exactly the pruned ops, of trying every op on every state with `_try`."""
    program = workloads.resolve(spec)
    oracle = Oracle(program)
    ks = KernelSearch(program, space_of(program), oracle, SearchConfig())
    specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]
    walk, naive = Generator(space_of(program), oracle, budget), Generator(space_of(program), oracle, budget)
    bodies = list(walk._phase(walk.start(specs), 0, budget))
    naive_bodies = _naive_walk(naive, naive.start(specs), 0, budget)
    assert _walked(bodies) == _walked(naive_bodies)
    assert walk.pruned == naive.pruned and len(bodies) > 1000
    accumulated = [pair for (_, body), (_, same) in zip(bodies[::50], naive_bodies[::50], strict=True)
                   for pair in zip(walk._with_accumulators(body), naive._with_accumulators(same), strict=True)]
    for accs, same in accumulated[:20]:
        assert _walked(walk._phase(accs._replace(nops=0), 1, 4)) == _walked(_naive_walk(naive, same._replace(nops=0), 1, 4))
    assert walk.pruned == naive.pruned and len(accumulated) >= 20


def test_a_block_graph_never_computes_one_value_twice():
    """(X·c)@W and X@(W·c) are one value under the target's axioms: each is generated, but no
    block graph computes both (same e-class, same dims, same phase)."""
    p = Program("scaled")
    x, w = p.input("X", (4, 64), "f32"), p.input("W", (64, 48), "f32")
    p.output(p.exp((x * 0.25) @ w))
    oracle = Oracle(p)
    gen = Generator(space_of(p), oracle, 5)
    specs = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    scaled = oracle.class_of(oracle.alg.matmul(oracle.alg.mul(oracle.alg.const(0.25), (("inp", "X"), (0, 1))),
                                               (("inp", "W"), (1, 2)))[0])
    forms = set()
    for s in gen.complete_graphs(gen.start(specs)):
        values = [(t.phase, oracle.class_of(t.ae), tuple(s.classes.find(d) for d in t.dims))
                  for t in s.tiles if t.op not in ("input", "acc")]
        assert len(values) == len(set(values)), [t.op for t in s.tiles]
        forms |= {t.ae for t in s.tiles if t.op not in ("input", "acc") and oracle.class_of(t.ae) == scaled}
    assert scaled is not None and len(forms) == 2


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


@pytest.mark.parametrize(("spec", "depth", "first"), [("gqa:ci", 2, (0, 1, 2)), ("lora:ci", 3, (0, 2))])
def test_graphs_whose_last_kernel_merges_computed_tensors_come_first(spec, depth, first):
    """Within a shard, graphs whose last kernel reads only computed tensors (a merge, a division)
    are produced before those whose last kernel reads program inputs again (from three kernels
    on, within each kind of second kernel: library ones first; with a graph-defined second
    kernel, within each first kernel, whose middle block spaces are then replayed, not generated
    again); the candidates are the same as one pass over the subtree produces (kernels before
    the last one are not filtered)."""
    from superopt.search.kernel import MIDDLES

    program = workloads.resolve(spec)
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


def test_only_the_contenders_are_proved_and_they_are_the_true_best(h100):
    """Branch and bound on proofs: candidates ranked behind `contenders` proved ones are not
    verified, yet the kept ones are exactly the best of a search that verifies everything."""
    program = workloads.resolve("gated_mlp")  # at its published shape: dozens of candidates
    config = SearchConfig(max_kernel_ops=2)
    everything = run_search(program, h100, config, contenders=10_000)
    assert everything.stats.dominated == 0  # no proof bound, so no time bound either: kept for any shape
    assert everything.stats.generic_depth == everything.stats.depth == 2
    ranked = sorted(everything.verified, key=lambda v: v.sort_key())
    for contenders in (1, 3):
        bounded = run_search(program, h100, config, contenders=contenders)
        assert bounded.stats.verified < everything.stats.verified and bounded.stats.dominated > 0
        fused = [v.sgraph.dumps() for v in sorted(bounded.verified, key=lambda v: v.sort_key())
                 if not v.sgraph.name.endswith(".unfused")]
        assert fused == [v.sgraph.dumps() for v in ranked[:contenders]]
        proved = {v.sgraph.dumps() for v in bounded.verified}
        assert not proved & {sg.dumps() for sg in bounded.dominated}


@pytest.mark.parametrize("spec", ["gqa", "rmsnorm_mlp"])
def test_time_bound_never_exceeds_the_cost_models_estimate(h100, spec):
    """The kernel-level bound (the cost model's least time for the kernels chosen so far, alone;
    launches plus every tensor a kernel reads and writes at full DRAM bandwidth) is below the
    cost model's estimate of every candidate containing them, so cutting graphs whose bound
    exceeds the best proved time never cuts a graph that could win. First kernels that fit no
    instantiation (their bound is infinite) are in no instantiable candidate."""
    ks = _with_floors(spec, h100)
    checked, infinite = 0, 0
    for choice in ks.first_choices(2)[:3]:
        firsts = ks._library_moves(ks.initial(), False) if choice[0] == "library" else \
            ks._graph_moves(ks.initial(), False, only=choice[1])
        for first in firsts:
            spent_first = ks._spent(first)
            assert spent_first > ks.launch_s
            infinite += spent_first == float("inf")
            for last in itertools.islice(ks.moves(first, final=True), 20):
                cand = ks._candidate(last)
                if cand is None or not (ranked := rank(cand, h100)):
                    continue
                assert max(spent_first, ks._spent(last)) <= ranked[0].estimate.time_s, cand.dumps()
                checked += 1
            if checked > 40 and (spec == "gqa" or infinite):
                break
    assert checked > 10 and (spec == "gqa" or infinite)


def _with_floors(spec: str, h100) -> KernelSearch:
    """A kernel search of a workload with a finite bound, so that its floors are computed."""
    program = workloads.resolve(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.bound_s = 1.0
    return ks


def _first_kernels(ks: KernelSearch, depth: int, choices: int, each: int) -> Iterator:
    """The first few first kernels of the first few choices of graphs of `depth` kernels."""
    for choice in ks.first_choices(depth)[:choices]:
        firsts = ks._library_moves(ks.initial(), False) if choice[0] == "library" else \
            ks._graph_moves(ks.initial(), False, only=choice[1])
        yield from itertools.islice(firsts, each)


@pytest.mark.parametrize("spec", ["gqa:ci", "lora:ci", "rmsnorm_mlp:ci", "gqa"])
def test_last_kernel_floor_is_below_every_last_kernel_over_its_inputs(h100, spec):
    """The floor of a last graph kernel, known from the tensors it reads and the outputs it must
    write before any of its block graphs is generated (`_whole_floor`), is at most the cost
    model's least time of every last kernel the search builds over those tensors, so cutting by
    it never cuts a graph that could win; and at the published shape it is no empty bound: it
    comes within 2x of some of them (attention's last kernels must read all of K and V in
    every block, whatever their block graph)."""
    ks = _with_floors(spec, h100)
    ratios = []
    for first in _first_kernels(ks, depth=2, choices=4, each=4):
        missing = ks._missing(first)
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for last in itertools.islice(ks._graph_moves(first, True), 25):
            kernel = last.kernels[-1]
            floor = ks._whole_floor(first, tuple(sorted(index[t] for t in kernel.tensor_inputs)), missing)
            prefix = ks._prefix(last)
            assert prefix is not None
            least = min(ks._floors(last, *prefix, kernel).values(), default=float("inf"))
            assert floor <= least * (1 + 1e-9), kernel
            ratios.append(least / floor)
    assert len(ratios) >= 15
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)


@pytest.mark.parametrize("spec", ["gqa:ci", "gqa"])
def test_middle_kernel_floor_is_below_every_candidate_through_it(h100, spec):
    """The floor of a graph kernel that is not the last (`_middle_floor`: the kernels before it,
    its inputs, the launches after it and what the later kernels must read and write, known
    before its block graphs are generated) is at most the cost model's best time of every
    candidate grown through such a kernel, so cutting by it never cuts a graph that could win;
    and at the published shape it binds: within 2x of some of them. So is the bound of each
    state on the way (its kernels, the launches to come and the bytes they owe, `_owed`)."""
    ks = _with_floors(spec, h100)
    ratios = []
    for first in _first_kernels(ks, depth=3, choices=3, each=3):
        floor = ks._middle_floor(first, 1)
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for middle in itertools.islice(ks._graph_moves(first, False), 30):
            subset = tuple(sorted(index[t] for t in middle.kernels[-1].tensor_inputs))
            for last in itertools.islice(ks.moves(middle, final=True), 5):
                cand = ks._candidate(last)
                if cand is None or not (ranked := rank(cand, h100)):
                    continue
                best = ranked[0].estimate.time_s * (1 + 1e-9)
                assert floor(subset) <= best, cand.dumps()
                for state, left in ((first, 2), (middle, 1)):
                    assert left * ks.launch_s + ks._spent(state) + ks._owed(state)(()) / ks.bandwidth <= best
                ratios.append(best / floor(subset))
    assert len(ratios) >= 10
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)


def test_a_first_kernel_that_cannot_beat_the_bound_is_cut_before_its_block_graphs(h100, monkeypatch):
    """rmsnorm_mlp at its published shape: a graph of two kernels whose first reads X and one
    weight reads the other weight in its second and launches twice, so the floor of its first
    kernel (`_middle_floor`, known from what it reads) is above the winner's time. Such a choice
    is cut before its first kernels are generated and ranked (a second each, for nothing), and
    the floor is below every candidate grown through such first kernels."""
    ks = _with_floors("rmsnorm_mlp", h100)
    floor = ks._middle_floor(ks.initial(), 1)((0, 1))
    times = []
    for first in itertools.islice(ks._graph_moves(ks.initial(), False, only=(0, 1)), 12):
        for last in itertools.islice(ks.moves(first, final=True), 3):
            if (cand := ks._candidate(last)) is not None and (ranked := rank(cand, h100)):
                times.append(ranked[0].estimate.time_s * (1 + 1e-9))
    assert len(times) >= 5 and floor <= min(times), (floor, min(times))

    def generated(*args):
        raise AssertionError("the first kernels of a choice cut by the bound were generated")

    ks.bound_s = 24.56e-6  # just above the winner's estimate
    assert floor > ks.bound_s
    monkeypatch.setattr(ks, "first_kernels", generated)
    bounded = ks.bounded
    assert list(ks.candidates_in(2, ("graph", (0, 1)))) == []
    assert ks.bounded == bounded + 1
    list(ks.candidates_in(2, ("graph", (0, 1, 2)), firsts=[]))
    assert ks.bounded == bounded + 1  # reading X, Wu and Wg, the first kernel may do all the work


def test_kernels_cut_by_what_is_known_are_cut_without_being_analyzed(h100, monkeypatch):
    """Before a state's kernels are analyzed for their least times (`_spent`), the bound asks
    what is known without that (`_known_spent`: kept least times, else launch and bytes), which is
    never above it: the same graphs are cut and the same candidates come, with fewer analyses
    (attention at its published shape with the winner's time as the bound: a middle kernel
    writing a tensor the last kernel must read again is cut by its bytes alone)."""

    def search(known: bool) -> tuple[list[str], int, int]:
        program = workloads.resolve("gqa")
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.bound_s = 11.7e-6  # just above the winner's estimate
        analyzed = []
        prefix, spent = ks._prefix, ks._spent

        def counted(s):
            analyzed.append(s)
            return prefix(s)

        def checked(s):
            least = spent(s)
            assert ks._known_spent(s) <= least * (1 + 1e-12)
            return least

        monkeypatch.setattr(ks, "_prefix", counted)
        monkeypatch.setattr(ks, "_spent", checked)
        if not known:
            monkeypatch.setattr(ks, "_known_spent", lambda s: 0.0)
        found = [sg.dumps() for sg in ks.candidates()]
        return found, ks.bounded, len(analyzed)

    found, bounded, analyses = search(known=True)
    found_before, bounded_before, analyses_before = search(known=False)
    assert found and found == found_before and bounded == bounded_before
    assert analyses < analyses_before, (analyses, analyses_before)


def test_middle_kernels_over_program_inputs_are_bounded_by_their_least_time_once_known(h100, monkeypatch):
    """A middle kernel reading program inputs only is the same after every first kernel: once its
    moves were generated twice, the least time of all of them is kept (`_middle_least`), and it
    bounds that subset before its block graphs are generated again. Attention at its published
    shape, the winner's time as the bound: the same candidates under the bound come, from fewer
    states; the kept least time binds above `_middle_own`, and every candidate grown through such
    a middle kernel takes at least the middle floor."""

    def search(kept: bool) -> tuple[KernelSearch, set[str]]:
        program = workloads.resolve("gqa")
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.bound_s = 11.7e-6  # just above the winner's estimate
        if not kept:
            monkeypatch.setattr(ks, "_middle_key", lambda s, subset, part: None)
        under = {sg.dumps() for sg in ks.candidates()
                 if (ranked := rank(sg, h100)) and ranked[0].estimate.time_s <= ks.bound_s}
        return ks, under

    ks, found = search(kept=True)
    before, found_before = search(kept=False)
    assert found and found == found_before
    assert ks.total_states < before.total_states and not before._middle_least
    start = ks.initial()
    first = next(f for f in ks._graph_moves(start, False, only=(0, 1)) if len(f.tensors) == 4)
    binding = [(subset, least) for (subset, level, _, part), least in ks._middle_least.items()
               if level == 1 and part == (1, 0) and least > ks._middle_own(first, subset) * 1.01]
    assert binding, ks._middle_least
    floor = ks._middle_floor(first, 1)
    ks.bound_s = float("inf")  # every middle and last kernel, to check the floor against
    checked = 0
    for subset, least in binding:
        for middle in itertools.islice(ks._graph_moves(first, False, only=subset), 20):
            own = ks._least_alone(first, middle.kernels[-1], middle.tensors[len(first.tensors):])
            assert least <= own, middle.kernels[-1]
            for last in itertools.islice(ks.moves(middle, final=True), 3):
                cand = ks._candidate(last)
                if cand is not None and (ranked := rank(cand, h100)):
                    assert floor(subset) <= ranked[0].estimate.time_s * (1 + 1e-9), cand.dumps()
                    checked += 1
    assert checked >= 3


@pytest.mark.parametrize("spec", ["gqa:ci", "gqa"])
def test_a_middle_kernel_leaving_the_last_more_to_read_than_a_library_op_takes_is_bounded_by_its_graph(
        h100, spec):
    """After a first kernel over Q and K writing exp(Q K), a middle kernel that reads neither it
    nor V leaves the last kernel three tensors to read (those two and the middle's output, or
    the middle would not contribute): no library op takes three, so the last is a graph kernel
    writing O, whose grid splits only O's classes and reads exp(Q K) or V again per block along
    the others (`_last_after`, `_whole_floor`). That floor binds well above what the tensors'
    bytes alone give, and every candidate grown through such a middle kernel takes at least
    as long."""
    ks = _with_floors(spec, h100)
    start = ks.initial()
    q, k, v = range(3)
    exp_qk = next(f for f in ks._graph_moves(start, False, only=(q, k))
                  if len(f.tensors) == 4 and f.tensors[3].ae[0] == "exp" and f.tensors[3].chunk is None)
    floor, last = ks._middle_floor(exp_qk, 1), ks._last_after(exp_qk)
    assert last is not None
    moved = ks._owed(exp_qk)((q, k)) / ks.bandwidth  # what the kernels after it must move, at full bandwidth
    assert last((q, k)) - ks.launch_s > 1.5 * moved, (last((q, k)), moved)
    # The last kernel may be a library op here (a matmul of a middle output and V, or of the
    # middle's output and exp(Q K)): then it is bounded by its launch and what it must move.
    assert ks.launch_s < last((q, k, v)) < last((q, k)) and ks.launch_s < last((k, 3)) < last((q, k))
    checked = 0
    for middle in ks._graph_moves(exp_qk, False, only=(q, k)):
        for end in itertools.islice(ks.moves(middle, final=True), 3):
            cand = ks._candidate(end)
            if cand is None or not (ranked := rank(cand, h100)):
                continue
            assert isinstance(end.kernels[-1], GraphKernel)
            assert floor((q, k)) <= ranked[0].estimate.time_s * (1 + 1e-9), cand.dumps()
            checked += 1
        if checked >= 5:
            break
    assert checked >= 5


@pytest.mark.parametrize("spec", ["gqa", "lora", "rmsnorm_mlp:ci"])
def test_middle_kernel_own_floor_is_below_every_middle_kernel_over_its_inputs(h100, spec):
    """A kernel that is not the last may write partial results, so its grid may split any class
    of what it reads (`_middle_own`: `whole_reduction_floor` over every class): its floor is at
    most the cost model's least time of every middle kernel the search builds over those tensors,
    and it binds beyond the inputs' bytes at full bandwidth: splitting the grid enough to keep
    the DRAM pipe full re-reads the inputs that lack a split class."""
    ks = _with_floors(spec, h100)
    checked, tighter = 0, 0
    for first in _first_kernels(ks, depth=3, choices=3, each=3):
        index = {t.id: n for n, t in enumerate(first.tensors)}
        for middle in itertools.islice(ks._graph_moves(first, False), 60):
            subset = tuple(sorted(index[t] for t in middle.kernels[-1].tensor_inputs))
            own = ks._middle_own(first, subset)
            assert ks._spent(first) + own <= ks._spent(middle) * (1 + 1e-9), middle.kernels[-1]
            read = sum(ks._bytes(first.tensors[i]) for i in subset) / ks.bandwidth
            tighter += own > ks.launch_s + max(read, ks._iteration_s) * 1.01
            checked += 1
    assert checked >= 60 and tighter >= 10, (checked, tighter)


@pytest.mark.parametrize("spec", ["rmsnorm_mlp:ci", "gqa:ci", "gqa", "lora:ci", "scripts/programs/attention_projections.json"])
def test_a_kernels_grid_floor_is_below_its_least_estimate(h100, spec):
    """A kernel is cut by the floor of its own grid (`_grid_floor`: the bytes its axes make its
    blocks read), before its prefix is analyzed, when that floor and what must follow exceed the
    bound: a first kernel (`_ranked_first`), a later one (`_known_spent`). The floor is at most
    the cost model's least estimate of the kernel at any sizes (`_floors`), partials, transposed
    reads and side-by-side axes (the Q, K and V projections of one X) included; and it binds:
    for some kernels it is above the bytes they move at full bandwidth."""
    program = load_program(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.bound_s = 1.0
    checked = tighter = later = 0

    def check(state) -> None:
        nonlocal checked, tighter
        kernel = state.kernels[-1]
        grid = ks._grid_floor(state, kernel)
        if (prefix := ks._prefix(state)) is None or not (least := ks._floors(state, *prefix, kernel)):
            return
        assert grid <= min(least.values()) * (1 + 1e-9), (grid, least, prefix[0].dumps())
        size = {t.id: ks._bytes(t) for t in state.tensors}
        tighter += grid > ks._moving_s(kernel, size) * 1.01
        checked += 1

    for choice in [c for c in ks.first_choices(2) if c[0] == "graph"]:
        for n, first in enumerate(itertools.islice(ks._graph_moves(ks.initial(), False, only=choice[1]), 60)):
            check(first)
            for second in itertools.islice(ks._graph_moves(first, False), 10 if n % 10 == 0 else 0):
                later += 1
                check(second)
    assert checked >= 10 and tighter >= 5 and later >= 10, (checked, tighter, later)


@pytest.mark.parametrize("spec", ["rmsnorm_mlp:ci", "gqa:ci", "gqa", "lora:ci"])
def test_a_block_graphs_tiled_floor_is_below_the_grid_floor_of_every_kernel_it_tiles_into(h100, spec, monkeypatch):
    """A first or middle kernel's block graph is cut before its tilings are searched when the
    floor of them all (`_tiled_floor`: `_grid_floor` over every axis they may take, partial-result
    axes included) and what must follow exceed the bound. That floor is at most the grid floor of
    each kernel the block graph tiles into, and the second value it returns is what the kernel
    writes; it binds: for most kernels it is the grid floor (within 0.1%)."""
    program = load_program(spec)
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    ks.bound_s = 1.0  # finite, so the floors are computed, and large, so nothing is cut
    tiled_from = []  # the block graph of each kernel `resolve` makes, in order
    resolve = kernel_module.resolve

    def recording(block, *args, **kwargs):
        for res in resolve(block, *args, **kwargs):
            tiled_from.append(block)
            yield res

    monkeypatch.setattr(kernel_module, "resolve", recording)
    checked, tight, partials = [0, 0], [0, 0], 0

    def check(before, after, place: int) -> None:
        nonlocal partials
        if (tiled := ks._tiled_floor(before, after.last_key[1], tiled_from[-1])) is None:
            return
        grid = ks._grid_floor(after, after.kernels[-1])
        new = after.tensors[len(before.tensors):]
        assert tiled[0] <= grid * (1 + 1e-9), (tiled, grid, after.kernels[-1])
        assert tiled[1] == pytest.approx(sum(map(ks._bytes, new)))
        checked[place] += 1
        tight[place] += tiled[0] >= grid * 0.999
        partials += any(t.chunk is not None for t in new)

    for choice in [c for c in ks.first_choices(2) if c[0] == "graph"][:3]:
        for first in itertools.islice(ks._graph_moves(ks.initial(), False, only=choice[1], first=True), 60):
            check(ks.initial(), first, 0)
    for first in itertools.islice(_first_kernels(ks, 3, choices=3, each=30), 0, None, 3):
        for second in itertools.islice(ks._graph_moves(first, False, later=1), 100):
            check(first, second, 1)
    assert min(checked) >= 10 and all(n >= c // 2 for n, c in zip(tight, checked, strict=True)), (checked, tight)
    if spec.startswith("gqa"):
        assert partials >= 5, partials  # flash-decoding partials: the tilings' partial axes are floored too


@pytest.mark.parametrize("spec", ["gqa", "gqa:ci"])
def test_chunk_merge_floors_are_below_every_candidate_that_merges_later(h100, spec):
    """A first kernel writing per-chunk partials is bounded together with the kernel that will
    merge them, at the chunk count they share (the merge's loop walks the chunks). Those bounds,
    the one checked before growing a state (`_merged_later` plus the launches to come) and the
    one checked before a last kernel's block graphs (`_last_graph_floor`), are at most the cost
    model's best time of every candidate grown from the state, at two and three kernels; and at
    the published shape they bind: some candidate is within 2x of them."""
    ks = _with_floors(spec, h100)
    start = ks.initial()
    inputs = tuple(range(len(start.tensors)))
    chunked = [f for f in ks._graph_moves(start, False, only=inputs) if any(t.chunk for t in f.tensors)]
    ratios = []

    def check(before: list, last) -> None:
        cand = ks._candidate(last)
        if cand is None or not (ranked := rank(cand, h100)):
            return
        best = ranked[0].estimate.time_s
        first = before[0]
        left = len(last.kernels) - 1
        bound = left * ks.launch_s + ks._merged_later(first, lambda c: c * ks._iteration_s)
        prev = before[-1]
        index = {t.id: n for n, t in enumerate(prev.tensors)}
        subset = tuple(sorted(index[t] for t in last.kernels[-1].tensor_inputs))
        floor = ks._last_graph_floor(prev, ks._spent(prev), subset, ks._missing(prev))
        assert max(bound, floor) <= best * (1 + 1e-9), cand.dumps()
        ratios.append(best / max(bound, floor))

    for first in chunked[:12]:
        for last in itertools.islice(ks._graph_moves(first, True), 30):
            check([first], last)
        for mid in itertools.islice(ks.moves(first), 6):
            for last in itertools.islice(ks._graph_moves(mid, True), 3):
                check([first, mid], last)
    assert len(ratios) >= 15
    assert spec != "gqa" or min(ratios) < 2.0, min(ratios)


def test_loop_bodies_walked_in_parts_rebuild_the_whole_walk():
    """Distributed search walks a block space's loop bodies in parts and hands them to every graph
    shard, which rebuilds those of its own part: it then completes exactly the block graphs, in
    the same order, that a generator walking every body itself completes for that part, though
    each walk part walked only its share."""
    program = workloads.resolve("rmsnorm_mlp:ci")
    oracle = Oracle(program)
    ks = KernelSearch(program, space_of(program), oracle, SearchConfig())
    specs = [ks._spec(t, i, False) for i, t in enumerate(ks.initial().tensors)]

    def graphs(gen: Generator, part: tuple[int, int]) -> list[list[tuple]]:
        return [[(t.op, t.args, t.attrs, t.consts, t.dims, t.ae) for t in s.tiles]
                for s in gen.complete_graphs(gen.start(specs), part)]

    walks = []
    for i in range(3):
        gen = Generator(space_of(program), oracle, 6)
        walks.append(gen.body_part(gen.start(specs), (3, i)))
    whole = Generator(space_of(program), oracle, 6)
    n_bodies = sum(1 for _ in whole._accumulated(whole.start(specs)))
    assert all(0 < len(w) < n_bodies for w in walks)
    for part in ((2, 0), (2, 1)):
        adopted = Generator(space_of(program), oracle, 6)
        adopted.adopt_bodies(adopted.start(specs), [b for w in reversed(walks) for b in w], part)
        assert graphs(adopted, part) == graphs(whole, part)


def test_a_search_in_parts_returns_what_one_walk_does(h100, monkeypatch):
    """The driver walks each first kernel's loop bodies in parts, then gives every graph shard
    those of its part: same verified set and winner as an undivided search. Shards defer the
    candidates that tie their bound but for the text; the driver settles them."""
    from superopt.search import driver

    program = workloads.resolve("rmsnorm_mlp:ci")
    shards: list[driver.Shard] = []
    deferred: list[tuple] = []
    run = driver.Searcher.run

    def recording(self, shard, *args):
        shards.append(shard)
        result = run(self, shard, *args)
        deferred.extend(result.deferred)
        return result

    monkeypatch.setattr(driver.Searcher, "run", recording)
    whole = run_search(program, h100, SearchConfig())
    assert not any(s.walk or s.bodies is not None for s in shards)
    shards.clear()
    split = run_search(program, h100, SearchConfig(), parts=3)
    walks = [s for s in shards if s.walk]
    graphs = [s for s in shards if not s.walk and s.choice[0] == "graph"]
    assert [s.part for s in walks] == [(3, 0), (3, 1), (3, 2)] and all(s.bodies is not None for s in graphs)
    assert sorted(v.sgraph.dumps() for v in split.verified) == sorted(v.sgraph.dumps() for v in whole.verified)
    assert split.best.sgraph.dumps() == whole.best.sgraph.dumps()
    assert deferred and all(key[:2] == split.best.sort_key()[:2] for key, _ in deferred)


def test_a_depths_ties_are_proved_as_a_shard_taken_with_the_next_depths_walks(h100, monkeypatch):
    """Split into parts, the ties a depth deferred go out as one shard, taken just before the
    next depth's loop-body walks (which no bound changes): a parallel executor proves them while
    its workers walk, instead of idling while the driver does. rmsnorm_mlp's winner is such a
    tie: one-kernel schedules as fast as it, ahead of it only by their text (without its norm
    after the products in the program's own block graph, which proves a winner first)."""
    from superopt.search import block

    monkeypatch.setattr(block, "_norms_after_products", lambda program: None)
    program = workloads.resolve("rmsnorm_mlp")  # its search goes on to two kernels
    searcher = Searcher(program, h100, SearchConfig())
    taken: list = []

    def recording(shards, deadline, states_left):
        for shard in shards:
            result = searcher.run(shard, deadline, states_left)
            taken.append((shard, result))
            yield result

    outcome = run_search(program, h100, SearchConfig(), executor=recording, parts=2)
    settling = [n for n, (shard, _) in enumerate(taken) if shard.settle]
    assert len(settling) == 1 and outcome.stats.depth == 2
    shard, result = taken[settling[0]]
    assert shard.depth == 2 and {s.depth for s, _ in taken[: settling[0]]} == {1}
    assert taken[settling[0] + 1][0].walk and taken[settling[0] + 1][0].depth == 2
    assert len(shard.settle) > 1 and [key for key, _ in shard.settle] == sorted(key for key, _ in shard.settle)
    assert [v.sgraph.dumps() for v in result.verified] == [outcome.best.sgraph.dumps()]
    assert outcome.best.verdict.proved


def test_a_settle_shard_proves_ties_best_first_until_enough_are_proved(h100):
    """A settle shard proves its tied candidates in key order: a refuted one is rejected, the
    next is proved, and with `keep` proved the rest go back deferred, unverified."""
    from superopt.mutations import mutants
    from superopt.search.driver import Shard

    program, reference = workloads.reference_for("rmsnorm_matmul:ci")
    wrong = next(sg for why, sg in mutants(reference, program) if why.endswith("square -> exp"))
    unfused = unfused_baseline(program)
    searcher = Searcher(program, h100, SearchConfig())
    ties = ((1.0, 1, "a"), wrong), ((1.0, 1, "b"), reference), ((1.0, 1, "c"), unfused)
    result = searcher.run(Shard(2, ("settle", None), keep=1, settle=ties), float("inf"), None)
    assert [v.sgraph.dumps() for v in result.verified] == [reference.dumps()]
    assert [name for name, _ in result.rejected] == [wrong.name]
    assert [(key, sg.dumps()) for key, sg in result.deferred] == [((1.0, 1, "c"), unfused.dumps())]
    assert result.shard.settle == ()  # not sent back
    # One already proved ahead of them all: nothing to prove.
    ahead = searcher.run(Shard(2, ("settle", None), contenders=((0.5, 1, "z"),), keep=1, settle=ties),
                         float("inf"), None)
    assert not ahead.verified and not ahead.rejected and len(ahead.deferred) == 3


def _proofs_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the sGraphs the search sends to `verify`, in order."""
    from superopt.search import driver

    names: list[str] = []
    real = driver.verify

    def counting(program, sg, **kwargs):
        names.append(sg.name)
        return real(program, sg, **kwargs)

    monkeypatch.setattr(driver, "verify", counting)
    return names


@pytest.mark.parametrize("hold_states, fused_proofs", [(0, 2), (None, 1)])
def test_candidates_found_early_are_held_and_the_best_proved(h100, monkeypatch, hold_states, fused_proofs):
    """rmsnorm_matmul's one-kernel search meets a fused candidate (the program as one block graph)
    before a faster one. Proved as found, both are proved; held for the search's first
    `HOLD_STATES` (None: the default), only the faster is, when the depth is done. Same winner."""
    from superopt.search import driver

    if hold_states is not None:
        monkeypatch.setattr(driver, "HOLD_STATES", hold_states)
    proofs = _proofs_made(monkeypatch)
    events: list[dict] = []
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), progress=events.append)
    assert proofs[0].endswith(".unfused") and len(proofs) == 1 + fused_proofs
    assert outcome.best.verdict.proved and outcome.best.sgraph.name.endswith(".searched")
    assert outcome.best.best.estimate.time_us == pytest.approx(2.7, abs=1e-3)
    # Proved by the driver once the depth is done, the winner is reported with the states searched.
    found = [e["states"] for e in events if e["phase"] == "found"]
    assert found == sorted(found) and found[-1] <= outcome.stats.states


def test_held_candidates_are_proved_once_the_holding_states_are_past(h100):
    """qknorm_gqa:ci holds its winner (2.7 us) from its first 500 states, and its one-kernel
    search then yields no candidate for thousands of states: the held were proved only at the
    next candidate or the end of the depth (8.3 s into an 8 s budget, `best_found_s` and the
    progress line's best lagging all the while). Now they are proved as the states pass."""
    from superopt.search import driver

    events: list[dict] = []
    outcome = run_search(workloads.resolve("qknorm_gqa:ci"), h100, SearchConfig(), max_states=2_000,
                         progress=events.append)
    found = [(e["states"], e["best_time_us"]) for e in events if e["phase"] == "found"]
    assert outcome.stats.budget_exhausted and outcome.best.best.estimate.time_us == pytest.approx(2.7, abs=1e-3)
    assert found[-1][1] == pytest.approx(2.7, abs=1e-3) and found[-1][0] <= driver.HOLD_STATES + 50


def test_held_candidates_are_proved_when_the_budget_runs_out(h100, monkeypatch):
    """A search that runs out of states while its candidates are held still proves the best of
    them: it was found within the budget."""
    from superopt.search import driver

    monkeypatch.setattr(driver, "HOLD_STATES", 10_000)
    proofs = _proofs_made(monkeypatch)
    outcome = run_search(workloads.resolve("rmsnorm_matmul:ci"), h100, SearchConfig(), max_states=40)
    assert outcome.stats.budget_exhausted and outcome.stats.depth == 0
    assert len(proofs) == 2 and outcome.best.sgraph.name.endswith(".searched") and outcome.best.verdict.proved


def test_an_empty_loop_body_is_accumulated_only_over_tied_inputs():
    """With untied inputs, an empty loop body only loads them and the post-loop graph does all the
    work: the same graph in the body with no loop (a tiling the symbolic search always has) covers
    it, so no block graph has an empty body.
    Over inputs tied to a chunk axis (merging partial results) the accumulators sum the chunks:
    such graphs are kept."""
    program = workloads.resolve("rmsnorm_matmul:ci")
    gen = Generator(space_of(program), Oracle(program), 4)
    untied = [InputSpec(0, (4, 64), ("inp", "X"), (0, 1)), InputSpec(1, (64, 48), ("inp", "W"), (1, 2))]
    graphs = list(gen.complete_graphs(gen.start(untied)))
    assert graphs and all(any(t.phase == 0 and t.op != "input" for t in s.tiles) for s in graphs)
    tied = [InputSpec(0, (4, 8), ("inp", "X"), (0, 1), tied_dim=1)]
    assert any(s.nops == 0 for s in gen._with_accumulators(gen.start(tied)))
    # A concrete (Mirage-style) search fixes the loop before the graph: all its graphs stay.
    fixed_loop = Generator(space_of(program), Oracle(program), 4, no_loop_tilings=False)
    every = list(fixed_loop.complete_graphs(fixed_loop.start(untied)))
    assert any(all(t.phase == 1 or t.op == "input" for t in s.tiles) for s in every)
    assert len(every) > len(graphs)


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


def test_every_choice_tries_library_middle_kernels_before_graph_ones(h100):
    """From three kernels on, the driver runs every first-kernel choice's shard of graphs with a
    library second kernel before any shard with a graph-defined one (each such shard's work is a
    block space per first kernel, and a budget may end inside one), with the same winner."""
    program = workloads.resolve("gqa:prism-2x8x1x1024x128")  # its winner has three kernels
    searcher = Searcher(program, h100, SearchConfig())
    taken: list[tuple[int, str | None]] = []

    def recording(shards, deadline, states_left):
        for shard in shards:
            taken.append((shard.depth, shard.middle))
            yield searcher.run(shard, deadline, states_left)

    outcome = run_search(program, h100, SearchConfig(), executor=recording)
    deep = [middle for depth, middle in taken if depth == 3]
    assert deep.count("library") >= 2 and deep.count("graph") >= 2
    assert deep == sorted(deep, key=lambda middle: middle != "library")
    assert all(middle is None for depth, middle in taken if depth < 3)
    assert outcome.best.sgraph.dumps() == run_search(program, h100, SearchConfig()).best.sgraph.dumps()


@pytest.mark.parametrize("name", ["lora:ci", "gqa:ci"])
def test_first_kernels_made_in_parts_and_dealt_out_give_the_whole_shard(h100, name):
    """Split into parts, a graph choice's first kernels are made by part, cut across parts and
    dealt out (how the driver runs deeper graphs): the same first kernels as the whole choice's,
    and together the dealt shares produce exactly the candidates of the whole shard."""
    program = workloads.resolve(name)
    choice = ("graph", tuple(range(len(program.inputs))))
    whole_ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    whole = sorted(sg.dumps() for sg in whole_ks.candidates_in(3, choice))
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
    by_part = [ks.first_kernels(choice, (3, i)) for i in range(3)]
    gathered = ks.undominated([f for firsts in by_part for f in firsts])
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
    rank = ks._ranked_first

    def slow(st):  # the deadline passes while the first one is ranked
        ks.deadline = time.time() - 1
        ranked.append(st)
        return rank(st)

    monkeypatch.setattr(ks, "_ranked_first", slow)
    with pytest.raises(BudgetExhausted):
        ks.first_kernels(choice)
    assert len(ranked) == 1 and len(whole) > 1
    monkeypatch.setattr(ks, "_ranked_first", rank)
    ks.deadline = float("inf")
    assert [f.text for f in ks.first_kernels(choice)] == whole


@pytest.mark.parametrize("choice", [(0, 1), (0, 1, 2)])
def test_first_kernels_beaten_by_a_retiling_lead_to_no_better_graph(h100, choice):
    """A first kernel that another one doing the same computation into the same tensors beats (no
    slower at any chunk count, and first in the ties) is not grown: the best-ranked candidate of
    the shard is the same as when every first kernel is grown, from fewer candidates."""
    program = workloads.resolve("gqa:ci")

    def ranked_candidates(keep: int) -> list[tuple[float, str]]:
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(), target=h100)
        ks.keep = keep
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
        ks.keep = keep
        firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1)))
        ranked = [(r[0].estimate.time_s, sg.dumps()) for sg in ks.candidates_in(2, ("graph", (0, 1)))
                  if (r := rank(sg, h100))]
        return ks, firsts, ranked

    ks, firsts, kept_ranked = search(1)
    by_value: dict = {}
    for st in firsts:
        value = tuple((ks.oracle.class_of(t.ae), t.shape, t.chunk) for t in st.tensors[2:])
        by_value.setdefault((value, ks._fingerprint(st.kernels[0])), set()).add(_block_ops(st.kernels[0]))
    assert max(len(ops) for ops in by_value.values()) >= 2  # one value, several ways to compute it
    kept = [f.state for f in ks.undominated([ks._ranked_first(st) for st in firsts])]
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
    """`--concrete` had no side-by-side axis: (X @ W0, X @ W1) fused otherwise (2.712 us against
    the symbolic search's 2.700 at X (16, 64); at X (16, 1024) not at all: 5.519 us, the library
    matmuls, against 5.150). Its grids now include one axis over the columns of both weights
    (classes of one input each, of one extent, no two of one input), as Mirage's per-input maps
    allow."""
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
    assert concrete.best.best.estimate.time_s == symbolic.best.best.estimate.time_s
    (kernel,) = concrete.best.sgraph.kernels
    side = [a for a in range(len(kernel.block.grid)) if all(i.imap[a] == 1 for i in kernel.block.inputs[1:])]
    assert len(side) == 1 and kernel.block.inputs[0].imap[side[0]] is None  # X whole in every block


def test_concrete_first_kernels_are_compared_at_their_fixed_chunk_counts(h100):
    """In concrete search a kernel's chunk count is a number, not a symbol: kernels writing
    partial results are compared as they are, and only beaten ones are cut."""
    program = workloads.resolve("gqa:ci")
    ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(concrete=True), target=h100)
    firsts = list(ks._graph_moves(ks.initial(), False, only=(0, 1)))
    kept = [f.state for f in ks.undominated([ks._ranked_first(st) for st in firsts])]
    assert any(t.chunk is not None for st in kept for t in st.tensors)
    assert 0 < len(kept) < len(firsts)


@pytest.mark.parametrize(("spec", "depth"), [("gqa:ci", 2), ("lora:ci", 3)])
def test_bounded_memos_change_what_is_searched_again_not_what_is_found(h100, monkeypatch, spec, depth):
    """The block graphs, floors, post-loop recipes and tilings a search keeps are bounded (a long
    search's memory stops growing); past the bounds, what was dropped is generated again. With
    bounds of a few entries, the same candidates come in the same order, from more states."""
    from superopt.search import block, floors, kernel

    def candidates() -> tuple[list[str], int]:
        program = workloads.resolve(spec)
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


def test_full_collections_are_rare_while_searching_and_as_before_afterwards(h100):
    """A search keeps a large memo of long-lived objects: while it runs, a full garbage collection
    waits for FULL_COLLECTION_AFTER middle-generation ones; the process's thresholds are restored
    when it returns, also when it ends by an error."""
    before = gc.get_threshold()
    during: list[int] = []
    run_search(workloads.resolve("lora:ci"), h100, SearchConfig(),
               progress=lambda _: during.append(gc.get_threshold()[2]))
    assert during and min(during) == max(before[2], FULL_COLLECTION_AFTER) > before[2]
    assert gc.get_threshold() == before

    def fail(_: dict) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run_search(workloads.resolve("lora:ci"), h100, SearchConfig(), progress=fail)
    assert gc.get_threshold() == before


def test_a_finished_search_is_freed_without_a_garbage_collection(h100, monkeypatch):
    """A search's memo is large and cyclic (lazily walked bodies whose generators refer back to
    their generator, progress callbacks): it used to wait for a full collection, which walks every
    live object (0.15-0.25 s per job in a Ray worker). Forgotten at the end of the search, or when
    a worker switches jobs, it is freed by reference counting at once, with no collection."""
    from superopt.search import distributed

    made: list[weakref.ref] = []
    init = Searcher.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Searcher, "__init__", recording)
    program = workloads.resolve("lora:ci")
    thresholds = gc.get_threshold()  # a Ray worker raises them for good
    gc.disable()
    try:
        run_search(program, h100, SearchConfig(), parts=2)
        assert made and all(ref() is None for ref in made)
        made.clear()
        shard = Shard(1, ("graph", (0, 1, 2, 3)), (2, 0), walk=True)
        for job in ("first", "second"):
            distributed._run_shard(job, program.to_json(), h100, SearchConfig(), shard, float("inf"), None, None)
        assert made[0]() is None and made[1]() is distributed._SEARCHERS["second"]
    finally:
        gc.enable()
        gc.set_threshold(*thresholds)
        distributed._SEARCHERS.clear()


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
    the reach of some sets of tensors, and some values span several classes."""
    ks = _with_floors(spec, h100)
    oracle = ks.oracle
    states = [ks.initial(), *_first_kernels(ks, depth=3, choices=4, each=3)]
    assert any(t.chunk is not None for s in states for t in s.tensors)
    checked, outside, wide = 0, 0, 0
    for s in states:
        for size in (1, 2, 3):
            for subset in itertools.combinations(range(len(s.tensors)), size):
                reach = ks._reachable([s.tensors[i] for i in subset])
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
            reach = ks._reachable([s.tensors[index[i]] for i in nxt.kernels[-1].tensor_inputs])
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
    ks.bound_s = 11.6595e-6
    floor = ks._middle_floor(qk, 1)
    spent = ks._spent(qk)
    after = ks.launch_s + ks._owed(qk)((0, 1, 3)) / ks.bandwidth
    assert spent + ks._middle_own(qk, (0, 1, 3)) + after < ks.bound_s - 0.2e-6  # bytes alone: not cut
    assert floor((0, 1, 3)) > ks.bound_s
    last = ks._last_after(qk)
    assert last is not None and last((0, 1, 3)) >= ks.launch_s + 4 * 2**20 / ks.bandwidth
    ks._reach = False
    assert ks._middle_floor(qk, 1)((0, 1, 3)) < ks.bound_s  # without the reach the floor stays below


@pytest.mark.parametrize(("spec", "bound_s"), [("gqa", 11.7e-6), ("gqa:ci", 8e-6)])
def test_bounding_last_kernels_by_what_they_can_compute_cuts_states_not_candidates(h100, spec, bound_s):
    """Bounding the last kernel after a middle kernel by the values the two can compute (`Reach`)
    leaves the candidates of a 3-kernel search under a bound as they were, from fewer states."""

    def search(reach: bool) -> tuple[list[str], int]:
        program = workloads.resolve(spec)
        ks = KernelSearch(program, space_of(program), Oracle(program), SearchConfig(max_kernel_ops=3), target=h100)
        ks.bound_s, ks._reach = bound_s, reach
        return [sg.dumps() for sg in ks.candidates()], ks.total_states

    found, states = search(reach=True)
    found_before, states_before = search(reach=False)
    assert found and found == found_before
    assert states < states_before, (states, states_before)
