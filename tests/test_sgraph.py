"""sGraph IR and interpreter: references and baselines match the program, wrong maps show."""

from __future__ import annotations

import copy
import itertools
import json
from fractions import Fraction

import numpy as np
import pytest

from superopt import Program, workloads
from superopt.assignments import (
    assignment_table,
    candidates,
    enumerate_assignments,
    first_assignment,
    independent_groups,
)
from superopt.build import SGraphBuilder, unfused_baseline
from superopt.dtypes import dtype
from superopt.instantiate import InstantiationError, instantiate, parse_params
from superopt.interpreter import run, run_float
from superopt.mutations import mutants
from superopt.primitives import apply
from superopt.reference import evaluate, max_rel_err, random_inputs
from superopt.render import render_sgraph
from superopt.sgraph import LibraryKernel, SGraph, SGraphError, check_matches
from superopt.sizes import Size, SizeError, compile_ratio, compile_sizes
from superopt.verifier.finite_field import FieldAlgebra, random_field_inputs

NAMES = list(workloads.WORKLOADS)


def spread(assigns: list[dict[str, int]], k: int) -> list[dict[str, int]]:
    """k assignments spread over the list: the first, the last and evenly between."""
    if len(assigns) <= k:
        return assigns
    idx = sorted({round(i * (len(assigns) - 1) / (k - 1)) for i in range(k)})
    return [assigns[i] for i in idx]


