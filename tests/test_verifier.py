"""Verifier: rules checked on numbers, references proved, mutants never proved, z3 lemmas."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from kernel_shapes import candidate, grouped_projections, norm_then_softmax, projections, softmax_of_transposed
from proof_corpus import CORRECT, egraph_proof
from typer.testing import CliRunner

from superopt import Program, workloads
from superopt.assignments import enumerate_assignments, pick_for_checks
from superopt.build import SGraphBuilder, unfused_baseline
from superopt.cli import app
from superopt.config import SearchConfig
from superopt.dimclasses import input_classes
from superopt.instantiate import instantiate
from superopt.interpreter import run_float
from superopt.mutations import mutants
from superopt.reference import evaluate, max_rel_err, random_inputs, undefined_node
from superopt.search.driver import _why, run_search
from superopt.sgraph import SGraph, input_decls, rebind
from superopt.targets import TARGETS
from superopt.verifier import constraints, finite_field
from superopt.verifier import terms as t
from superopt.verifier.egraph import Limits, prove
from superopt.verifier.lowering import lower_program, lower_sgraph
from superopt.verifier.oracle import C, Oracle, abstract_program, abstract_sgraph, constants_of, mk
from superopt.verifier.rules import RULES, permutation_rules
from superopt.verifier.term_eval import Bindings, EvalError, agree, exact_evaluable
from superopt.verifier.term_eval import evaluate as evaluate_term
from superopt.verifier.verify import verify, verify_at

NAMES = list(workloads.WORKLOADS)


# -- rules are checked, not trusted -----------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_holds_on_random_instances(rule):
    """In float64, and exactly (in rationals) wherever the rule has no exp or sqrt, at six
    instances of pairwise distinct axis sizes."""
    exact = exact_evaluable(rule.lhs) and exact_evaluable(rule.rhs)
    for seed in range(6):
        b = rule.example(np.random.default_rng(seed))
        assert agree(rule.lhs, rule.rhs, b, [b.axes[x] for x in rule.free]), (rule.name, seed)
        assert not exact or agree(rule.lhs, rule.rhs, b, [b.axes[x] for x in rule.free], exact=True), (rule.name, seed)


def test_rule_checker_refutes_unsound_rules():
    rng = np.random.default_rng(0)
    e, a = t.Var("E"), t.AxisVar("a")
    family = lambda idx: np.full((2, 3), float(idx["x"] + 1))
    b = Bindings(tensors={"E": family}, dims={"d": -1}, axes={"a": "x"}, sizes={"x": 3})
    # cat_over(part(E)) = E needs E independent of the axis; with a family it is false.
    assert not agree(t.cat_over(t.part(e, t.DimVar("d"), a), t.DimVar("d"), a), e,
                     Bindings(tensors={"E": lambda idx: family(idx).repeat(3, axis=1)}, dims={"d": -1},
                              axes={"a": "x"}, sizes={"x": 3}), ["x"])
    # A sum over tiles of tile means is not the mean.
    b2 = Bindings(tensors={"E": rng.standard_normal((2, 6))}, dims={"d": -1}, axes={"a": "x"}, sizes={"x": 3},
                  extents={"n": 6})
    n, dim = t.ExtVar("n"), t.DimVar("d")
    wrong = (t.sum_over(t.reduce("mean", t.part(e, dim, a), dim, t.per(n, a)), a), t.reduce("mean", e, dim, n))
    assert not agree(*wrong, b2, [])
    assert b.sizes["x"] == 3


def test_exact_rule_checks_see_what_rounding_hides():
    """A rule off by one part in 10^12 passes the float64 comparison and fails the exact one;
    most rules are checked exactly."""
    a_var = t.Var("A")
    b = Bindings(tensors={"A": np.random.default_rng(4).standard_normal((3, 4)) + 0.1})
    nearly = (t.binary("mul", a_var, t.const(1.0 + 1e-12)), a_var)
    assert agree(*nearly, b, []) and not agree(*nearly, b, [], exact=True)
    exact = [r for r in RULES if exact_evaluable(r.lhs) and exact_evaluable(r.rhs)]
    assert len(exact) >= 0.8 * len(RULES), (len(exact), len(RULES))


def test_rule_checker_sees_extents():
    """A sum of a term constant along its dim is the term times the extent: the checker evaluates
    it so, and refutes a rule that sums a broadcast over another dim's extent, which is true only
    where the two extents are equal (the rules once let `sum(X + 1) + sum(Y + 1)` equal
    `sum(X) + sum(Y + 2)` for X and Y of different widths)."""
    rng = np.random.default_rng(3)
    a_var, s_var, dim = t.Var("A"), t.Var("S"), t.DimVar("d")
    n, m = t.ExtVar("n"), t.ExtVar("m")
    moved = (t.reduce("sum", t.binary("add", a_var, t.bcast(s_var, dim)), dim, n),
             t.binary("add", t.reduce("sum", a_var, dim, n), t.reduce("sum", t.bcast(s_var, dim), dim, m)))
    for widths in ((64, 32), (5, 7), (12, 3)):
        b = Bindings(tensors={"A": rng.standard_normal((4, widths[0])), "S": rng.standard_normal((4, 1)) + 2.0},
                     dims={"d": -1}, extents={"n": widths[0], "m": widths[1]})
        assert not agree(*moved, b, [])
        assert agree(moved[0], moved[1], Bindings(tensors=b.tensors, dims=b.dims,
                                                  extents={"n": widths[0], "m": widths[0]}), [])
    # a sum over a dim whose extent is not the operand's size is ill-formed, not silently summed
    with pytest.raises(EvalError):
        evaluate_term(t.reduce("sum", a_var, dim, n), Bindings(tensors={"A": np.ones((2, 3))}, dims={"d": -1},
                                                          extents={"n": 4}))


def test_tile_map_lemmas_are_proved_by_z3():
    lemmas = constraints.tile_map_lemmas()
    assert len(lemmas) == 7
    assert all(lem.proved for lem in lemmas), [lem.name for lem in lemmas if not lem.proved]


def test_ragged_split_is_refuted_with_a_counterexample():
    cex = constraints.ragged_split_counterexample()
    assert cex is not None and cex["n"] % cex["w"] != 0


# -- finite fields ---------------------------------------------------------------------------------


def _is_prime(n: int) -> bool:
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_parameters():
    assert _is_prime(finite_field.P) and _is_prime(finite_field.Q)
    assert (finite_field.P - 1) % finite_field.Q == 0
    assert pow(finite_field.G, finite_field.Q, finite_field.P) == 1 and finite_field.G != 1
    assert finite_field.P > 2**31


def test_field_arithmetic_is_exact():
    rng = np.random.default_rng(1)
    alg = finite_field.FieldAlgebra(rng)
    a = finite_field.FF(rng.integers(0, finite_field.P, (3, 5)), rng.integers(0, finite_field.Q, (3, 5)))
    b = finite_field.FF(rng.integers(0, finite_field.P, (5, 4)), rng.integers(0, finite_field.Q, (5, 4)))
    got = alg.matmul(a, b).p
    want = np.array([[sum(int(a.p[i, k]) * int(b.p[k, j]) for k in range(5)) % finite_field.P for j in range(4)]
                     for i in range(3)])
    assert np.array_equal(got, want)
    x, y = finite_field.FF(a.p[:, :4], a.q[:, :4]), finite_field.FF(b.p[:3, :], b.q[:3, :])
    assert np.array_equal(alg.exp(alg.add(x, y)).p, alg.mul(alg.exp(x), alg.exp(y)).p)
    assert np.array_equal(alg.mul(alg.div(x, y), y).p, x.p)
    half = alg.const(0.5)
    assert int(half.p) * 2 % finite_field.P == 1


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 70), (70, 4)), ((2, 3, 4096), (2, 4096, 5)),
                                                  ((5, 2), (2, 700)), ((2, 70000), (70000, 2)), ((4, 3, 2), (2, 6))])
@pytest.mark.parametrize("m", [finite_field.P, finite_field.Q])
def test_field_matmul_is_exact_for_every_contraction_length(a_shape, b_shape, m):
    """Limbs are as wide as the contraction length allows (K 2^width 2^32 <= 2^53), either operand
    may be the one cut, and contractions past 2^16 are halved: checked against Python integers,
    with the largest residue in every row and column (the sums that come nearest 2^53)."""
    rng = np.random.default_rng([3, len(a_shape), b_shape[-1]])
    a, b = rng.integers(0, m, a_shape), rng.integers(0, m, b_shape)
    a[..., 0], b[..., 0, :] = m - 1, m - 1
    a[..., -1], b[..., -1, :] = m - 1, m - 1
    got = finite_field._matmul_mod(a, b, m)
    a3, b3 = np.broadcast_to(a, (*got.shape[:-2], *a.shape[-2:])), np.broadcast_to(b, (*got.shape[:-2], *b.shape[-2:]))
    for idx in np.ndindex(*got.shape[:-2]):
        x, y = a3[idx].astype(object), b3[idx].astype(object)
        assert np.array_equal(got[idx], (x.dot(y) % m).astype(np.int64)), idx
    # the same with the operands' float64 copies given (an input's, `FF.pf`), halves included,
    # and with those alone (an input's int64 residues are not held)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    assert np.array_equal(finite_field._matmul_mod(a, b, m, af, bf), got)
    assert np.array_equal(finite_field._matmul_mod(None, None, m, af, bf), got)


def test_an_inputs_residues_are_held_once_and_a_weight_stays_float64():
    """At real shapes the inputs' residues are most of a check's memory: each is held as float64
    only, its int64 residues made for the ops that need them (elementwise ops, the limbs of a
    matmul's smaller operand), never for a weight a matmul reads whole, nor for views of it."""
    program = workloads.resolve("gated_mlp:ci")  # X (4, 64) against W1, W2 (64, 48)
    rng = np.random.default_rng(5)
    inputs = finite_field.random_field_inputs(program, rng)
    assert all(x._p is None and x._q is None and x.pf is not None and x.qf is not None for x in inputs.values())
    alg = finite_field.FieldAlgebra(rng)
    x, w = inputs["X"], inputs["W1"]
    tile = alg.take(w, (slice(0, 64), slice(0, 16)))
    got = alg.matmul(alg.exp(x), tile)
    assert w._p is None and w._q is None and tile._p is None  # read as float64 only
    exp_x = finite_field._exp_g(x.qf.astype(np.int64))  # exp in Z_P: g to the shadow
    want = exp_x.astype(object).dot(w.pf[:, :16].astype(np.int64).astype(object)) % finite_field.P
    assert np.array_equal(got.p, want.astype(np.int64))


def test_only_inputs_under_an_exp_carry_the_exponent_shadow(h100):
    """An input's exponent shadow is read by exp alone, so only the inputs an exp's argument
    depends on get one: not gated_mlp's up projection (outside silu), attention's V (after the
    softmax) or any input of a program without exp. An sGraph that takes exp of an input without
    one still fails: silu of the up projection times the gate's is refuted."""
    assert finite_field.exponent_inputs(workloads.resolve("gated_mlp")) == {"X", "W1"}
    assert finite_field.exponent_inputs(workloads.resolve("gqa")) == {"Q", "K"}
    assert finite_field.exponent_inputs(workloads.resolve("rmsnorm_matmul")) == set()
    p = Program("exp_of_exp")
    x, y, z = (p.input(n, (4, 4), "f32") for n in "XYZ")
    p.output(p.op("mul", p.op("exp", p.op("add", p.op("exp", x), p.op("sum", y, dim=1, keepdim=True))), z))
    assert finite_field.exponent_inputs(p) == {"X", "Y"}
    inputs = finite_field.random_field_inputs(p, np.random.default_rng(0), shadow=finite_field.exponent_inputs(p))
    assert inputs["Z"].q is None and inputs["X"].q is not None and inputs["Y"].qf is not None

    program, ref = workloads.reference_for("gated_mlp:ci")
    params = list(enumerate_assignments(ref, h100))[-1]
    assert finite_field.check(program, instantiate(ref, params, h100)).passed
    swapped = json.loads(ref.dumps())
    post = swapped["kernels"][0]["post"]
    assert post[0]["inputs"] == ["acc2"] and post[1]["inputs"] == ["p5", "acc4"]
    post[0]["inputs"], post[1]["inputs"] = ["acc4"], ["p5", "acc2"]  # silu(X W2) * (X W1)
    res = finite_field.check(program, instantiate(SGraph.from_json(swapped), params, h100))
    assert not res.passed and "trial 0" in res.mismatch


def test_field_draws_cover_the_field_evenly():
    """Residues come from 31 random bits each: in range, no residue likelier than the bound
    `check` reports (at most 1 + 1e-7 times uniform), and a small field's counts are even."""
    rng = np.random.default_rng(4)
    for m in (finite_field.P, finite_field.Q):
        r = finite_field._residues(rng, m, (200_000,))
        assert r.min() >= 0 and r.max() < m and len(np.unique(r)) > 199_900  # birthday collisions: about 10 and 20
        assert 1.0 <= finite_field._most_likely(m) * m < 1 + 1e-7
    counts = np.bincount(finite_field._residues(rng, 7, (700_000,)), minlength=7)
    assert np.all(np.abs(counts / 100_000 - 1) < 0.02), counts


def test_the_returned_kernel_is_checked_at_real_shapes_without_proving_again(h100):
    """`verify_at` adds the finite-field and float checks at the program's real shapes to a
    verdict `verify` made (the same layers, seeds and figures as `verify(..., params=)`), without
    a second proof; a refuted verdict comes back unchanged."""
    program, ref = workloads.reference_for("rmsnorm_matmul:ci")
    params = list(enumerate_assignments(ref, h100))[-1]
    v = verify(program, ref, target=h100)
    w = verify_at(program, ref, params, v, target=h100)
    assert w.proved and [x["layer"] for x in w.layers] == [x["layer"] for x in v.layers] + ["finite_field", "float"]
    assert w.layers[-2]["detail"]["shapes"] == {n.id: list(n.shape) for n in program.inputs}
    assert w.layers[-2]["detail"]["params"] == params and w.finite_field_trials == v.finite_field_trials + 2
    assert w.float_instantiations == v.float_instantiations + 1 and len(v.layers) == len(w.layers) - 2
    whole = verify(program, ref, target=h100, params=params)
    assert [(x["layer"], x["detail"]) for x in whole.layers if x["layer"] != "egraph"] == \
        [(x["layer"], x["detail"]) for x in w.layers if x["layer"] != "egraph"]
    what, wrong = next((what, m) for what, m in mutants(ref, program) if not verify(program, m, target=h100).proved)
    refuted = verify(program, wrong, target=h100)
    again = verify_at(program, wrong, params, refuted, target=h100)
    assert not again.proved and again.layers == refuted.layers, what


# -- references and baselines -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_reference_and_baseline_are_proved(name):
    program, ref = workloads.reference_for(name)
    for sg in (ref, unfused_baseline(program)):
        v = verify(program, sg)
        assert v.proved, v.layers
        assert v.egraph == "proved" and v.egraph_stats["rule_applications"] >= (1 if sg is ref else 0)
        if sg is ref:
            ff_params = [json.dumps(x["detail"]["params"], sort_keys=True) for x in v.layers if x["layer"] == "finite_field"]
            assert len(set(ff_params)) >= 3 and v.finite_field_trials >= 6
            assert v.float_instantiations >= 3 and v.float_max_rel_err <= v.float_tolerance


def test_one_proof_covers_every_instantiation(h100):
    """The symbolic proof is made once; every instantiation at several shapes then checks out."""
    w = workloads.get("gqa")
    program = w.program("ci")
    ref = w.reference(program)
    rhs, axes = lower_sgraph(ref, program)
    assert prove(list(zip(lower_program(program), rhs, strict=False)), axes).proved
    for sizes in ({"b": 2, "m": 8, "n": 64, "dh": 16}, {"b": 3, "m": 6, "n": 36, "dh": 8}):
        p = w.build(**sizes)
        sg = rebind(ref, input_decls(p))
        assigns = list(enumerate_assignments(sg, h100))
        rng = np.random.default_rng(7)
        for i in rng.choice(len(assigns), size=min(5, len(assigns)), replace=False):
            inst = instantiate(sg, assigns[int(i)], h100)
            assert finite_field.check(p, inst, trials=1, seed=int(i)).passed, assigns[int(i)]


# -- small programs that need the rules the workloads do not --------------------------------------


def _elementwise_program() -> Program:
    p = Program("ew")
    x = p.input("X", (4, 12), "f32")
    r = p.input("R", (4, 1), "f32")
    y = ((x - r) * (1.0 - x) * (r - x)) / (r / x) + r
    p.output(p.op("sub", p.relu(y / 2.0), 2.0, name="O"))
    return p


def _elementwise_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, rt = k.input("X", [1], None), k.input("R", [None], None)
    two, one = k.op("const", value=2.0), k.op("const", value=1.0)
    prod = k.op("mul", k.op("mul", k.op("sub", xt, rt), k.op("sub", one, xt)), k.op("sub", rt, xt))
    y = k.op("add", k.op("div", prod, k.op("div", rt, xt)), rt)
    o = k.op("sub", k.op("relu", k.op("div", y, two)), two)
    k.output(k.acc(o), "O", [1])
    return b.build(["O"])


def _activations_program() -> Program:
    p = Program("activations")
    x, bias = p.input("X", (4, 12), "f32"), p.input("B", (1, 12), "f32")
    p.output(p.op("gelu", p.silu(p.sigmoid(x) + bias), name="O"))
    return p


def _activations_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx"), ("y", "gy")])
    xt, bt = k.input("X", [0, 1], None), k.input("B", [None, 1], None)
    o = k.op("gelu", k.op("silu", k.op("add", k.op("sigmoid", xt), bt)))
    k.output(k.acc(o), "O", [0, 1])
    return b.build(["O"])


def _rowmax_program() -> Program:
    p = Program("rowmax")
    x = p.input("X", (6, 8), "f32")
    p.output(p.op("sub", x, p.max(x, -1, keepdim=True), name="O"))
    return p


def _rowmax_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt = k.input("X", [0], None)
    k.output(k.acc(k.op("sub", xt, k.op("max", xt, dim=1, keepdim=True))), "O", [0])
    return b.build(["O"])


def _squeeze_program(dim: int) -> Program:
    p = Program("squeeze")
    x = p.input("X", (6, 8), "f32")
    p.output(p.op("sum", p.exp(x), name="O", dim=dim, keepdim=False))
    return p


def _squeeze_sgraph(p: Program, dim: int) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt = k.input("X", [1 - dim], None)
    k.output(k.acc(k.op("sum", k.op("exp", xt), dim=dim, keepdim=False)), "O", [0])
    return b.build(["O"])


def _scaled_matmul_program() -> Program:
    p = Program("scaled_mm")
    x = p.input("X", (4, 16), "f32")
    s = p.input("S", (4, 1), "f32")
    w = p.input("W", (16, 12), "f32")
    p.output(p.op("matmul", x * s, w, name="O"))
    return p


def _scaled_matmul_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    acc = k.acc(k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0)))
    scale = k.acc(k.input("S", [None], None), "mean")
    k.output(k.after("mul", acc, scale), "O", [1])
    return b.build(["O"])


