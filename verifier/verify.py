"""`verify(program, sgraph) -> Verdict`: every layer, fastest and cheapest rejection first.

1. shapes: the sGraph reads the program's inputs and writes outputs of its shapes;
2. finite fields at one instantiation (a few ms; refutes almost every wrong sGraph);
3. the e-graph proof, symbolic: one proof for every instantiation;
4. finite fields at the remaining instantiations;
5. float: the interpreter in the program's dtype against the float64 reference.
Layers 2, 4 and 5 run on the program shrunk to small shapes (same structure) at instantiations
that split every dim they can (at the real shapes when constant grid sizes fit only those), and
optionally also at the real shapes with given parameters (the kernel that will be returned).
A verdict is `proved` only when layers 3, 4 and 5 all pass.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from superopt.assignments import pick_for_checks
from superopt.instantiate import instantiate
from superopt.program import Program
from superopt.result import Verdict
from superopt.sgraph import SGraph, check_matches
from superopt.shrink import shrink, shrink_sgraph
from superopt.targets import TARGETS, Target
from superopt.verifier import finite_field, float_check
from superopt.verifier.egraph import Limits, prove
from superopt.verifier.lowering import lower_program, lower_sgraph

FLOAT_SEED = 100  # the float checks' inputs: seeds FLOAT_SEED, FLOAT_SEED + 1, ... (small shapes first)


def verify(
    program: Program,
    sgraph: SGraph,
    *,
    target: Target | None = None,
    instantiations: int = 3,
    ff_trials: int = 2,
    params: Mapping[str, int] | None = None,
    limits: Limits | None = None,
    seed: int = 0,
) -> Verdict:
    """Run the layers in order; stop at the first that refutes. `params`: also check the sGraph
    at the program's real shapes with these symbol values."""
    target = target or TARGETS["h100"]
    check_matches(sgraph, program)
    v = Verdict(float_tolerance=0.0)
    small = shrink(program)
    small_sg = shrink_sgraph(sgraph, small)
    picks = pick_for_checks(small_sg, target, instantiations)
    if not picks:
        # Constant grid sizes (a concrete schedule) may fit only the real shapes: check there.
        small, small_sg = program, sgraph
        picks = pick_for_checks(sgraph, target, instantiations)
    if not picks:
        _layer(v, "instantiate", False, 0.0, "no valid instantiation at the check shapes")
        return v
    checks = [(small, instantiate(small_sg, values, target)) for values in picks]
    if params is not None:
        checks.append((program, instantiate(sgraph, dict(params), target)))

    def ff(i: int) -> bool:
        t0 = time.perf_counter()
        prog, inst = checks[i]
        res = finite_field.check(prog, inst, trials=ff_trials, seed=seed + i)
        v.finite_field_trials += res.trials
        v.finite_field_error_bound = max(v.finite_field_error_bound if i else 0.0, res.error_bound)
        detail = {"params": dict(inst.values), "shapes": _shapes(prog), "mismatch": res.mismatch}
        _layer(v, "finite_field", res.passed, time.perf_counter() - t0, detail)
        return res.passed

    if not ff(0):
        v.egraph_reason = "not run: refuted by finite fields"
        return v
    t0 = time.perf_counter()
    lhs = lower_program(program)
    rhs, axes = lower_sgraph(sgraph)
    proof = prove(list(zip(lhs, rhs, strict=True)), axes, limits)
    v.egraph = "proved" if proof.proved else "not proved"
    v.egraph_reason = proof.reason
    v.egraph_stats = proof.certificate()
    _layer(v, "egraph", proof.proved, time.perf_counter() - t0, proof.certificate())
    if not proof.proved:
        return v
    for i in range(1, len(checks)):
        if not ff(i):
            return v
    v.finite_field_passed = True
    worst = 0.0
    for i, (prog, inst) in enumerate(checks):
        t0 = time.perf_counter()
        res = float_check.check(prog, inst, seed=seed + FLOAT_SEED + i)
        v.float_tolerance = res.tolerance
        v.float_instantiations += 1
        worst = max(worst, res.max_rel_err)
        v.float_max_rel_err = worst
        detail = {"params": dict(inst.values), "max_rel_err": res.max_rel_err}
        _layer(v, "float", res.passed, time.perf_counter() - t0, detail)
        if not res.passed:
            return v
    return v


def _shapes(program: Program) -> dict[str, list[int]]:
    return {n.id: list(n.shape) for n in program.inputs}


def _layer(v: Verdict, name: str, passed: bool, seconds: float, detail: Any) -> None:
    v.layers.append({"layer": name, "passed": passed, "ms": round(seconds * 1e3, 2), "detail": detail})
