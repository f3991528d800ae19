"""`verify(program, sgraph) -> Verdict`: every layer, fastest and cheapest rejection first.

1. shapes: the sGraph reads the program's inputs and writes outputs of its shapes;
2. finite fields at one instantiation (a few ms; refutes almost every wrong sGraph);
3. the e-graph proof, symbolic: one proof for every instantiation;
4. finite fields at the remaining instantiations;
5. float: the interpreter in the program's dtype against the float64 reference;
6. finite fields at the program's real shapes, when its tensors fit `REAL_SHAPE_ELEMENTS`.
Layers 2, 4 and 5 run on the program shrunk to small shapes (same structure; distinct dim
classes keep distinct sizes) at instantiations that split every dim they can (at the real shapes
when constant grid sizes fit only those), and optionally also at the real shapes with given
parameters (the kernel that will be returned; `verify_at` adds those checks to a verdict already
made, without a second proof). Every numeric layer's detail names the shapes it ran at.
A verdict is `proved` only when layers 3 to 6 all pass.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from typing import Any

from superopt.assignments import pick_for_checks
from superopt.core.result import Verdict
from superopt.instantiate import Instance, instantiate
from superopt.program import Program
from superopt.sgraph import SGraph, check_matches
from superopt.shrink import constant_splits, shrink, shrink_sgraph
from superopt.targets import TARGETS, Target
from superopt.verifier import finite_field, float_check
from superopt.verifier.egraph import Limits, prove
from superopt.verifier.lowering import lower_program, lower_sgraph

FLOAT_SEED = 100  # the float checks' inputs: seeds FLOAT_SEED, FLOAT_SEED + 1, ... (small shapes first)
REAL_SHAPE_ELEMENTS = 2**16  # `verify` checks at the real shapes a program whose tensors are all this small


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
    checks = check_points(program, sgraph, target, instantiations)
    if not checks:
        _layer(v, "instantiate", False, 0.0, "no valid instantiation at the check shapes")
        return v
    if not _finite_field(v, *checks[0], ff_trials, seed):
        v.egraph_reason = "not run: refuted by finite fields"
        return v
    t0 = time.perf_counter()
    lhs = lower_program(program)
    rhs, axes = lower_sgraph(sgraph, program)
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
    real = real_shape_check(program, sgraph, target) if checks[0][0] is not program else None
    if real is not None:
        v.finite_field_passed = _finite_field(v, *real, ff_trials, seed + len(checks))
        if not v.finite_field_passed:
            return v
    return v if params is None else verify_at(program, sgraph, params, v, target=target, ff_trials=ff_trials,
                                              seed=seed)


def check_points(program: Program, sgraph: SGraph, target: Target, k: int) -> list[tuple[Program, Instance]]:
    """Where the numeric layers run: the program shrunk (`shrink`, its dims split by constant
    sizes kept their multiples) with its sGraph at k instantiations (`pick_for_checks`), or the
    program as it is where the sGraph cannot be shrunk or instantiated small. Empty when no
    instantiation is valid."""
    small = shrink(program, multiples=constant_splits(sgraph))
    small_sg = shrink_sgraph(sgraph, program, small)
    picks = [] if small_sg is None else pick_for_checks(small_sg, target, k)
    if small_sg is None or not picks:
        small, small_sg = program, sgraph
        picks = pick_for_checks(sgraph, target, k)
    return [(small, instantiate(small_sg, values, target)) for values in picks]


def real_shape_check(program: Program, sgraph: SGraph, target: Target) -> tuple[Program, Instance] | None:
    """The program at its real shapes with the sGraph at an instantiation picked as the small
    ones are: a check there sees the sizes themselves, whatever shrinking kept. None when a tensor
    is over `REAL_SHAPE_ELEMENTS` or no instantiation is valid."""
    if max(math.prod(n.shape) for n in program.nodes.values()) > REAL_SHAPE_ELEMENTS:
        return None
    picks = pick_for_checks(sgraph, target, 1)
    return (program, instantiate(sgraph, picks[0], target)) if picks else None


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
    i = sum(layer["layer"] == "finite_field" for layer in v.layers)  # after the checks made: no seed reused
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
    v.max_treatment = v.max_treatment or res.max_model
    detail = {"params": dict(inst.values), "shapes": _shapes(program), "mismatch": res.mismatch}
    _layer(v, "finite_field", res.passed, time.perf_counter() - t0, detail)
    return res.passed


def _float(v: Verdict, program: Program, inst: Instance, seed: int) -> bool:
    t0 = time.perf_counter()
    res = float_check.check(program, inst, seed=seed)
    v.float_tolerance = res.tolerance
    v.float_instantiations += 1
    v.float_max_rel_err = max(0.0 if v.float_instantiations == 1 else v.float_max_rel_err, res.max_rel_err)
    detail = {"params": dict(inst.values), "shapes": _shapes(program), "max_rel_err": res.max_rel_err}
    _layer(v, "float", res.passed, time.perf_counter() - t0, detail)
    return res.passed


def _shapes(program: Program) -> dict[str, list[int]]:
    return {n.id: list(n.shape) for n in program.inputs}


def _layer(v: Verdict, name: str, passed: bool, seconds: float, detail: Any) -> None:
    v.layers.append({"layer": name, "passed": passed, "ms": round(seconds * 1e3, 2), "detail": detail})