def _row_mean_program() -> Program:
    p = Program("row_mean")
    x = p.input("X", (6, 16), "f32")
    p.output(p.op("mean", p.exp(x), name="O", dim=-1, keepdim=True))
    return p


def _row_mean_sgraph(p: Program) -> SGraph:
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt = k.input("X", [0], 1)
    k.output(k.acc(k.op("mean", k.op("exp", xt), dim=1, keepdim=True), "mean"), "O", [0])
    return b.build(["O"])


def _nested_reductions_program(columns: bool = False) -> Program:
    """Sums and means of every dim in either order (and, with `columns`, column sums and means
    without keepdim)."""
    p = Program("nested_reductions")
    x = p.input("X", (8, 12), "f32")
    for inner in ("sum", "mean"):
        for outer in ("sum", "mean"):
            p.output(p.op(outer, p.op(inner, x, dim=0, keepdim=True), name=f"{outer}_{inner}", dim=1, keepdim=True))
    if columns:
        p.output(p.op("sum", x, name="col_sums", dim=0, keepdim=False),
                 p.op("mean", x, name="col_means", dim=0, keepdim=False))
    return p


def _whole_reductions_sgraph(p: Program) -> SGraph:
    """One block walking X's rows: each iteration's reductions, accumulated (a sum of per-iteration
    means over columns is the mean over columns of the sums...)."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 1)], loop=("f", "F"))
    xt = k.input("X", [None], 0)
    partial = {inner: k.op(inner, xt, dim=0, keepdim=True) for inner in ("sum", "mean")}
    names = []
    for inner in ("sum", "mean"):
        for outer in ("sum", "mean"):
            tile = k.op(outer, partial[inner], dim=1, keepdim=True)
            names.append(k.output(k.acc(tile, inner), f"{outer}_{inner}", [0]))
    for op, name in (("sum", "col_sums"), ("mean", "col_means")):
        names.append(k.output(k.acc(k.op(op, xt, dim=0, keepdim=False), op), name, [0]))
    return b.build(names)


def _nested_reductions_sgraph(p: Program) -> SGraph:
    """The same reductions in the other order: one block walking X's columns reduces each tile's
    columns, then the rows after the loop."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 1)], loop=("f", "F"))
    xt = k.input("X", [None], 1)
    names = []
    for inner in ("sum", "mean"):
        for outer in ("sum", "mean"):
            columns = k.acc(k.op(outer, xt, dim=1, keepdim=True), outer)
            names.append(k.output(k.after(inner, columns, dim=0, keepdim=True), f"{outer}_{inner}", [0]))
    return b.build(names)


