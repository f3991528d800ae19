"""The numeric layers check what the e-graph's claim covers: shrunk shapes keep distinct dim
classes apart, max is evaluated as a maximum, check instantiations leave 1 and 2, and a verdict
names the shapes it checked (the real ones among them where they fit)."""

from __future__ import annotations

import itertools

import pytest
from kernel_shapes import attention_block
from proof_corpus import WRONG, base_case, row_reduction

from superopt import Program, workloads
from superopt.assignments import pick_for_checks
from superopt.build import SGraphBuilder
from superopt.core.result import Verdict
from superopt.dimclasses import NO_CLASS, dim_classes
from superopt.instantiate import instantiate
from superopt.sgraph import SGraph
from superopt.shrink import constant_splits, shrink, shrink_sgraph
from superopt.targets import TARGETS
from superopt.verifier import finite_field, float_check
from superopt.verifier import verify as verify_module
from superopt.verifier.egraph import ProofResult
from superopt.verifier.verify import check_points, real_shape_check, verify

H100 = TARGETS["h100"]
TILE_MAXIMA = WRONG["9 sum of per-tile maxima for the row max"]  # right only at F = 1


def _right_row_sums(p: Program) -> SGraph:
    """The base case's program scheduled right: one kernel over row blocks, sum(X + 1) + sum(Y + 1)."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")])
    one = k.op("const", value=1.0)
    row_sum = lambda t: k.op("sum", k.op("add", k.input(t, [0], None), one), dim=-1, keepdim=True)
    k.output(k.acc(k.op("add", row_sum("X"), row_sum("Y"))), "O", [0])
    return b.build(["O"])


def _max_of_tile_maxima(p: Program) -> SGraph:
    """Right at every split: kernel 1 writes each column tile's row maxima, kernel 2 takes their
    maximum (a symmetric function summed over the elements gives the row's sum of f, not this)."""
    b = SGraphBuilder.for_program(p)
    k1 = b.graph(grid=[("x", "gx"), ("z", "gz")])
    k1.output(k1.acc(k1.op("max", k1.input("X", [0, 1], None), dim=1, keepdim=True)), "T", [0, 1])
    k2 = b.graph(grid=[("u", "hu")])
    k2.output(k2.acc(k2.op("max", k2.input("T", [0], None), dim=1, keepdim=True)), "O", [0])
    return b.build(["O"])


def _proved(*_: object, **__: object) -> ProofResult:
    """Stands in for the e-graph, so the numeric layers are what decides."""
    return ProofResult(True, "proved", 0, 0, 0.0)


def _assert_classes_apart(p: Program) -> dict[str, tuple[int, ...]]:
    """Every two dim classes of different real sizes have different small sizes, each dividing
    its real one; returns the small input shapes."""
    small = shrink(p)
    assert small is not p
    classes = dim_classes(p)
    sizes = {c: (p.nodes[nid].shape[d], small.nodes[nid].shape[d]) for (nid, d), c in classes.items() if c != NO_CLASS}
    for real, smaller in sizes.values():
        assert real % smaller == 0 and smaller > 1
    for (c1, (r1, s1)), (c2, (r2, s2)) in itertools.combinations(sizes.items(), 2):
        assert r1 == r2 or s1 != s2, (c1, c2, r1, r2, s1)
    return {n.id: n.shape for n in small.inputs}


# -- shrinking keeps dim classes apart ------------------------------------------------------------


@pytest.mark.parametrize(("x_cols", "y_cols"), [(64, 32), (80, 40)])
def test_classes_of_different_sizes_shrink_to_different_sizes(x_cols, y_cols):
    """64 and 32 both became 32 (the largest divisor up to the cap), 80 and 40 both 20."""
    shapes = _assert_classes_apart(base_case(x_cols, y_cols).program())
    assert shapes["X"][1] != shapes["Y"][1]


def test_reshape_parts_and_what_they_make_shrink_apart():
    """Reshape parts shrink to at most PART_CAP: parts of 32 and 16 both became 16; an attention
    block's rows (32) and its width (64 = 2 heads of 32) both 32. Parts of one size (80 and 80)
    shrink apart where their divisors allow."""
    for parts in ((32, 16), (80, 40)):
        p = Program("parts")
        p.output(p.exp(p.reshape(p.input("X", (4, parts[0] * parts[1]), "f32"), (4, *parts))))
        _assert_classes_apart(p)
        assert len(set(shrink(p).nodes["reshape_1"].shape)) == 3
    _assert_classes_apart(attention_block(32, 64, 2))
    _assert_classes_apart(attention_block(512, 2048, 16))
    q = Program("equal_parts")
    q.output(q.exp(q.reshape(q.input("X", (4, 6400), "f32"), (4, 80, 80))))
    heads = shrink(q).nodes["reshape_1"].shape
    assert heads[1] != heads[2] and 80 % heads[1] == 0 and 80 % heads[2] == 0


def test_classes_of_one_size_shrink_apart_where_their_divisors_allow():
    """gated_mlp's contraction and output widths are both 4096: checked at 16 and 32, a schedule
    that takes one for the other is seen; sizes with no room (8 and 8) stay equal."""
    p = workloads.resolve("gated_mlp")
    shapes = _assert_classes_apart(p)
    assert shapes["X"][1] != shapes["W1"][1]
    q = Program("small")
    q.output(q.op("matmul", q.input("A", (8, 8), "f32"), q.input("B", (8, 8), "f32"), name="O"))
    assert shrink(q) is q


def test_a_concrete_schedule_is_checked_at_sizes_its_constant_splits_divide():
    """A loop of constant range 32 over X's and Y's columns (widths 128 and 64): both widths shrink
    to multiples of 32, still apart, and the checks run small (without the multiples, Y's 16 fits
    no range of 32, and they ran at the real shapes)."""
    p = base_case(128, 64).program()
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", 4)], loop=("f", 32))
    row_sum = lambda t: k.op("sum", k.op("add", t, k.op("const", value=1.0)), dim=-1, keepdim=True)
    k.output(k.acc(k.op("add", row_sum(k.input("X", [0], 1)), row_sum(k.input("Y", [0], 1)))), "O", [0])
    sg = b.build(["O"])
    assert constant_splits(sg) == {("X", 0): 4, ("X", 1): 32, ("Y", 0): 4, ("Y", 1): 32}
    unsplit = shrink_sgraph(sg, p, shrink(p))
    assert unsplit is not None and pick_for_checks(unsplit, H100) == []
    small, inst = check_points(p, sg, H100, 1)[0]
    widths = small.nodes["X"].shape[1], small.nodes["Y"].shape[1]
    assert small is not p and widths[0] != widths[1] and all(w % 32 == 0 for w in widths), widths
    assert finite_field.check(small, inst).passed


# -- the widths that shrinking made equal -----------------------------------------------------------


def test_a_schedule_right_only_at_equal_widths_is_refuted_where_verify_checks(monkeypatch):
    """The regression `superopt verify` proved: X (4, 64) and Y (4, 32) were checked at widths
    32 and 32, where sum(X + 1) + sum(Y + 1) = sum(X) + sum(Y + 2) holds. Every point where
    verify runs the numeric layers now refutes it, the real shapes too, and verify refuses it
    even with the e-graph's word for it."""
    p, wrong = base_case(64, 32).build()
    equal, at_equal = base_case(32, 32).build()
    at_equal = instantiate(at_equal, {"gx": 2}, H100)
    assert finite_field.check(equal, at_equal).passed and float_check.check(equal, at_equal).passed
    points = check_points(p, wrong, H100, 3)
    assert len(points) == 3
    for small, inst in points:
        assert small.nodes["X"].shape[1] != small.nodes["Y"].shape[1]
        assert not finite_field.check(small, inst).passed
        assert not float_check.check(small, inst).passed
    real = real_shape_check(p, wrong, H100)
    assert real is not None and real[0] is p and not finite_field.check(*real).passed
    monkeypatch.setattr(verify_module, "prove", _proved)
    v = verify(p, wrong, target=H100)
    assert not v.proved and v.layers[-1]["layer"] == "finite_field" and not v.layers[-1]["passed"]


def test_a_verdict_lists_every_shape_it_checked(monkeypatch):
    """The right schedule: finite fields and float at the shrunk shapes, then finite fields at
    the real ones; each layer's detail names its shapes and the verdict's JSON lists them."""
    monkeypatch.setattr(verify_module, "prove", _proved)
    p = base_case(64, 32).program()
    v = verify(p, _right_row_sums(p), target=H100)
    assert v.proved, v.layers
    numeric = [x for x in v.layers if x["layer"] in ("finite_field", "float")]
    assert all("shapes" in x["detail"] for x in numeric)
    real = {"X": [4, 64], "Y": [4, 32]}
    assert numeric[-1]["layer"] == "finite_field" and numeric[-1]["detail"]["shapes"] == real
    report = v.to_json()
    assert report["shapes_checked"] == [{"X": [4, 32], "Y": [4, 16]}, real]
    assert Verdict.from_json(report).shapes_checked == report["shapes_checked"]


def test_programs_over_the_bound_are_not_checked_at_their_real_shapes(monkeypatch):
    monkeypatch.setattr(verify_module, "REAL_SHAPE_ELEMENTS", 64)
    p, wrong = base_case(64, 32).build()
    assert real_shape_check(p, wrong, H100) is None


# -- max -----------------------------------------------------------------------------------------------


def test_summed_tile_maxima_are_not_the_row_maximum(monkeypatch):
    """A max was a symmetric function summed over the elements in finite fields, so a sum of
    per-tile maxima passed for the row's at every shape. Both numeric layers refuse it at every
    point verify checks, and the verdict says how max was evaluated."""
    p, wrong = TILE_MAXIMA.build()
    points = check_points(p, wrong, H100, 3)
    assert points and all(inst.values["F"] > 1 for _, inst in points)
    for small, inst in points:
        assert not float_check.check(small, inst).passed
        res = finite_field.check(small, inst)
        assert not res.passed and res.max_model == finite_field.MAX_MODEL
    monkeypatch.setattr(verify_module, "prove", _proved)
    v = verify(p, wrong, target=H100)
    assert not v.proved and v.max_treatment == finite_field.MAX_MODEL
    assert v.to_json()["max_treatment"] == finite_field.MAX_MODEL
    assert Verdict.from_json(v.to_json()).max_treatment == finite_field.MAX_MODEL


def test_maxima_of_tile_maxima_are_the_row_maximum():
    """The right split: finite fields pass it at every point (summed as sums, the maxima of
    maxima did not); a program without max says nothing of it."""
    p = TILE_MAXIMA.program()
    for small, inst in check_points(p, _max_of_tile_maxima(p), H100, 3):
        assert finite_field.check(small, inst).passed
        assert float_check.check(small, inst).passed
    plain = base_case(64, 32).program()
    small, inst = check_points(plain, _right_row_sums(plain), H100, 1)[0]
    assert finite_field.check(small, inst).max_model == ""


# -- check instantiations ------------------------------------------------------------------------------


def _doubled_loop_mean(p: Program) -> SGraph:
    """The mean of the loop's tile sums, times 2: the row sum only at F = 2."""
    b = SGraphBuilder.for_program(p)
    k = b.graph(grid=[("x", "gx")], loop=("f", "F"))
    mean = k.acc(k.op("sum", k.input("X", [0], 1), dim=1, keepdim=True), "mean")
    k.output(k.after("mul", mean, k.after("const", value=2.0)), "O", [0])
    return b.build(["O"])


def test_check_instantiations_leave_one_and_two(monkeypatch):
    """The first assignment checked has every symbol above 2 where the sizes allow: the
    cheapest checks took F = 2, where doubling a loop mean gives the sum."""
    p = row_reduction("sum")
    wrong = _doubled_loop_mean(p)
    small = shrink(p)
    small_sg = shrink_sgraph(wrong, p, small)
    assert small_sg is not None
    first = pick_for_checks(small_sg, H100, 3)[0]
    assert all(v > 2 for v in first.values()), first
    assert not finite_field.check(small, instantiate(small_sg, first, H100)).passed
    assert finite_field.check(small, instantiate(small_sg, {"gx": 2, "F": 2}, H100)).passed
    monkeypatch.setattr(verify_module, "prove", _proved)
    assert not verify(p, wrong, target=H100).proved
    # a symbol bounded by 2 keeps its values; the others still leave 1 and 2
    narrow = Program("narrow")
    narrow.output(narrow.op("sum", narrow.input("X", (2, 64), "f32"), name="O", dim=-1, keepdim=True))
    sg = shrink_sgraph(_doubled_loop_mean(narrow), narrow, shrink(narrow))
    assert sg is not None
    first = pick_for_checks(sg, H100, 3)[0]
    assert first["gx"] <= 2 < first["F"]
