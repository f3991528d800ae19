"""`verify(program, sgraph) -> Verdict`: every layer, fastest and cheapest rejection first.

1. shapes: the sGraph reads the program's inputs and writes outputs of its shapes;
2. finite fields at one instantiation (a few ms; refutes almost every wrong sGraph);
3. the e-graph proof, symbolic: one proof for every instantiation;
4. finite fields at the remaining instantiations;
5. float: the interpreter in the program's dtype against the float64 reference.
Layers 2, 4 and 5 run on the program shrunk to small shapes (same structure) at instantiations
that split every dim they can (at the real shapes when constant grid sizes fit only those), and
optionally also at the real shapes with given parameters (the kernel that will be returned;
`verify_at` adds those checks to a verdict already made, without a second proof).
A verdict is `proved` only when layers 3, 4 and 5 all pass.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

from superopt.assignments import pick_for_checks
from superopt.instantiate import Instance, instantiate
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
    at the program's real shapes with these symbol values (`verify_at`)."""
    target = target or TARGETS["h100"]
    check_matches(sgraph, program)
    v = Verdict(float_tolerance=0.0)
    small = shrink(program)
    small_sg = shrink_sgraph(sgraph, program, small)
    picks = [] if small_sg is None else pick_for_checks(small_sg, target, instantiations)
    if small_sg is None or not picks:
        # Constant grid sizes (a concrete schedule) may fit only the real shapes: check there.
        small, small_sg = program, sgraph
        picks = pick_for_checks(sgraph, target, instantiations)
    if not picks:
        _layer(v, "instantiate", False, 0.0, "no valid instantiation at the check shapes")
        return v
    checks = [(small, instantiate(small_sg, values, target)) for values in picks]
    if not _finite_field(v, *checks[0], ff_trials, seed):
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
    if not all(_finite_field(v, *checks[i], ff_trials, seed + i) for i in range(1, len(checks))):
        return v
    v.finite_field_passed = True
    if not all(_float(v, *check, seed + FLOAT_SEED + i) for i, check in enumerate(checks)):
        return v
    return v if params is None else verify_at(program, sgraph, params, v, target=target, ff_trials=ff_trials,
                                              seed=seed)


def verify_at(
    program: Program, sgraph: SGraph, params: Mapping[str, int], verdict: Verdict, *, target: Target | None = None,
    ff_trials: int = 2, seed: int = 0,
) -> Verdict:
    """`verdict` (what `verify` found for `sgraph`) with the finite-field and float checks at the
    program's real shapes and these parameters added: the kernel that will be returned. The proof
    and the small-shape checks are not made again. A copy; a refuted verdict comes back as it is."""
    v = copy.deepcopy(verdict)
    if not v.proved:
        return v
    check = (program, instantiate(sgraph, dict(params), target or TARGETS["h100"]))
    i = v.float_instantiations  # after the small-shape checks: their seeds are not reused
    v.finite_field_passed = _finite_field(v, *check, ff_trials, seed + i)
    if v.finite_field_passed:
        _float(v, *check, seed + FLOAT_SEED + i)
    return v


def _finite_field(v: Verdict, program: Program, inst: Instance, trials: int, seed: int) -> bool:
    t0 = time.perf_counter()
    res = finite_field.check(program, inst, trials=trials, seed=seed)
    first = not any(layer["layer"] == "finite_field" for layer in v.layers)
    v.finite_field_trials += res.trials
    v.finite_field_error_bound = max(0.0 if first else v.finite_field_error_bound, res.error_bound)
    detail = {"params": dict(inst.values), "shapes": _shapes(program), "mismatch": res.mismatch}
    _layer(v, "finite_field", res.passed, time.perf_counter() - t0, detail)
    return res.passed


def _float(v: Verdict, program: Program, inst: Instance, seed: int) -> bool:
    t0 = time.perf_counter()
    res = float_check.check(program, inst, seed=seed)
    v.float_tolerance = res.tolerance
    v.float_instantiations += 1
    v.float_max_rel_err = max(0.0 if v.float_instantiations == 1 else v.float_max_rel_err, res.max_rel_err)
    detail = {"params": dict(inst.values), "max_rel_err": res.max_rel_err}
    _layer(v, "float", res.passed, time.perf_counter() - t0, detail)
    return res.passed


def _shapes(program: Program) -> dict[str, list[int]]:
    return {n.id: list(n.shape) for n in program.inputs}


def _layer(v: Verdict, name: str, passed: bool, seconds: float, detail: Any) -> None:
    v.layers.append({"layer": name, "passed": passed, "ms": round(seconds * 1e3, 2), "detail": detail})