def _reduced_combinations_program() -> Program:
    p = Program("reduced_combinations")
    x, y = p.input("X", (8, 12), "f32"), p.input("Y", (8, 12), "f32")
    for bop in ("add", "sub"):
        for op in ("sum", "mean"):
            p.output(p.op(op, p.op(bop, x, y), name=f"{op}_{bop}", dim=1, keepdim=True))
    p.output(p.op("mul", p.exp(x), p.exp(y), name="exp_product"))
    return p


def _reduced_combinations_sgraph(p: Program) -> SGraph:
    """sum(X + Y) as sum(X) + sum(Y) (means, differences alike), exp(X) exp(Y) as exp(X + Y)."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, yt = k.input("X", [0], None), k.input("Y", [0], None)
    names = []
    for bop in ("add", "sub"):
        for op in ("sum", "mean"):
            both = k.op(bop, k.op(op, xt, dim=1, keepdim=True), k.op(op, yt, dim=1, keepdim=True))
            names.append(k.output(k.acc(both), f"{op}_{bop}", [0]))
    names.append(k.output(k.acc(k.op("exp", k.op("add", xt, yt))), "exp_product", [0]))
    return b.build(names)


def _reduced_row_scales_program() -> Program:
    p = Program("reduced_row_scales")
    x, y = p.input("X", (8, 12), "f32"), p.input("Y", (8, 12), "f32")
    scale = p.sum(y, 1, keepdim=True)
    for bop in ("mul", "div"):
        for op in ("sum", "mean"):
            p.output(p.op(op, p.op(bop, x, scale), name=f"{op}_{bop}", dim=1, keepdim=True))
    return p


def _reduced_row_scales_sgraph(p: Program) -> SGraph:
    """sum(X * s) with s a row scale (one value per row, broadcast along the summed dim) as
    sum(X) * s (means, divisions alike): the sum of a normalized row is its sum over its norm."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    xt, yt = k.input("X", [0], None), k.input("Y", [0], None)
    scale = k.op("sum", yt, dim=1, keepdim=True)
    names = []
    for bop in ("mul", "div"):
        for op in ("sum", "mean"):
            names.append(k.output(k.acc(k.op(bop, k.op(op, xt, dim=1, keepdim=True), scale)), f"{op}_{bop}", [0]))
    return b.build(names)


def _negated_matmul_program() -> Program:
    p = Program("negated_mm")
    x, w = p.input("X", (4, 16), "f32"), p.input("W", (16, 12), "f32")
    p.output(p.op("matmul", p.neg(x), p.neg(w), name="O"))
    return p


