"""Transposes and reshapes: views the search reads in place, moves to the edges or keeps as free kernels."""

from __future__ import annotations

import pytest
from search_helpers import graph_kernels

from superopt import Program
from superopt.build import unfused_baseline
from superopt.config import SearchConfig
from superopt.instantiate import instantiate
from superopt.interpreter import run_float
from superopt.program import Tensor
from superopt.search.driver import Searcher, run_search
from superopt.search.floors import Floors
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.search.views import ProgramViews
from superopt.sgraph import GraphKernel, LibraryKernel
from superopt.verifier.oracle import Oracle

pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_free_view_kernel_after_a_fused_one_is_not_cut_by_the_bound(h100, monkeypatch):
    """A reshape is a view: its library kernel costs no launch and moves no bytes. Bounds that
    charge every kernel to come a launch and the outputs' bytes would cut the fused kernel that
    a reshape follows (a launch over the unfused baseline's time), leaving the baseline; the
    search finds the fused kernel and the view, as a search without any bound does."""

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
    monkeypatch.setattr(Floors, "bound_s", property(lambda self: float("inf"), lambda self, value: None), raising=False)
    exhaustive = run_search(program(), h100, config)  # every graph generated: the same winner
    assert exhaustive.best.sgraph.dumps() == outcome.best.sgraph.dumps()


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
    x, w, v = p.input("X", (4, 8), "f32"), p.input("W", (8, 6), "f32"), p.input("V", (8, 6), "f32")
    p.output(p.rms_norm(p.reshape(((x * p.sum(x, -1, keepdim=True)) @ w) * (x @ v), (4, 2, 3)), -1))
    ks = KernelSearch(p, space_of(p), Oracle(p), SearchConfig(), target=h100)
    start = ks.initial()
    assert ks.floors.lacks_classes(start)
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
    (`Floors.lacks_classes` asks only of outputs that are no reshape); found by
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
    sg, _ = ks.floors._prefix(first)
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


def test_layout_ops_stay_library_kernels(h100):
    p = Program("t")
    x = p.input("X", (8, 16), "f32")
    p.output(p.exp(p.transpose(x, [1, 0])))
    outcome = run_search(p, h100, SearchConfig(), budget_s=60)
    assert outcome.best.verdict.proved
    assert any(isinstance(k, LibraryKernel) and k.op == "transpose" for k in outcome.best.sgraph.kernels)


def test_a_zero_d_view_of_an_input_is_searched_in_place(h100):
    """A 0-d parameter imported from PyTorch is a (1,) input reshaped to (): the search took the
    reshape for a view of an input and declared a 0-d input, which no program has, and failed
    ("'shape' must be a non-empty list"). It stays in the searched program; the schedule is right."""
    from superopt.reference import evaluate, max_rel_err, random_inputs

    p = Program("scalar_gate")
    x, alpha = p.input("x", (8, 64), "f32"), p.input("alpha", (1,), "f32")
    p.output(p.op("mul", p.op("sigmoid", p.op("mul", x, p.op("reshape", alpha, shape=[]))), x, name="O"))
    assert ProgramViews(p).inputs == ()
    best = run_search(p, h100, SearchConfig(), budget_s=60).best
    assert best.verdict.proved
    inputs = random_inputs(p, 4)
    [got] = run_float(instantiate(best.sgraph, best.best.params, h100), inputs)
    assert max_rel_err(got, evaluate(p, inputs)[0]) < 1e-6


def test_a_product_beside_a_zero_d_view_is_searched(h100):
    """(x @ w) * scale with a 0-d buffer (a (1,) input reshaped to ()): the block search tried the
    0-d view as a matmul operand and failed with an IndexError in the oracle (a 368-line
    traceback from `superopt optimize`). No block matmul takes an operand of rank below 2."""
    from superopt.reference import evaluate, max_rel_err, random_inputs

    p = Program("scaled_product")
    x, w, scale = p.input("x", (4, 16), "f32"), p.input("w", (16, 8), "f32"), p.input("scale", (1,), "f32")
    p.output(p.op("mul", p.op("matmul", x, w), p.op("reshape", scale, shape=[]), name="O"))
    best = run_search(p, h100, SearchConfig(), budget_s=60).best
    assert best.verdict.proved
    inputs = random_inputs(p, 5)
    [got] = run_float(instantiate(best.sgraph, best.best.params, h100), inputs)
    assert max_rel_err(got, evaluate(p, inputs)[0]) < 1e-6
