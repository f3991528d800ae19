"""The float layer: the interpreter in the program's dtype against the float64 reference.

No guarantee in either direction (a tolerance can pass a tiny error and fail an equivalent but
less stable rewrite), so it is the last, numerical sanity check, never the equivalence oracle.
Inputs are fresh random values (never zeros) from fixed seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from superopt.dtypes import dtype
from superopt.instantiate import Instance
from superopt.interpreter import run_float
from superopt.program import Program
from superopt.reference import evaluate, inputs_and_reference, max_rel_err


@dataclass
class FloatCheck:
    max_rel_err: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_rel_err <= self.tolerance


def check(program: Program, inst: Instance, seed: int = 0) -> FloatCheck:
    inputs, refs = inputs_and_reference(program, seed)
    outs = run_float(inst, inputs)
    err = max(max_rel_err(o, r) for o, r in zip(outs, refs, strict=True))
    return FloatCheck(err, _tolerance(program, inputs, refs))


def _tolerance(program: Program, inputs: dict[str, np.ndarray], refs: list[np.ndarray]) -> float:
    """The dtype's tolerance, or twice the program's own error run op by op in its dtype (what a
    framework computes) where that is larger: a schedule need not be more exact than the program
    it replaces, whose touchy programs (exp of a bf16 row sum) miss the dtype's bound."""
    own = max(max_rel_err(o, r) for o, r in zip(evaluate(program, inputs, exact=False), refs, strict=True))
    base = dtype(program.dtype).tolerance
    return max(base, 2 * own) if math.isfinite(own) else base