def _negated_matmul_sgraph(p: Program) -> SGraph:
    """-X @ -W as X @ W: the signs cancel."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    k.output(k.acc(k.op("matmul", k.input("X", [None], 1), k.input("W", [1], 0))), "O", [1])
    return b.build(["O"])


def _swapped_difference_program() -> Program:
    p = Program("swapped_difference")
    x, r, w = p.input("X", (4, 16), "f32"), p.input("R", (4, 1), "f32"), p.input("W", (16, 12), "f32")
    p.output(p.op("matmul", p.neg((x - r) * 3.0), w, name="O"))
    return p


def _swapped_difference_sgraph(p: Program) -> SGraph:
    """-((X - R) * 3) @ W as (R - X) @ (W * 3): the difference swapped for the sign, the scale
    moved to the other operand."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    diff = k.op("sub", k.input("R", [None], None), k.input("X", [None], 1))
    scaled = k.op("mul", k.input("W", [1], 0), k.op("const", value=3.0))
    k.output(k.acc(k.op("matmul", diff, scaled)), "O", [1])
    return b.build(["O"])


def _regrouped_sums_program() -> Program:
    p = Program("regrouped_sums")
    x, r, y = p.input("X", (4, 16), "f32"), p.input("R", (4, 1), "f32"), p.input("Y", (4, 16), "f32")
    p.output(p.op("matmul", ((x - r) + 2.0) + y, p.input("W", (16, 12), "f32"), name="O"),
             p.op("add", x - r, y, name="Q"))
    return p


def _regrouped_sums_sgraph(p: Program) -> SGraph:
    """((X - R) + 2) + Y grouped as (X - R) + (2 + Y), and (X - R) + Y as (X + Y) - R (found by
    fuzz_optimize: (X + 2) - X for (X - X) + 2, admitted by the oracle, was never proved)."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    x, r, y = (k.input(name, [0], None) for name in ("X", "R", "Y"))
    summed = k.op("add", k.op("sub", x, r), k.op("add", k.op("const", value=2.0), y))
    k.output(k.acc(k.op("matmul", summed, k.input("W", [None], None))), "O", [0])
    k.output(k.acc(k.op("sub", k.op("add", x, y), r)), "Q", [0])
    return b.build(["O", "Q"])


def _negated_rows_program(kind: str) -> Program:
    p = Program(f"negated_{kind}")
    x, y = p.input("X", (6, 16), "f32"), p.input("Y", (6, 16), "f32")
    p.output(p.op(kind, p.neg(x) * y, name="P", dim=-1, keepdim=True),
             p.op(kind, p.neg(x) / y, name="Q", dim=-1, keepdim=True))
    return p


def _negated_rows_sgraph(p: Program, kind: str) -> SGraph:
    """Row reductions (sum or mean) of -X * Y and -X / Y over a loop: the first negated after
    the loop, the second negated chunk by chunk before the accumulator."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    xt, yt = k.input("X", [0], 1), k.input("Y", [0], 1)
    k.output(k.after("neg", k.acc(k.op(kind, k.op("mul", xt, yt), dim=1, keepdim=True), kind)), "P", [0])
    k.output(k.acc(k.op("neg", k.op(kind, k.op("div", xt, yt), dim=1, keepdim=True)), kind), "Q", [0])
    return b.build(["P", "Q"])


def _split_k_program(kind: str) -> Program:
    """(X @ A) then a matmul on the left or right, or a row scale (mul) or division (div)."""
    p = Program(f"splitk_{kind}")
    x = p.input("X", (4, 16), "f32")
    a = p.input("A", (16, 8), "f32")
    if kind == "left":
        p.output(p.op("matmul", x @ a, p.input("B", (8, 12), "f32"), name="O"))
    elif kind == "right":
        p.output(p.op("matmul", p.input("C", (12, 4), "f32"), x @ a, name="O"))
    else:
        p.output(p.op(kind, x @ a, p.input("S", (4, 1), "f32"), name="O"))
    return p


def _split_k_sgraph(p: Program, kind: str) -> SGraph:
    """Kernel 1 splits the contraction over grid axis z and writes per-chunk partial products;
    kernel 2 walks the chunks (its loop is the same axis z), applies the second operation to each
    chunk and sums: correct only because the operation is linear in the partial product."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("z", "gz")])
    chunk_dim = 0 if kind == "right" else 1
    part = k1.acc(k1.op("matmul", k1.input("X", [1], None), k1.input("A", [0], None)))
    k1.output(part, "P", [chunk_dim])
    k2 = b.graph(grid=[("u", "hu")], loop=("z", "gz"))
    if kind == "left":
        body = k2.op("matmul", k2.input("P", [0], 1), k2.input("B", [None], None))
    elif kind == "right":
        body = k2.op("matmul", k2.input("C", [None], None), k2.input("P", [1], 0))
    else:
        body = k2.op(kind, k2.input("P", [0], 1), k2.input("S", [0], None))
    k2.output(k2.acc(body), "O", [1 if kind == "right" else 0])
    return b.build(["O"])


def _biased_mean_program() -> Program:
    p = Program("biased_mean")
    x, b = p.input("X", (4, 24), "f32"), p.input("B", (4, 1), "f32")
    p.output(p.op("mean", (x + 1.0) + b, name="O", dim=-1, keepdim=True))
    return p


def _biased_mean_sgraph(p: Program) -> SGraph:
    """mean(X + 1 + B) as mean(X) + 1 + B: a constant and a row bias are their own means over the
    columns, whatever their number."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    row_mean = k.acc(k.op("mean", k.input("X", [0], 1), dim=1, keepdim=True), "mean")
    bias = k.acc(k.input("B", [0], None), "mean")
    k.output(k.after("add", k.after("add", row_mean, k.after("const", value=1.0)), bias), "O", [0])
    return b.build(["O"])


def _reduced_product_program(op: str, dim: int) -> Program:
    p = Program(f"{op}_of_product")
    x, w = p.input("X", (4, 16), "f32"), p.input("W", (16, 12), "f32")
    p.output(p.op("mul", p.op(op, x @ w, dim=dim, keepdim=True), 0.5, name="O"))
    return p


def _reduced_operand_sgraph(p: Program, op: str, dim: int) -> SGraph:
    """The columns of W (rows of X) reduced first, then a matrix-vector product: the matmul of
    the program is never computed."""
    b = SGraphBuilder.for_program(p)
    if dim == -1:
        v = b.library(op, "W", dim=-1, keepdim=True)
        prod = b.library("matmul", "X", v)
    else:
        v = b.library(op, "X", dim=-2, keepdim=True)
        prod = b.library("matmul", v, "W")
    half = b.library("const", value=0.5)
    b.library("mul", prod, half, out="O")
    return b.build(["O"])


def _transposed_program() -> Program:
    """Every elementwise op of transposed operands (both, or one and a constant on either side)."""
    p = Program("transposed")
    xt, yt = (p.transpose(p.input(n, (6, 4), "f32"), (1, 0)) for n in ("X", "Y"))
    u = p.relu(p.sqrt(p.exp(-xt)))
    v = ((xt + yt) * (xt - yt)) / yt
    w = (((u * 2.0) + 3.0) - 1.0) / 5.0
    p.output(p.op("add", v + w, (2.0 - xt) * (3.0 / xt), name="O"))
    return p