def error_of(program: Program, sg: SGraph, values: dict[str, int], h100, seed: int) -> float:
    inputs = random_inputs(program, seed)
    ref = evaluate(program, inputs)
    outs = run_float(instantiate(sg, values, h100), inputs)
    return max(max_rel_err(o, r) for o, r in zip(outs, ref, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_program_at_several_instantiations(name, h100):
    program, ref = workloads.reference_for(f"{name}:ci")
    check_matches(ref, program)
    assigns = list(enumerate_assignments(ref, h100))
    chosen = spread(assigns, 4)
    assert len(chosen) >= 3 or name == "ntrans"
    tol = dtype(program.dtype).tolerance
    for i, values in enumerate(chosen):
        assert error_of(program, ref, values, h100, seed=100 + i) <= tol, values
    # At least one instantiation with a size that is not a power of two, where the shapes allow.
    odd = [v for v in assigns if any(x & (x - 1) for x in v.values())]
    if odd:
        assert error_of(program, ref, odd[len(odd) // 2], h100, seed=7) <= tol


def test_ntrans_reference_at_three_row_splits(h100):
    program, ref = workloads.reference_for("ntrans:ci")
    values = [v for v in enumerate_assignments(ref, h100)]
    assert [v["gx"] for v in values] == [1, 2, 3, 6]
    for v in values[1:]:
        assert error_of(program, ref, v, h100, seed=v["gx"]) <= dtype("f16").tolerance


SHAPES = {
    "rmsnorm_matmul": [{"n": 4, "d": 64, "e": 48}, {"n": 3, "d": 40, "e": 24}, {"n": 8, "d": 32, "e": 16}],
    "gated_mlp": [{"n": 4, "d": 64, "e": 48}, {"n": 3, "d": 40, "e": 24}, {"n": 8, "d": 32, "e": 16}],
    "rmsnorm_mlp": [{"n": 4, "d": 64, "e": 48}, {"n": 3, "d": 40, "e": 24}, {"n": 8, "d": 32, "e": 16}],
    "lora": [{"n": 4, "d": 32, "e": 48, "r": 8}, {"n": 2, "d": 24, "e": 40, "r": 4}, {"n": 6, "d": 16, "e": 16, "r": 2}],
    "gqa": [{"b": 2, "m": 8, "n": 64, "dh": 16}, {"b": 1, "m": 3, "n": 24, "dh": 8}, {"b": 3, "m": 4, "n": 32, "dh": 12}],
    "qknorm_gqa": [{"b": 2, "m": 8, "n": 64, "dh": 16, "qk_norm": True}, {"b": 1, "m": 3, "n": 24, "dh": 8, "qk_norm": True},
                   {"b": 3, "m": 4, "n": 32, "dh": 12, "qk_norm": True}],
    "ntrans": [{"n": 6, "d": 64}, {"n": 3, "d": 40}, {"n": 5, "d": 16}],
}


@pytest.mark.parametrize("name", NAMES)
def test_baseline_and_reference_match_at_three_shapes(name, h100):
    w = workloads.get(name)
    for i, sizes in enumerate(SHAPES[name]):
        program = w.build(**sizes)
        base = unfused_baseline(program)
        check_matches(base, program)
        assert base.symbols == frozenset()
        tol = dtype(program.dtype).tolerance
        assert error_of(program, base, {}, h100, seed=i) <= tol
        ref = w.reference(program)
        values = spread(list(enumerate_assignments(ref, h100)), 3)[-1]
        assert error_of(program, ref, values, h100, seed=10 + i) <= tol, (sizes, values)


@pytest.mark.parametrize("name", NAMES)
def test_json_round_trip_and_rendering(name):
    program, ref = workloads.reference_for(f"{name}:ci")
    for sg in (ref, unfused_baseline(program)):
        again = SGraph.loads(sg.dumps())
        assert again.to_json() == sg.to_json()
        assert again.info.shapes == sg.info.shapes
        text = render_sgraph(sg)
        assert sg.name in text and all(k.id in text for k in sg.kernels)


def test_symbolic_tile_shapes_and_constraints():
    _, ref = workloads.reference_for("rmsnorm_matmul")
    blk = ref.info.blocks["k0"]
    assert blk.shapes["W_t"] == (Size.parse("4096/F"), Size.parse("6144/gx"))
    assert blk.storage["b1"] is None  # matmul added straight into its accumulator
    exprs = {str(c.expr) for c in ref.info.constraints if c.kind == "divides"}
    assert exprs == {"4096/F", "6144/gx"}
    smem = next(c for c in ref.info.constraints if c.kind == "smem").expr
    # X tile (f16) + its squares (f32, read by a reduction) + W tile (f16) + the mean (f32)
    # + the two accumulators (f32) + sqrt of the mean (f32, broadcast by the division).
    x, sq, w, mean, acc, acc2, root = 2 * 64 * 2, 2 * 64 * 4, 64 * 64 * 2, 2 * 4, 2 * 64 * 4, 2 * 4, 2 * 4
    assert smem.evaluate({"gx": 96, "F": 64}) == x + sq + w + mean + acc + acc2 + root


# -- wrong variants -----------------------------------------------------------------------------


def _program_of(second: str) -> Program:
    """The program of the wrong variants: O = X @ W (`second` "W") or X * Y ("Y"), all (8, 8)."""
    op = "matmul" if second == "W" else "mul"
    p = Program("mm" if op == "matmul" else "mul")
    p.output(p.op(op, p.input("X", (8, 8), "f32"), p.input(second, (8, 8), "f32"), name="O"))
    return p


def _matmul_sgraph(x_map=(0, None), x_f=1, w_map=(None, 1), w_f=0, o_map=(0, 1), acc="sum", swap=False) -> SGraph:
    b = SGraphBuilder.for_program(_program_of("W"))
    k = b.graph(grid=[("x", 2), ("y", 2)], loop=("f", 2))
    xt, wt = k.input("X", x_map, x_f), k.input("W", w_map, w_f)
    k.output(k.acc(k.op("matmul", *((wt, xt) if swap else (xt, wt))), acc), "O", o_map)
    return b.build(["O"])


def _mul_sgraph(x_map=(0, 1), y_map=(0, 1), y_f=None, loop=1, o_map=(0, 1), acc="sum") -> SGraph:
    b = SGraphBuilder.for_program(_program_of("Y"))
    k = b.graph(grid=[("x", 2), ("y", 2)], loop=("f", loop))
    xt, yt = k.input("X", x_map, None), k.input("Y", y_map, y_f)
    k.output(k.acc(k.op("mul", xt, yt), acc), "O", o_map)
    return b.build(["O"])


WRONG = {
    "X imap on the wrong dim (cols), loop on rows": lambda: _matmul_sgraph(x_map=(1, None), x_f=0),
    "W split on the wrong dim by y": lambda: _matmul_sgraph(w_map=(None, 0), w_f=1),
    "W split by the wrong grid axis": lambda: _matmul_sgraph(w_map=(1, None)),
    "X split by the wrong grid axis": lambda: _matmul_sgraph(x_map=(None, 0)),
    "W tiled by the grid where the loop belongs": lambda: _matmul_sgraph(w_map=(0, 1), w_f=None),
    "omap transposed": lambda: _matmul_sgraph(o_map=(1, 0)),
    "mean accumulator where sum belongs": lambda: _matmul_sgraph(acc="mean"),
    "matmul operands swapped": lambda: _matmul_sgraph(swap=True),
    "elementwise: Y replicated by x (walked by the loop) instead of split": lambda: _mul_sgraph(y_map=(None, 1), y_f=0, loop=2),
    "elementwise: X imap transposed": lambda: _mul_sgraph(x_map=(1, 0)),
    "elementwise: omap transposed": lambda: _mul_sgraph(o_map=(1, 0)),
    "elementwise: sum over a loop that re-reads the same tile": lambda: _mul_sgraph(loop=2),
}


def test_correct_hand_written_variants_pass(h100):
    assert error_of(_program_of("W"), _matmul_sgraph(), {}, h100, seed=0) < 1e-6
    assert error_of(_program_of("Y"), _mul_sgraph(), {}, h100, seed=0) < 1e-6


@pytest.mark.parametrize("what", list(WRONG))
def test_wrong_variant_is_shown_wrong_by_the_interpreter(what, h100):
    sg = WRONG[what]()
    program = _program_of(sg.inputs[1].id)
    check_matches(sg, program)
    assert error_of(program, sg, {}, h100, seed=3) > 0.05


@pytest.mark.parametrize("name", NAMES)
def test_generated_mutants_of_references_are_shown_wrong(name, h100):
    """At least ten automatically generated variants of every reference fail in the interpreter."""
    program, ref = workloads.reference_for(f"{name}:ci")
    shown = 0
    for _, m in mutants(ref, program)[:24]:
        assigns = list(enumerate_assignments(m, h100))
        if assigns and max(error_of(program, m, v, h100, seed=5) for v in spread(assigns, 2)) > 0.05:
            shown += 1
    assert shown >= 10


# -- constraints --------------------------------------------------------------------------------


def test_instantiation_refuses_broken_constraints_by_name(h100):
    _, ref = workloads.reference_for("rmsnorm_matmul")
    with pytest.raises(InstantiationError, match=r"input 'W_t' \(W\) dim 1 \(6144\) must divide evenly by x \(gx\) \(it gives 6144/5\)"):
        instantiate(ref, {"gx": 5, "F": 64}, h100)
    with pytest.raises(InstantiationError, match=r"input 'X_t' .* dim 1 .* the loop f") as e:
        instantiate(ref, {"gx": 96, "F": 3}, h100)
    assert e.value.constraint is not None and e.value.constraint.kind == "divides"
    with pytest.raises(InstantiationError, match="6144 blocks exceed the cap of 4096"):
        instantiate(ref, {"gx": 6144, "F": 64}, h100)
    with pytest.raises(InstantiationError, match=r"shared memory \d+ bytes exceeds h100's 232448 bytes"):
        instantiate(ref, {"gx": 1, "F": 1}, h100)
    with pytest.raises(InstantiationError, match="no value for F"):
        instantiate(ref, {"gx": 96}, h100)
    with pytest.raises(InstantiationError, match="unknown parameter"):
        instantiate(ref, {"gx": 96, "F": 64, "gy": 2}, h100)
    with pytest.raises(InstantiationError, match="must be a positive integer"):
        instantiate(ref, {"gx": 96, "F": 0}, h100)
    with pytest.raises(InstantiationError, match="not an integer"):
        parse_params("gx=two")
    with pytest.raises(InstantiationError, match="parameter gx is given twice"):
        parse_params("gx=1,F=2,gx=2")  # took the last one silently


def test_candidates_are_divisors_of_what_the_symbol_splits():
    _, ref = workloads.reference_for("rmsnorm_matmul")
    c = candidates(ref)
    assert c["gx"] == [d for d in range(1, 6145) if 6144 % d == 0]
    assert c["F"] == [2**i for i in range(13)]


# -- malformed sGraphs --------------------------------------------------------------------------


def _ref_json() -> dict:
    return workloads.reference_for("rmsnorm_matmul:ci")[1].to_json()


def _edit(fn):
    d = copy.deepcopy(_ref_json())
    fn(d["kernels"][0])
    return d


MALFORMED = [
    (lambda k: k["post"][-1].update(inputs=["b1", "p8"]), "reads 'b1' from the loop body; it may only read accumulators or post-loop ops"),
    (lambda k: k["inputs"][0].update(imap=[0, 1]), "imap has 2 entries for 1 grid axes"),
    (lambda k: k["inputs"][1].update(imap=[2]), "out of range for rank 2"),
    (lambda k: k["outputs"][0].update(omap=[5]), "omap sends axis x to dim 5"),
    (lambda k: k["body"].append({"id": "zz", "op": "exp", "inputs": ["X_t"]}), "block tensor 'zz' is computed but never used"),
    (lambda k: k["body"][0].update(op="conv"), "'conv' is not a block-level op"),
    (lambda k: k["accumulators"][0].update(kind="max"), "unknown kind 'max'"),
    (lambda k: k.update(grid=[]), "the grid must have 1 to 3 axes"),
    (lambda k: k["loop"].update(name="x"), "axis names must be distinct"),
    (lambda k: k["body"][0].update(inputs=["W_t", "X_t"]), "matmul inner dimensions differ"),
    (lambda k: k["inputs"][0].update(tensor="Q"), "tensor 'Q' is not defined before this kernel"),
    (lambda k: k["grid"][0].update(size="gx+1"), "must be a positive product of symbols"),
]


def test_first_assignment_solves_independent_groups_alone(h100):
    """Split by constraint-connected groups, the first valid assignment is still the one the full
    enumeration meets first; a group that nothing satisfies means no assignment at all."""
    from dataclasses import replace

    for name in workloads.WORKLOADS:
        for spec in (name, f"{name}:ci"):
            _, sg = workloads.reference_for(spec)
            assert first_assignment(sg, h100) == next(enumerate_assignments(sg, h100, limit=1), None), spec
    _, gqa = workloads.reference_for("gqa")
    groups = independent_groups(gqa)
    assert frozenset().union(*groups) == gqa.symbols and sum(map(len, groups)) == len(gqa.symbols)
    for c in gqa.info.constraints:
        assert sum(1 for g in groups if c.expr.symbols & g) <= 1  # no constraint spans two groups
    assert first_assignment(gqa, replace(h100, max_blocks=0)) is None


@pytest.mark.parametrize("mutate,message", MALFORMED)
def test_malformed_sgraph_is_rejected_with_named_problem(mutate, message):
    with pytest.raises(SGraphError, match="kernel k0") as e:
        SGraph.from_json(_edit(mutate))
    assert message in str(e.value)


FIELD_TYPES = [
    (lambda k: k.update(kind=["graph"]), "kernels[0]: unknown kernel kind ['graph'] (expected 'library' or 'graph')"),
    (lambda k: k.pop("kind"), "kernels[0]: missing field 'kind'"),
    (lambda k: k.update(body=5), "kernels[0].body: input should be a valid list, got 5"),
    (lambda k: k["body"][0].update(op=["matmul"]), "kernels[0].body[0].op: input should be a valid string, got ['matmul']"),
    (lambda k: k["body"][0].update(op=""), "kernels[0].body[0].op: string should have at least 1 character, got ''"),
    (lambda k: k["body"][0].update(attrs=[1]), "kernels[0].body[0].attrs: input should be an object, got [1]"),
    (lambda k: k["inputs"][1].update(imap="a"), "kernels[0].inputs[1].imap: input should be a valid list, got 'a'"),
    (lambda k: k["inputs"][0].update(fmap=True), "kernels[0].inputs[0].fmap: input should be a valid integer, got True"),
    (lambda k: k["inputs"][0].update(tensor=["X"]), "kernels[0].inputs[0].tensor: input should be a valid string, got ['X']"),
    (lambda k: k["outputs"][0].update(omap=["x"]), "kernels[0].outputs[0].omap[0]: input should be a valid integer, got 'x'"),
    (lambda k: k["accumulators"][0].update(dim="x"), "kernels[0].accumulators[0].dim: input should be a valid integer, got 'x'"),
    (lambda k: k["grid"][0].update(size=2.5), "kernels[0].grid[0].size: input should be a size (an integer or a symbol expression), got 2.5"),
    (lambda k: k.update(loop=None), "kernels[0].loop: input should be an object, got None"),
    (lambda k: k["loop"].pop("size"), "kernels[0].loop: missing field 'size'"),
]


@pytest.mark.parametrize("mutate,message", FIELD_TYPES)
def test_a_field_of_the_wrong_type_is_named_with_its_place(mutate, message):
    with pytest.raises(SGraphError) as e:
        SGraph.from_json(_edit(mutate))
    assert str(e.value) == message


UNKNOWN_FIELDS = [
    (lambda d: d["kernels"][0].update(bogus_field=1), "kernels[0]: unexpected field 'bogus_field'"),
    (lambda d: d["inputs"][0].update(typo_dtpye="f16"), "inputs[0]: unexpected field 'typo_dtpye'"),
    (lambda d: d["kernels"][0]["body"][0].update(note="x"), "kernels[0].body[0]: unexpected field 'note'"),
    (lambda d: d["kernels"][0]["loop"].update(step=1), "kernels[0].loop: unexpected field 'step'"),
    (lambda d: d["kernels"][0]["accumulators"][0].update(init=0), "kernels[0].accumulators[0]: unexpected field 'init'"),
    (lambda d: d["kernels"].append({"kind": "library", "id": "k1", "op": "exp", "inputs": ["O"], "output": "E", "grid": []}),
     "kernels[1]: unexpected field 'grid'"),  # a library kernel has no grid
    (lambda d: d.update(notes="x"), "sGraph: unexpected field 'notes'"),
]


@pytest.mark.parametrize("mutate,message", UNKNOWN_FIELDS)
def test_an_unknown_field_is_refused_with_its_place(mutate, message):
    """A misspelt field is an error, not a field left out (its default read instead)."""
    d = copy.deepcopy(_ref_json())
    mutate(d)
    with pytest.raises(SGraphError) as e:
        SGraph.from_json(d)
    assert str(e.value) == message


def test_sgraph_top_level_fields_are_checked():
    for change, message in (({"name": 5}, "name: input should be a valid string, got 5"),
                            ({"outputs": {"O": 1}}, "outputs: input should be a valid list, got {'O': 1}"),
                            ({"kernels": 5}, "kernels: input should be a valid list, got 5"),
                            ({"kernels": [None]}, "kernels[0]: input should be an object, got None")):
        with pytest.raises(SGraphError) as e:
            SGraph.from_json({**_ref_json(), **change})
        assert str(e.value) == message
    with pytest.raises(SGraphError, match="sGraph JSON must be an object"):
        SGraph.from_json([])


def test_sgraph_schema_and_program_pairing():
    d = _ref_json()
    d["schema"] = "superopt.sgraph/7"
    with pytest.raises(SGraphError, match="unknown sGraph schema"):
        SGraph.from_json(d)
    _, ref = workloads.reference_for("rmsnorm_matmul:ci")
    with pytest.raises(SGraphError, match="do not match the program's inputs"):
        check_matches(ref, workloads.resolve("gated_mlp:ci"))
    with pytest.raises(SGraphError, match="sGraph input 'X' is"):
        check_matches(ref, workloads.resolve("rmsnorm_matmul"))


def test_tied_axes_must_share_a_size():
    d = workloads.reference_for("gqa:ci")[1].to_json()
    d["kernels"][1]["loop"]["size"] = "F"
    with pytest.raises(SGraphError, match="axis 'z' has size F here but gz in kernel k0"):
        SGraph.from_json(json.loads(json.dumps(d)))


def test_interpreter_poison_marks_unwritten_elements():
    from superopt.reference import FloatAlgebra

    buf = FloatAlgebra().poison((2, 3))
    assert np.isnan(buf).all()
    assert max_rel_err(buf, np.ones((2, 3))) == float("inf")


# -- bulk evaluation: compiled sizes, assignment tables, estimates over columns ------------------


def _random_size(rng: np.random.Generator) -> Size:
    total = Size.const(0)
    for _ in range(int(rng.integers(1, 4))):
        term = Size.const(Fraction(int(rng.integers(1, 50)), int(rng.integers(1, 7))))
        for s in ("a", "b", "c"):
            e = int(rng.integers(-2, 3))
            term = term * Size.sym(s) if e > 0 else term / Size.sym(s) if e < 0 else term
            if abs(e) == 2:
                term = term * Size.sym(s) if e > 0 else term / Size.sym(s)
        total = total + term
    return total


def test_constraints_describe_what_they_constrain():
    """A constraint's message is formatted when described (sizes print slowly, most messages are
    never read): it names the kernel, the input, the dim and the splits, or the grid."""
    _, sg = workloads.reference_for("gqa:ci")
    described = [c.describe() for c in sg.info.constraints]
    assert "kernel k0: input 'K_t' (K) dim 2 (64) must divide evenly by z and the loop f (F*gz)" in described
    assert "kernel k1: input 'NUM_t' (NUM) dim 2 (16*gz) must divide evenly by the loop z (gz)" in described
    assert "kernel k0: grid gx x gy x gz blocks" in described
    assert "kernel k1: shared memory of the block's tiles" in described


def test_a_product_of_sizes_is_their_product_pair_by_pair():
    """`product` multiplies monomials in one step (tile shapes, grid sizes): the same size as
    multiplying pair by pair, for monomials, sums, integers and the empty product."""
    from functools import reduce

    from superopt.sizes import product

    rng = np.random.default_rng(11)
    monomial = 0
    for _ in range(300):
        factors: list[Size | int] = []
        for _ in range(int(rng.integers(0, 5))):
            size = _random_size(rng)
            factors.append(int(rng.integers(1, 9)) if rng.random() < 0.2 else size)
        monomial += all(isinstance(f, int) or len(f.terms) == 1 for f in factors)
        assert product(factors) == reduce(lambda a, b: a * Size.of(b), factors, Size.const(1))
    assert monomial > 50  # the one-step path was taken, not only the pairwise one
    assert product([]) == Size.const(1)


def test_compiled_sizes_are_int_value_for_ints_and_columns():
    """The generated evaluator gives int_value's result, or its error, for each value and for
    whole columns (the first bad row named); ratios are exact numerator and denominator."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        sizes = [_random_size(rng) for _ in range(3)]
        rows = [{s: int(rng.choice([1, 2, 3, 4, 6, 8, 12])) for s in "abc"} for _ in range(6)]
        evaluate = compile_sizes(sizes)
        for size in sizes:
            num, den = compile_ratio(size)(rows[0])
            assert Fraction(num, den) == size.evaluate(rows[0])
        expected = []
        for values in rows:
            try:
                expected.append(tuple(s.int_value(values) for s in sizes))
            except SizeError as e:
                with pytest.raises(SizeError, match="is not an integer") as got:
                    evaluate(values)
                assert str(got.value).split(" = ")[0] in str(e)
                expected.append(None)
                continue
            assert evaluate(values) == expected[-1]
        columns = {s: np.array([v[s] for v in rows], dtype=np.int64) for s in "abc"}
        if all(e is not None for e in expected):
            got_columns = evaluate(columns)
            assert [tuple(int(np.broadcast_to(c, (len(rows),))[i]) for c in got_columns)
                    for i in range(len(rows))] == expected
        else:
            with pytest.raises(SizeError, match="is not an integer"):
                evaluate(columns)
    with pytest.raises(SizeError, match="no value for b"):
        compile_sizes([Size.parse("a*b")])({"a": 2})


@pytest.mark.parametrize("target", ["h100", "a100"])
def test_assignment_tables_are_the_enumeration(target):
    """Columns hold exactly the assignments the one-at-a-time walk yields, in its order, for
    every reference, for subsets of symbols, and for values too large for int64 products."""
    from superopt.targets import TARGETS

    t = TARGETS[target]
    for name in NAMES:
        for spec in (name, f"{name}:ci"):
            _, sg = workloads.reference_for(spec)
            for symbols in (None, frozenset(sorted(sg.symbols)[:2])):
                table = assignment_table(sg, t, symbols=symbols)
                assert [table.row(i) for i in range(table.rows)] == list(enumerate_assignments(sg, t, symbols=symbols))
                assert table.rows > 0, spec
    _, sg = workloads.reference_for("gqa")
    huge = {s: [1, 2, 4, 8, 2**40, 2**61] for s in sg.symbols}
    table = assignment_table(sg, t, huge)
    assert table.rows > 0
    assert [table.row(i) for i in range(table.rows)] == list(enumerate_assignments(sg, t, huge))


def test_constraint_tests_on_columns_stay_exact_past_int64(h100):
    from superopt.assignments import _compile
    from superopt.sgraph import Constraint

    blocks = _compile(Constraint("blocks", Size.parse("a*b"), "k1", "grid"), h100)
    columns = {"a": np.array([2**40, 2, 2**31], np.int64), "b": np.array([2**40, 2, 1], np.int64)}
    assert list(blocks(columns)) == [False, True, False]  # 2**80 wraps to 0 in int64
    divides = _compile(Constraint("divides", Size.parse("6144/a"), "k1", "tile"), h100)
    assert list(divides(columns)) == [False, True, False]


@pytest.mark.parametrize("spec", ["gqa:ci", "rmsnorm_mlp:ci", "lora:ci", "ntrans:ci", "rmsnorm_matmul"])
def test_estimates_over_columns_equal_one_assignment_at_a_time(spec, h100):
    """The cost model run on all assignments at once gives, row by row, what it gives for each
    instantiation alone (the search ranks with the first, the report shows the second)."""
    from superopt.costmodel import _costs, estimate
    from superopt.instantiate import Instance

    _, sg = workloads.reference_for(spec)
    table = assignment_table(sg, h100)
    bulk = Instance(sg, table.columns, h100)
    per_kernel = [_costs(bulk, k) for k in sg.kernels]
    rows = range(0, table.rows, max(1, table.rows // 200))
    for i in rows:
        alone = estimate(instantiate(sg, table.row(i), h100)).kernels
        assert [c.at(i) for c in per_kernel] == alone
    assert len({c.at(i).time_s for c in per_kernel for i in rows}) > len(sg.kernels)  # the rows differ


# -- the interpreter runs every block at once ---------------------------------------------------


def _block_by_block(inst, inputs, alg) -> list:
    """DESIGN.md §4 read literally: one block and one iteration at a time (what the interpreter
    computes for all blocks at once)."""
    sg = inst.sgraph
    tensors = dict(inputs)
    for k in sg.kernels:
        if isinstance(k, LibraryKernel):
            out = apply(alg, k.op, [tensors[i] for i in k.inputs], k.attrs, [inst.shape(i) for i in k.inputs])
            tensors[k.output] = alg.round(out, dtype(sg.info.dtypes[k.output]))
            continue
        b, grid, loop = k.block, inst.grid(k), inst.loop(k)
        storage = sg.info.blocks[k.id].storage

        def compute(op, vals, k=k, storage=storage):
            out = apply(alg, op.op, [vals[i] for i in op.inputs], op.attrs, [inst.tile(k.id, i) for i in op.inputs])
            return alg.round(out, None if storage[op.id] is None else dtype(storage[op.id]))

        outs = {o.tensor: alg.poison(inst.shape(o.tensor)) for o in b.outputs}
        for block in itertools.product(*(range(g) for g in grid)):
            partial: dict = {}
            for it in range(loop):
                vals = {}
                for inp in b.inputs:
                    index = []
                    for d, n in enumerate(inst.shape(inp.tensor)):
                        start = 0
                        for g, m, at in zip(grid, inp.imap, block, strict=True):
                            if m == d:
                                n //= g
                                start += at * n
                        if inp.fmap == d:
                            n //= loop
                            start += it * n
                        index.append(slice(start, start + n))
                    vals[inp.id] = alg.take(tensors[inp.tensor], tuple(index))
                for op in b.body:
                    vals[op.id] = compute(op, vals)
                for acc in b.accumulators:
                    v = vals[acc.source]
                    if acc.kind == "concat":
                        partial.setdefault(acc.id, []).append(v)
                    else:
                        partial[acc.id] = v if it == 0 else alg.add(partial[acc.id], v)
            vals = {}
            for acc in b.accumulators:
                if acc.kind == "concat":
                    vals[acc.id] = alg.concat(partial[acc.id], acc.dim)
                elif acc.kind == "mean":
                    vals[acc.id] = alg.div(partial[acc.id], alg.const(float(loop)))
                else:
                    vals[acc.id] = partial[acc.id]
            for op in b.post:
                vals[op.id] = compute(op, vals)
            for o in b.outputs:
                t = inst.tile(k.id, o.source)
                index = [slice(0, n) for n in t]
                for d, at in zip(o.omap, block, strict=True):
                    index[d] = slice(at * t[d], (at + 1) * t[d])
                alg.put(outs[o.tensor], tuple(index), vals[o.source])
        tensors.update(outs)
    return [tensors[o] for o in sg.outputs]


def _scaled() -> tuple[Program, SGraph]:
    """X * s with a vector s along X's columns, split by a grid axis: in the block graph a tile
    of rank 1 that varies along the grid meets a tile of rank 2."""
    p = Program("scaled")
    x, s = p.input("X", (8, 8), "f32"), p.input("s", (8,), "f32")
    p.output(p.op("mul", x, s, name="O"))
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 2), ("y", 4)])
    k.output(k.acc(k.op("mul", k.input("X", (0, 1), None), k.input("s", (None, 0), None))), "O", (0, 1))
    return p, b.build(["O"])


def _compare_with_block_by_block(program: Program, sg: SGraph, values: dict[str, int], h100, seed: int) -> None:
    inst = instantiate(sg, values, h100)
    rng = np.random.default_rng(seed)
    alg = FieldAlgebra(rng)
    inputs = random_field_inputs(program, rng)
    for got, want in zip(run(inst, inputs, alg), _block_by_block(inst, inputs, alg), strict=True):
        assert np.array_equal(got.p, want.p) and (got.q is None) == (want.q is None), sg.dumps()
        assert got.q is None or np.array_equal(got.q, want.q)


def test_the_interpreter_runs_hand_written_blocks_at_once_as_block_by_block(h100):
    """The same on the hand-written right and wrong tilings, and on tiles of two ranks in one op."""
    program, scaled = _scaled()
    check_matches(scaled, program)
    _compare_with_block_by_block(program, scaled, {}, h100, 0)
    assert error_of(program, scaled, {}, h100, seed=0) < 1e-6
    for n, sg in enumerate([_matmul_sgraph(), _mul_sgraph(), *(wrong() for wrong in WRONG.values())]):
        _compare_with_block_by_block(_program_of(sg.inputs[1].id), sg, {}, h100, n)


@pytest.mark.parametrize("name", NAMES)
def test_the_interpreter_runs_all_blocks_at_once_as_block_by_block(name, h100):
    """The interpreter runs every block of a kernel at once (grid dims first); in the finite field
    (exact) it gives what one block and one iteration at a time gives, element for element, on
    every reference (two sizes) and on its generated mutants (wrong maps, dims, ops)."""
    program, ref = workloads.reference_for(f"{name}:ci")
    compared = 0
    for sg, sizes in [(ref, 2), *((m, 1) for _, m in mutants(ref, program)[:5])]:
        assigns = list(enumerate_assignments(sg, h100))
        for values in spread(assigns, 2)[:1] if sizes == 1 else spread(assigns, sizes):
            _compare_with_block_by_block(program, sg, values, h100, compared)
            compared += 1
    assert compared >= 5
