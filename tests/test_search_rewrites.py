"""Equal forms of the program proposed as starting points of the search (`program_forms`): a
scale of a product moved into its smaller operand, proved against the program itself."""

from __future__ import annotations

import numpy as np
import pytest

from superopt import Program, workloads
from superopt.config import SearchConfig
from superopt.instantiate import instantiate
from superopt.interpreter import run_float
from superopt.reference import evaluate, max_rel_err, random_inputs
from superopt.search import block
from superopt.search.block import _scales_into_smaller_operand, program_forms
from superopt.search.driver import run_search
from superopt.search.kernel import KernelSearch
from superopt.search.space import space_of
from superopt.search.views import ProgramViews
from superopt.sgraph import SGraph
from superopt.targets import Target
from superopt.verifier.oracle import Oracle
from superopt.verifier.verify import verify

pytestmark = pytest.mark.usefixtures("private_cache")


def _scaled(scale: str, m: int = 16, k: int = 512, n: int = 512, dtype: str = "f16") -> Program:
    """(X @ W) scaled by a constant, a row scale r (m, 1) or a column scale s (1, n)."""
    p = Program(f"{scale}_scaled")
    x, w = p.input("X", (m, k), dtype), p.input("W", (k, n), dtype)
    if scale == "const":
        p.output(p.op("mul", x @ w, 0.125))
    elif scale == "row":
        p.output(p.op("mul", p.input("r", (m, 1), dtype), x @ w))
    else:
        p.output(p.op("mul", x @ w, p.input("s", (1, n), dtype)))
    return p


def _numpy(p: Program, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The program's value in float64, written out independently of the interpreter."""
    x, w = inputs["X"].astype(np.float64), inputs["W"].astype(np.float64)
    scale = 0.125 if "r" not in inputs and "s" not in inputs else inputs.get("r", inputs.get("s")).astype(np.float64)
    return (x @ w) * scale


def _matches_numpy(p: Program, sg: SGraph, params: dict[str, int], target: Target) -> None:
    rng = np.random.default_rng(11)
    inputs = {n.id: rng.standard_normal(n.shape).astype(np.float16) for n in p.inputs}
    [out] = run_float(instantiate(sg, params, target), inputs)
    assert max_rel_err(np.asarray(out, dtype=np.float64), _numpy(p, inputs)) < 1e-2


@pytest.mark.parametrize("scale", ["const", "row"])
def test_a_scale_moved_into_the_smaller_operand_is_a_proved_starting_point(scale, h100, monkeypatch):
    """(X @ W) * 0.125 and r * (X @ W), X (16, 512) against W (512, 512): the program shard
    also builds the scale on X's tiles inside the loop (`_scales_into_smaller_operand`); those
    candidates are proved against the program as written and compute it. The search's winner is
    proved, matches numpy, and is no slower than without the rewrite. The row scale in f32: in f16,
    X * r may overflow where r * (X @ W) does not, and no block matmul reads it
    (`test_no_block_matmul_reads_in_f16_a_computed_value_the_program_never_holds`); X * 0.125
    only shrinks X."""
    p = _scaled(scale, dtype="f16" if scale == "const" else "f32")
    [form] = program_forms(p)
    assert [n.op for n in form.topological() if n.op not in ("input", "const")] == ["mul", "matmul"]
    ks = KernelSearch(p, space_of(p), Oracle(p, forms=[form]), SearchConfig(), target=h100)
    moved = [sg for sg in ks.candidates_in(1, ks.first_choices(1)[0])
             if [o.op for k in sg.graph_kernels for o in k.block.body if o.op != "const"] == ["mul", "matmul"]]
    assert moved
    from superopt.search.instantiation import rank

    for sg in moved:
        assert verify(p, sg, target=h100).proved
        [best] = rank(sg, h100, keep=1)
        _matches_numpy(p, sg, best.params, h100)

    found = run_search(p, h100, SearchConfig())
    assert found.best.verdict.proved
    _matches_numpy(p, found.best.sgraph, found.best.best.params, h100)
    monkeypatch.setattr(block, "_scales_into_smaller_operand", lambda program: None)
    assert program_forms(p) == []
    without = run_search(p, h100, SearchConfig())
    assert found.best.best.estimate.time_s <= without.best.best.estimate.time_s


def test_a_scale_moves_only_where_the_algebra_is_exact():
    """A column scale s (1, N) is constant along X's rows only, not along its columns: it never
    moves into X (with K = N, (X * s) @ W has the right shape and the wrong value), only into W
    when W is the smaller; a row scale only into X, when X is the smaller. Each form computes the
    program's value (float64, fresh inputs)."""
    assert _scales_into_smaller_operand(_scaled("col", 16, 4096, 4096)) is None  # X is the smaller: not into X
    assert _scales_into_smaller_operand(_scaled("row", 4096, 64, 16)) is None  # W is the smaller
    assert _scales_into_smaller_operand(_scaled("const", 64, 64, 64)) is None  # neither is smaller
    for p, into in ((_scaled("col", 256, 64, 16), "W"), (_scaled("row", 16, 64, 256), "X"),
                    (_scaled("const", 256, 64, 16), "W")):
        form = _scales_into_smaller_operand(p)
        assert form is not None
        [scaled] = [n for n in form.topological() if n.op == "mul"]
        assert into in scaled.inputs
        inputs = random_inputs(p, 5)
        assert max_rel_err(evaluate(form, inputs)[0], evaluate(p, inputs)[0]) < 1e-12
    quotient = Program("quotient")
    x = quotient.input("X", (2, 16, 64), "f16")
    quotient.output((x @ quotient.input("W", (2, 64, 256), "f16")) / quotient.input("r", (16, 1), "f16"))
    form = _scales_into_smaller_operand(quotient)
    assert form is not None and [n.inputs[0] for n in form.topological() if n.op == "div"] == ["X"]
    inputs = random_inputs(quotient, 5)
    assert max_rel_err(evaluate(form, inputs)[0], evaluate(quotient, inputs)[0]) < 1e-12
    returned = Program("returned_product")
    y = returned.input("X", (16, 64), "f16") @ returned.input("W", (64, 256), "f16")
    returned.output(y * 0.5, y)
    assert _scales_into_smaller_operand(returned) is None  # the product is returned: it stays


def test_a_wrong_form_is_refused_by_the_proof(h100, monkeypatch):
    """The proof is against the program, never the form: a wrong form, (X * 0.125) @ (W * 0.125)
    for (X @ W) * 0.125, makes the oracle take its value for the output; the search builds it,
    the proof refuses it, and the winner is proved and correct. (A column scale moved into X is
    wrong too, but the oracle already skips such a form: its dim classes are not the program's.)"""
    p = _scaled("const", 16, 64, 64)

    def wrong(program: Program) -> Program:
        q = Program(program.name)
        x, w = (q.input(n.id, n.shape, "f16") for n in program.inputs)
        q.output(q.op("mul", x, 0.125) @ q.op("mul", w, 0.125))
        return q

    assert run_search(p, h100, SearchConfig()).stats.rejected == 0
    monkeypatch.setattr(block, "_scales_into_smaller_operand", wrong)
    found = run_search(p, h100, SearchConfig())
    assert found.stats.rejected > 0 and found.best.verdict.proved
    _matches_numpy(p, found.best.sgraph, found.best.best.params, h100)


def test_built_in_workloads_have_no_scaled_products():
    """No scale follows a product in the built-in workloads: their forms, oracle and program
    block graphs are what they were."""
    for name in workloads.WORKLOADS:
        p = workloads.resolve(name)
        assert program_forms(p) == [] and program_forms(ProgramViews(p).program) == []