def _transposed_sgraph(p: Program) -> SGraph:
    """The same ops on X and Y as stored, in one kernel; its output transposed (a view)."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    x, y = k.input("X", [0], None), k.input("Y", [0], None)
    c = {v: k.op("const", value=v) for v in (1.0, 2.0, 3.0, 5.0)}
    u = k.op("relu", k.op("sqrt", k.op("exp", k.op("neg", x))))
    v = k.op("div", k.op("mul", k.op("add", x, y), k.op("sub", x, y)), y)
    w = k.op("div", k.op("sub", k.op("add", k.op("mul", u, c[2.0]), c[3.0]), c[1.0]), c[5.0])
    z = k.op("mul", k.op("sub", c[2.0], x), k.op("div", c[3.0], x))
    k.output(k.acc(k.op("add", k.op("add", v, w), z)), "OT", [0])
    b.library("transpose", "OT", out="O", perm=[1, 0])
    return b.build(["O"])


TARGETED = {
    "split-K, then a matmul on the right of each chunk": (lambda: _split_k_program("left"),
                                                          lambda p: _split_k_sgraph(p, "left")),
    "split-K, then a matmul on the left of each chunk": (lambda: _split_k_program("right"),
                                                         lambda p: _split_k_sgraph(p, "right")),
    "split-K, then a row scale of each chunk": (lambda: _split_k_program("mul"),
                                                lambda p: _split_k_sgraph(p, "mul")),
    "split-K, then a row division of each chunk": (lambda: _split_k_program("div"),
                                                   lambda p: _split_k_sgraph(p, "div")),
    "elementwise with replicated and constant operands": (_elementwise_program, _elementwise_sgraph),
    "row max": (_rowmax_program, _rowmax_sgraph),
    "a chain of activations, split over rows and columns": (_activations_program, _activations_sgraph),
    "sum without keepdim, rows split": (lambda: _squeeze_program(1), lambda p: _squeeze_sgraph(p, 1)),
    "sum without keepdim, cols split": (lambda: _squeeze_program(0), lambda p: _squeeze_sgraph(p, 0)),
    "row-scaled matmul": (_scaled_matmul_program, _scaled_matmul_sgraph),
    "row mean over a loop": (_row_mean_program, _row_mean_sgraph),
    "negated operands of a matmul": (_negated_matmul_program, _negated_matmul_sgraph),
    "reductions of every dim by one block walking the rows": (lambda: _nested_reductions_program(columns=True),
                                                               _whole_reductions_sgraph),
    "nested reductions in the other order": (_nested_reductions_program, _nested_reductions_sgraph),
    "reductions of sums and differences, exp of a sum": (_reduced_combinations_program,
                                                         _reduced_combinations_sgraph),
    "reductions of rows scaled by a row scale": (_reduced_row_scales_program, _reduced_row_scales_sgraph),
    "a swapped difference and a scale on the other operand": (_swapped_difference_program,
                                                               _swapped_difference_sgraph),
    "elementwise ops of transposed operands, the kernel's output transposed": (_transposed_program,
                                                                              _transposed_sgraph),
    "sums and differences regrouped": (_regrouped_sums_program, _regrouped_sums_sgraph),
    **{f"a {op} of a product's {where} as a product with an operand's {where} reduced first": (
        functools.partial(_reduced_product_program, op, dim), functools.partial(_reduced_operand_sgraph, op=op, dim=dim))
        for op in ("sum", "mean") for dim, where in ((-1, "columns"), (-2, "rows"))},
    "a row mean of values plus a constant and a row bias, the mean taken first": (_biased_mean_program,
                                                                                   _biased_mean_sgraph),
    "row sums of negated values, negated after or before the loop": (
        lambda: _negated_rows_program("sum"), lambda p: _negated_rows_sgraph(p, "sum")),
    "row means of negated values, negated after or before the loop": (
        lambda: _negated_rows_program("mean"), lambda p: _negated_rows_sgraph(p, "mean")),
}


@pytest.mark.parametrize("what", list(TARGETED))
def test_targeted_schedule_is_proved(what):
    make_program, make_sgraph = TARGETED[what]
    p = make_program()
    v = verify(p, make_sgraph(p))
    assert v.proved, v.layers


def test_a_transposed_value_is_not_proved_equal_to_the_value():
    """The transpose rules move a transpose outward, never drop it: exp(X) of a square X and the
    transpose of a kernel's exp(X) have one shape, and the e-graph still tells them apart."""
    p = Program("square")
    p.output(p.op("exp", p.input("X", (4, 4), "f32"), name="O"))
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    k.output(k.acc(k.op("exp", k.input("X", [0], None))), "E", [0])
    b.library("transpose", "E", out="O", perm=[1, 0])
    rhs, axes = lower_sgraph(b.build(["O"]), p)
    assert not prove(list(zip(lower_program(p), rhs, strict=True)), axes).proved


def test_every_rule_is_exercised_by_a_proof():
    """Each rule is needed by some proof: of a workload's reference, a targeted schedule, or a
    schedule of the proof corpus that the e-graph proves."""
    fired: set[str] = set()
    cases = [workloads.reference_for(n) for n in NAMES]
    cases += [(p, make(p)) for p, make in ((mp(), ms) for mp, ms in TARGETED.values())]
    for program, sg in cases:
        rhs, axes = lower_sgraph(sg, program)
        res = prove(list(zip(lower_program(program), rhs, strict=False)), axes)
        assert res.proved, program.name
        fired |= {name for name, n in res.rule_matches.items() if n}
    for case in CORRECT.values():
        res = egraph_proof(*case.build())
        fired |= {name for name, n in res.rule_matches.items() if n and res.proved}
    assert {r.name for r in RULES} - fired == set()


# -- the mutation suite ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_mutants_are_never_proved(name, h100):
    program, ref = workloads.reference_for(f"{name}:ci")
    inputs = random_inputs(program, 11)
    want = evaluate(program, inputs)[0]
    lhs = lower_program(program)
    variants = mutants(ref, program)
    assert len(variants) >= 20
    wrong = ff_rejected = 0
    for what, m in variants:
        checks = pick_for_checks(m, h100, 2)
        if not checks:
            continue
        if all(max_rel_err(run_float(instantiate(m, v, h100), inputs)[0], want) <= 0.05 for v in checks):
            continue  # not shown wrong (e.g. equivalent with a loop of size 1)
        wrong += 1
        rhs, axes = lower_sgraph(m, program)
        assert not prove(list(zip(lhs, rhs, strict=False)), axes).proved, what
        ff = [finite_field.check(program, instantiate(m, v, h100), trials=1, seed=3) for v in checks]
        ff_rejected += not all(c.passed for c in ff)
    assert wrong >= 20
    assert ff_rejected >= 0.99 * wrong, (ff_rejected, wrong)


@pytest.mark.parametrize(("make", "kinds"), [
    (projections, ["graph"]),  # one grid axis splits the columns of Wq, Wk and Wv side by side
    (grouped_projections, ["graph"]),  # the same over weights of different widths
    (softmax_of_transposed, ["graph", "library"]),  # the softmax over columns of X W, then a view
    (norm_then_softmax, ["graph"]),  # one block: no dim is left to split
], ids=["side by side", "side by side, grouped", "transposed dim", "one block"])
def test_searched_kernels_are_proved_and_their_mutants_never(h100, make, kinds):
    """Kernels of the search's newer shapes: proved, and each of their mutants that computes some
    output wrong (a map moved, a replica for a split, an accumulator swapped, a reduction dim
    changed...) is refused by the e-graph and by finite fields."""
    p = make()
    sg = candidate(p, kinds)
    assert verify(p, sg, target=h100).proved
    inputs = random_inputs(p, 11)
    want = evaluate(p, inputs)
    lhs = lower_program(p)
    wrong = ff_rejected = 0
    for what, m in mutants(sg, p):
        checks = pick_for_checks(m, h100, 2)
        if not checks or all(max_rel_err(got, exp) <= 0.05 for v in checks
                             for got, exp in zip(run_float(instantiate(m, v, h100), inputs), want, strict=True)):
            continue
        wrong += 1
        rhs, axes = lower_sgraph(m, p)
        assert not prove(list(zip(lhs, rhs, strict=True)), axes).proved, what
        ff_rejected += not all(finite_field.check(p, instantiate(m, v, h100), trials=1, seed=3).passed for v in checks)
    assert wrong >= 10 and ff_rejected == wrong, (wrong, ff_rejected)


@pytest.mark.parametrize("perm", ["1,0", "0,2,1", "2,0,1", "1,2,0", "3,1,0,2", "0,1,3,2"])
def test_permutation_rules_hold_on_random_instances(perm):
    """The rules made per permutation (`permutation_rules`): a reduction or broadcast over each
    dim of the transposed tensor, the inverse undone (across an elementwise op too), B^T A^T, on tensors
    whose dims all differ in size."""
    rules = permutation_rules(perm)
    swaps_last_two = perm in ("1,0", "0,2,1", "0,1,3,2")
    assert len(rules) == 4 * len(perm.split(",")) + 1 + 2 * len(t.ELEMENTWISE_BINARY) + swaps_last_two
    for rule in rules:
        for seed in range(4):
            assert agree(rule.lhs, rule.rhs, rule.example(np.random.default_rng(seed)), []), (rule.name, seed)


def test_a_rule_with_the_dim_a_permutation_does_not_send_is_refuted():
    """The checker tells the right dim from another: over A^T's rows is over A's columns."""
    x = np.random.default_rng(0).standard_normal((3, 5))
    a = t.Var("A")
    n, m = t.ExtVar("n"), t.ExtVar("m")
    right = (t.reduce("sum", t.transpose(a, "1,0"), -1, n), t.transpose(t.reduce("sum", a, -2, n), "1,0"))
    wrong = (t.reduce("sum", t.transpose(a, "1,0"), -1, n), t.transpose(t.reduce("sum", a, -1, m), "1,0"))
    sizes = {"n": 3, "m": 5}
    assert agree(*right, Bindings(tensors={"A": x}, extents=sizes), [])
    assert not agree(*wrong, Bindings(tensors={"A": x}, extents=sizes), [])


def test_verify_refuses_a_wrong_sgraph_with_the_refuting_layer():
    program, ref = workloads.reference_for("rmsnorm_matmul:ci")
    data = ref.to_json()
    data["kernels"][0]["accumulators"][1]["kind"] = "sum"  # sum of tile means where a mean belongs
    v = verify(program, SGraph.from_json(data))
    assert not v.proved and v.layers[0]["layer"] == "finite_field" and not v.layers[0]["passed"]
    assert v.egraph == "not run"


def test_a_program_undefined_at_negative_inputs_is_checked_at_positive_ones(h100):
    """The square root of an input is NaN at half of the signed random inputs, and a NaN
    reference matches nothing: its unfused baseline was refuted by the float layer, so a search
    had nothing to return. The float layer takes the inputs' absolute values (still random, never
    zero) where the reference is not finite, and the baseline and fused schedules are proved;
    a program defined everywhere keeps its signed inputs."""
    from superopt.reference import inputs_and_reference

    p = Program("rooted")
    x, v = p.input("X", (64, 256), "f16"), p.input("V", (256, 32), "f16")
    p.output(p.sqrt(x) @ v)
    signed = random_inputs(p, 5)
    inputs, refs = inputs_and_reference(p, 5)
    assert (signed["X"] < 0).any() and not np.isfinite(evaluate(p, signed)[0]).all()
    assert all((inputs[k] == np.abs(signed[k])).all() for k in signed) and np.isfinite(refs[0]).all()
    assert verify(p, unfused_baseline(p), target=h100).proved
    outcome = run_search(p, h100, SearchConfig(max_kernel_ops=2))
    assert outcome.best.verdict.proved and not outcome.best.sgraph.name.endswith(".unfused")
    program = workloads.resolve("rmsnorm_matmul:ci")
    kept, _ = inputs_and_reference(program, 5)
    assert all((kept[k] == random_inputs(program, 5)[k]).all() for k in kept)


def test_a_program_that_overflows_its_dtype_at_signed_inputs_is_checked_at_positive_ones(tmp_path, monkeypatch):
    """exp(((X + 1) / rowsum(X)) @ W): at some signed draws a row sum comes near zero and the
    output exceeds what f16 holds (the float64 reference holds it; no f16 computation can, the
    unfused program's included). Whether a correct schedule passed the float layer then depended
    on the seed its check drew: the fused one-kernel schedule, proved at small shapes, was refuted
    at the real ones (a fourth check, another seed) and optimize returned the unfused baseline.
    Such draws are taken positive, as for a NaN reference; the others keep their signs."""
    from superopt.api import optimize
    from superopt.reference import inputs_and_reference

    p = Program("overflowing")
    x, w = p.input("X", (4, 8), "f16"), p.input("W", (8, 6), "f16")
    p.output(p.exp(p.div(x + 1.0, p.sum(x, -1, keepdim=True)) @ w))
    f16_max = 65504.0
    overflowing = [s for s in range(100, 110) if not np.abs(evaluate(p, random_inputs(p, s))[0]).max() <= f16_max]
    assert 0 < len(overflowing) < 10
    for seed in range(100, 110):
        signed = random_inputs(p, seed)
        inputs, refs = inputs_and_reference(p, seed)
        expected = {k: np.abs(a) for k, a in signed.items()} if seed in overflowing else signed
        assert all((inputs[k] == expected[k]).all() for k in signed) and np.abs(refs[0]).max() <= f16_max
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))  # where the search keeps its sGraphs
    best = optimize(p, target="h100", cache=False, reuse=False).report()["best"]
    assert best["kernels"] == 1 and best["verdict"]["egraph"] == "proved", best["kernels"]
    assert best["verdict"]["float_max_rel_err"] <= best["verdict"]["float_tolerance"]


def test_the_float_tolerance_allows_the_programs_own_rounding(tmp_path, monkeypatch):
    """silu(exp(X·rowsum(X) - rowsum(X)) @ W) and its row sum in bf16: run op by op in bf16 (what
    a framework computes) the program itself misses bf16's bound (0.041 against 0.04), so its
    unfused baseline was refuted and optimize had no answer. A schedule is held to the dtype's
    bound or to twice the program's own op-by-op error, whichever is larger."""
    from superopt.api import optimize

    p = Program("touchy")
    x = p.input("X", (2, 16), "bf16")
    m = p.exp(x * p.sum(x, -1, keepdim=True) - p.sum(x, -1, keepdim=True)) @ p.input("W", (16, 8), "bf16")
    o = p.op("silu", m)
    p.output(o, p.sum(o, -1, keepdim=True))
    v = verify(p, unfused_baseline(p))
    assert v.proved and 0.04 < v.float_max_rel_err <= v.float_tolerance == pytest.approx(2 * v.float_max_rel_err)
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    best = optimize(p, target="h100", cache=False, reuse=False).report()["best"]
    assert best["verdict"]["proved"] and best["kernels"] < len(unfused_baseline(p).kernels)


def test_a_program_defined_only_at_negative_inputs_is_checked_at_them(tmp_path, monkeypatch):
    """sqrt(-X @ W) is undefined at positive inputs too: each input gets one sign, patterns
    tried in order, until the reference is defined (X and W of opposite signs). It was refuted with
    its baseline, and optimize said only that not even the baseline could be verified. A program
    defined nowhere, or beyond its dtype at the first float check's inputs whatever their signs,
    is refused before any search, naming the first node that is not finite in its dtype."""
    from superopt.api import NoCandidate, optimize
    from superopt.reference import inputs_and_reference

    p = Program("rooted_negation")
    x, w = p.input("X", (4, 16), "f16"), p.input("W", (16, 8), "f16")
    p.output(p.sqrt(p.neg(x) @ w))
    inputs, refs = inputs_and_reference(p, 3)
    signed = random_inputs(p, 3)
    signs = {k: np.sign(inputs[k]) for k in signed}
    assert all((np.abs(inputs[k]) == np.abs(signed[k])).all() and len(np.unique(signs[k])) == 1 for k in signed)
    assert signs["X"][0, 0] != signs["W"][0, 0] and np.isfinite(refs[0]).all()  # -X @ W >= 0: opposite signs
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    best = optimize(p, target="h100", cache=False, reuse=False).report()["best"]
    assert best["kernels"] == 1 and best["verdict"]["egraph"] == "proved"
    nowhere = Program("nowhere")
    y = nowhere.input("Y", (4, 16), "f16")
    nowhere.output(nowhere.sqrt(nowhere.neg(y * y)))
    with pytest.raises(NoCandidate, match=r"nowhere: node 'sqrt_3' \(sqrt\) is not finite in f16 at random inputs"):
        optimize(nowhere, target="h100", cache=False, reuse=False)
    hot = Program("hot")  # exp(X⁴) beyond f16 at the first float check's inputs, of either sign
    z = hot.input("Z", (2, 16), "f16")
    hot.output(hot.exp(hot.square(z * z)) @ hot.input("W", (16, 8), "f16"))
    with pytest.raises(NoCandidate, match=r"hot: node 'exp_3' \(exp\) is not finite in f16"):
        optimize(hot, target="h100", cache=False, reuse=False)


def test_a_program_defined_only_beyond_an_offset_is_checked_there(tmp_path, monkeypatch):
    """sqrt(X - 1) is undefined wherever an input lies below 1, whatever its sign: it was refused
    before any search. Where no sign pattern defines a program, the magnitudes are raised by an
    offset in turn (`OFFSETS`); the inputs are then at least 1, still random, and the schedule is
    proved and checked against the float64 reference there."""
    from superopt.api import optimize
    from superopt.reference import OFFSETS, inputs_and_reference

    p = Program("shifted_root")
    x = p.input("X", (8, 16), "f32")
    p.output(p.sqrt(p.op("mul", x - 1.0, 0.5)))
    assert undefined_node(p) is None
    inputs, refs = inputs_and_reference(p, 3)
    raised = np.abs(random_inputs(p, 3)["X"]) + OFFSETS[1]
    assert np.array_equal(inputs["X"], raised.astype(np.float32)) and np.isfinite(refs[0]).all()
    monkeypatch.setenv("SUPEROPT_CACHE_DIR", str(tmp_path))
    best = optimize(p, target="h100", cache=False, reuse=False).report()["best"]
    assert best["kernels"] == 1 and best["verdict"]["proved"]


# -- constraints ---------------------------------------------------------------------------------------


def test_z3_and_backtracking_enumerations_agree(h100):
    _, ref = workloads.reference_for("lora:ci")
    key = lambda v: tuple(sorted(v.items()))
    assert sorted(map(key, constraints.assignments(ref, h100))) == sorted(map(key, enumerate_assignments(ref, h100)))


def test_satisfiability(h100):
    _, ref = workloads.reference_for("gqa")
    ok, model = constraints.satisfiable(ref, h100)
    assert ok and model is not None
    instantiate(ref, model, h100)
    tiny = h100.calibrated()
    from dataclasses import replace
    no_smem = replace(tiny, smem_per_block=16)
    assert constraints.satisfiable(ref, no_smem) == (False, None)


# -- the pruning oracle --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_oracle_keeps_every_prefix_of_the_reference(name):
    program, ref = workloads.reference_for(name)
    oracle = Oracle(program)
    missing = [(k, tid) for k, tid, e in abstract_sgraph(ref, program) if not oracle.contains(e)]
    assert missing == []


def test_oracle_prunes_foreign_expressions():
    program = workloads.resolve("gated_mlp")
    assert input_classes(program) == {"X": (0, 1), "W1": (1, 2), "W2": (1, 2)}
    oracle = Oracle(program)
    x, w1, w2 = ("inp", "X"), ("inp", "W1"), ("inp", "W2")
    k = 1  # the contraction dim class shared by X's columns and the weights' rows
    assert oracle.contains(mk("sum", k, mk("mul", x, w1)))
    assert oracle.equivalent(mk("mul", mk("sum", k, mk("mul", x, w2)), mk("silu", mk("sum", k, mk("mul", x, w1)))), 0)
    # silu stays whole (`OPAQUE`): its definition's parts are no values a block graph computes
    assert not oracle.contains(mk("exp", mk("neg", mk("sum", k, mk("mul", x, w1)))))
    assert not oracle.contains(mk("mul", mk("sum", k, mk("mul", x, w2)), mk("sum", k, mk("mul", x, w1))))
    assert not oracle.contains(mk("sum", k, mk("mul", w1, w2)))
    assert not oracle.contains(mk("exp", x))
    assert not oracle.contains(mk("sum", k, mk("mul", x, x)))
    assert not oracle.contains(mk("sum", 0, mk("mul", x, w1)))  # the right product, summed over the wrong dim


def test_oracle_lookup_finds_every_term_the_saturated_egraph_holds():
    """The hash-cons read back from egglog: a term built from any e-node (children by any member
    of their class) is found in that node's class, and the axioms' variants of the target are
    equivalent to it; changing one leaf makes the term unknown."""
    program = workloads.resolve("rmsnorm_matmul:ci")
    oracle = Oracle(program)
    target = abstract_program(program)[program.outputs[0]][0]
    terms = {}  # one member term per e-class, built bottom-up from the e-nodes
    nodes = oracle._nodes
    for _ in range(len(nodes)):
        for key, cls in nodes.items():
            if cls in terms:
                continue
            op, *args = key
            if op in ("inp", "c", "k"):
                terms[cls] = key
            elif op in ("sum", "max") and args[0] in terms:
                terms[cls] = (op, args[1], terms[args[0]])
            elif op not in ("sum", "max") and all(a in terms for a in args):
                terms[cls] = (op, *(terms[a] for a in args))
    assert len(terms) == len(set(nodes.values())) >= 10
    for cls, term in terms.items():
        assert oracle.class_of(term) == cls and oracle.contains(term)
    x, w = ("inp", "X"), ("inp", "W")
    ms = mk("add", mk("sum", 1, mk("mul", x, x)), C)
    assert oracle.equivalent(target, 0)
    assert oracle.equivalent(mk("div", mk("sum", 1, mk("mul", w, x)), mk("sqrt", ms)), 0)  # commuted
    assert oracle.equivalent(mk("sum", 1, mk("div", mk("mul", x, w), mk("sqrt", ms))), 0)  # / moved into the sum
    assert not oracle.contains(mk("div", mk("sum", 1, mk("mul", w, w)), mk("sqrt", ms)))


def test_constant_factors_are_leaves_the_oracle_places():
    """Attention's 1/sqrt(d) scaling is a factor of its own, not absorbed: the oracle admits it
    where the target's equivalent forms carry it (the normalized query, or the query itself, since
    (Q c) / |Q| = (Q / |Q|) c), never on the values."""
    program = workloads.resolve("qknorm_gqa:ci")
    assert constants_of(program) == frozenset({0.25})
    oracle = Oracle(program)
    alg = oracle.alg
    q, k, v = ("inp", "Q"), ("inp", "K"), ("inp", "V")
    factor = alg.const(0.25)[0]
    assert factor == ("k", "0.25") and alg.const(1e-6)[0] == C
    norm_q = abstract_program(program)["rms_norm_1"][0]
    assert oracle.contains(mk("mul", norm_q, factor))
    assert oracle.contains(mk("mul", q, factor))
    assert not oracle.contains(mk("mul", v, factor))
    assert not oracle.contains(mk("mul", mk("mul", norm_q, factor), factor))  # applied once
    assert oracle.contains(v) and oracle.contains(k)


def test_verify_command_line(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["verify", "lora:ci", "reference"])
    assert res.exit_code == 0 and "PROVED" in res.stdout
    _, ref = workloads.reference_for("lora:ci")
    data = ref.to_json()
    data["kernels"][1]["body"][2]["op"] = "sub"
    f = tmp_path / "wrong.json"
    f.write_text(json.dumps(data))
    res = runner.invoke(app, ["verify", "lora:ci", str(f), "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["proved"] is False


def test_targets_are_known():
    assert set(TARGETS) == {"h100", "h200", "a100"}


def _class_of(oracle, values, name: str) -> str:
    cls = oracle.class_of(values[name][0])
    assert cls is not None
    return cls


def test_reach_holds_what_a_kernel_can_compute_from_what_it_reads():
    """Attention: from Q and K a kernel can compute exp(Q K), spanning batch, query and key dims;
    the output needs V too, and from Q and V alone it is out of reach. A sum over a computed
    X + Y lands where the builder's simplification puts it (sum X + sum Y), though no e-node
    sums X + Y, spanning the dims of X + Y but the one it reduces."""
    program = workloads.resolve("gqa:ci")
    oracle = Oracle(program)
    values = abstract_program(program)
    q, k, v = (_class_of(oracle, values, n) for n in ("Q", "K", "V"))
    dims = {n: frozenset(values[n][1]) - {-1} for n in ("Q", "K", "V")}
    out = oracle.output_class(0)
    both = oracle.reach.of({q: dims["Q"], k: dims["K"]})
    e = next(n.id for n in program.topological() if n.op == "exp")
    assert both[_class_of(oracle, values, e)] == frozenset(values[e][1]) - {-1} and len(both[_class_of(
        oracle, values, e)]) == 3
    assert out not in both and out not in oracle.reach.of({q: dims["Q"], v: dims["V"]})
    assert out in oracle.reach.of({q: dims["Q"], k: dims["K"], v: dims["V"]})

    p = Program("sums")
    x, y = p.input("X", (4, 8)), p.input("Y", (4, 8))
    p.output(p.op("add", x, y, name="S"), p.op("add", p.sum(x, -1), p.sum(y, -1), name="T"))
    oracle, values = Oracle(p), abstract_program(p)
    s, t_ = _class_of(oracle, values, "S"), _class_of(oracle, values, "T")
    assert not any(key[0] == "sum" and key[1] == s for key in oracle._nodes)  # no e-node sums X + Y
    reach = oracle.reach.of({s: frozenset(values["S"][1])})
    assert reach[t_] == frozenset(values["T"][1]) and len(values["S"][1]) == 2 and len(reach[t_]) == 1
    assert t_ not in oracle.reach.of({_class_of(oracle, values, "X"): frozenset(values["X"][1])})


def _attention_with_k(kind: str) -> Program:
    """Unscaled attention logits Q @ K^T (no max subtracted), K given transposed, stored as
    frameworks keep it, or projected from X first."""
    p = Program(f"attention_{kind}")
    q, v = p.input("Q", (2, 256, 64), "f16"), p.input("V", (2, 4096, 64), "f16")
    if kind == "given":
        kt = p.input("K", (2, 64, 4096), "f16")
    elif kind == "stored":
        kt = p.transpose(p.input("K", (2, 4096, 64), "f16"), (0, 2, 1))
    else:
        k = p.input("X", (2, 4096, 64), "f16") @ p.input("WK", (2, 64, 64), "f16")
        kt = p.transpose(k, (0, 2, 1))
    e = p.exp(q @ kt)
    p.output(p.matmul(e / p.sum(e, -1, keepdim=True), v))
    return p


@pytest.mark.parametrize("kind", ["given", "stored", "projected"])
def test_check_inputs_keep_attention_logits_inside_f16(kind):
    """The float layer's inputs scale whatever feeds a product's right operand, however it is
    laid out or computed, by 1/sqrt(contraction): exp of the logits stays finite in f16, so the
    program (and its unfused baseline) can be checked at all. K stored or projected got unscaled
    inputs, exp overflowed, and no schedule, the baseline included, passed (NoCandidate)."""
    p = _attention_with_k(kind)
    assert undefined_node(p) is None
    assert verify(p, unfused_baseline(p)).proved


@pytest.mark.parametrize("name", ["rmsnorm_mlp:ci", "gqa:ci", "qknorm_gqa:ci"])
def test_check_inputs_are_float32_and_the_reference_is_float64_all_the_same(name):
    """The float layer's inputs are held as float32 (half the memory at real shapes), which holds
    every value of their dtypes; the float64 reference computes on them in float64, to the last
    bit what it computes on float64 copies, and never copies them to do so."""
    from superopt.reference import FloatAlgebra

    program = workloads.resolve(name)
    inputs = random_inputs(program, 3)
    assert all(x.dtype == np.float32 and np.all(x != 0) for x in inputs.values())
    wide = {k: x.astype(np.float64) for k, x in inputs.items()}
    for got, want in zip(evaluate(program, inputs), evaluate(program, wide), strict=True):
        assert got.dtype == np.float64 and np.array_equal(got, want)
    some = next(iter(inputs.values()))
    assert FloatAlgebra().cast(some) is some


def test_the_kept_e_graph_is_made_anew_after_so_many_proofs(monkeypatch):
    """Proofs run on a kept e-graph, between a push and a pop; egglog leaves something behind at
    each (150 proofs grew a process by 15 MiB and every proof slower), so after `KEPT_PROOFS`
    proofs it is replaced, and the one before is freed at once, on its own thread."""
    import sys
    import threading
    import weakref

    from superopt.verifier import egraph
    from superopt.verifier.terms import binary, inp

    monkeypatch.setattr(egraph, "KEPT_PROOFS", 2)
    raised: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(repr(u.exc_value)))
    kept: list[weakref.ref] = []
    x_y, y_x = binary("add", inp("X"), inp("Y")), binary("add", inp("Y"), inp("X"))

    def prove_five() -> None:
        for _ in range(5):
            assert egraph.prove([(x_y, y_x)], []).proved
            kept.append(weakref.ref(egraph._kept.prover))
        assert [r() is None for r in kept] == [True, True, True, True, False]

    worker = threading.Thread(target=prove_five)
    worker.start()
    worker.join()
    assert len(kept) == 5 and kept[-1]() is None and raised == []


def test_e_graphs_made_on_one_thread_are_not_left_for_another_to_drop(monkeypatch):
    """egglog's engine may only be dropped by the thread that made it, and its Python state sits in
    reference cycles; a proof or an oracle built on a worker thread and collected on another (a
    job's heartbeat, a service's request thread) raised in the collector and leaked the engine.
    Each e-graph's engine is dropped where it was made (`egraph.dropped_here`)."""
    import gc
    import sys
    import threading

    from superopt.verifier.egraph import prove
    from superopt.verifier.oracle import Oracle
    from superopt.verifier.terms import inp

    raised: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(repr(u.exc_value)))
    gc.collect()
    gc.disable()
    try:
        worker = threading.Thread(target=lambda: (prove([(inp("X"), inp("X"))], []),
                                                  Oracle(workloads.resolve("lora:ci"))))
        worker.start()
        worker.join()
        assert gc.collect() > 0  # the cycles are collected here, on the main thread
    finally:
        gc.enable()
    assert raised == []


def test_identical_terms_are_proved_without_an_e_graph():
    """The unfused baseline lowers to the program's own terms: proved at once, no e-graph made
    (on a fresh thread, none is kept afterwards). Terms that differ still go to the e-graph."""
    import threading

    from superopt.verifier import egraph
    from superopt.verifier.terms import binary, inp

    program = workloads.resolve("rmsnorm_matmul:ci")
    lhs, (rhs, axes) = lower_program(program), lower_sgraph(unfused_baseline(program), program)
    seen: dict[str, object] = {}

    def prove_on_a_fresh_thread() -> None:
        seen["same"] = egraph.prove(list(zip(lhs, rhs, strict=True)), axes)
        seen["kept"] = getattr(egraph._kept, "prover", None)
        seen["swapped"] = egraph.prove([(binary("add", inp("X"), inp("Y")), binary("add", inp("Y"), inp("X")))], [])

    worker = threading.Thread(target=prove_on_a_fresh_thread)
    worker.start()
    worker.join()
    same, swapped = seen["same"], seen["swapped"]
    assert same.proved and (same.iterations, same.enodes) == (0, 0) and seen["kept"] is None
    assert swapped.proved and swapped.iterations >= 1 and swapped.enodes > 0


def test_a_chain_deeper_than_the_round_limit_is_proved_and_its_mutants_are_not(h100):
    """A rule rewrites what the e-graph held when its round began, so moving a tile map through
    a chain takes a round per op: 20 steps of sigmoid(x * 1.1 + 0.1) (60 ops) took more rounds
    than `Limits().iterations`, and the fused kernel was returned unfused ("iteration limit").
    The rounds now grow with the deepest side; the chain's wrong variants are still refused."""
    p = Program("chain20")
    x = p.input("A", (8, 16), "f32")
    for _ in range(20):
        x = p.sigmoid(x * 1.1 + 0.1)
    p.output(x)
    out = run_search(p, h100, SearchConfig(), budget_s=60)
    sg = out.best.sgraph
    assert len(sg.kernels) == 1 and out.best.verdict.proved
    assert out.best.verdict.egraph_stats["iterations"] > Limits().iterations
    lhs = lower_program(p)
    inputs = random_inputs(p, 5)
    want = evaluate(p, inputs)[0]
    wrong = 0
    for what, m in mutants(sg, p):
        checks = pick_for_checks(m, h100, 2)
        if not checks or all(max_rel_err(run_float(instantiate(m, v, h100), inputs)[0], want) <= 1e-3 for v in checks):
            continue
        wrong += 1
        rhs, axes = lower_sgraph(m, p)
        assert not prove(list(zip(lhs, rhs, strict=True)), axes).proved, what
    assert wrong >= 5, wrong


def test_a_candidate_the_egraph_stops_short_on_is_not_called_refuted(h100):
    """The reason a search records for a candidate it did not prove: a numeric layer refutes; the
    e-graph only stops (here at a limit of 0 nodes), which is no evidence against it."""
    program, ref = workloads.reference_for("rmsnorm_matmul:ci")
    stopped = verify(program, ref, target=h100, limits=Limits(nodes=0))
    assert not stopped.proved and _why(stopped) == "egraph did not prove it (node limit)"
    what, m = next((w, m) for w, m in mutants(ref, program) if not verify(program, m, target=h100).proved)
    assert _why(verify(program, m, target=h100)).endswith("refuted it"), what
